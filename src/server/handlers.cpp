// The endpoints that generate (chat completions, completions) and the tokenizer / template ones.
#include <chrono>
#include <ctime>

#include "server/agent_api.h"
#include "server/generation.h"
#include "server/log.h"
#include "server/request.h"
#include "server/server_impl.h"
#include "server/structured_output.h"
#include "util/version.h"

namespace lilac::server {

using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(100);
// After this long without a write, a heartbeat is written (an SSE comment, or a space before the
// JSON body): a write is the only way httplib lets a handler notice that the client left.
constexpr auto kHeartbeat = std::chrono::milliseconds(200);
const std::string kFingerprint = std::string("lilac-") + version() + "-" + git_commit();

// A request ready to run, plus what its responses need.
struct Job {
  ServingModel model;
  CommonParams common;
  bool chat = true;
  std::string id;
  int64_t created = 0;
  std::string echo;  // completions with echo: the prompt text, sent first
  std::unique_ptr<Generation> gen;
  std::unique_ptr<InFlight> in_flight;
  Clock::time_point last_write = Clock::now();
};

// Writes to the client; on failure (the client is gone) cancels the generation.
bool emit(Job& job, httplib::DataSink& sink, const std::string& s) {
  job.last_write = Clock::now();
  if (sink.write(s.data(), s.size())) return true;
  job.gen->cancel();
  return false;
}

// The heartbeat when nothing was written for a while; false when the client is gone.
bool heartbeat(Job& job, httplib::DataSink& sink) {
  if (Clock::now() - job.last_write < kHeartbeat) return true;
  if (emit(job, sink, job.common.stream ? ":\n\n" : " ") && sink.is_writable()) return true;
  job.gen->cancel();
  return false;
}

std::vector<int32_t> encode_prompt(const ServingModel& m, const std::string& text) {
  try {
    return m.tokenizer->encode(text, true);
  } catch (const Error& e) {
    throw ApiError(400, std::string("the prompt cannot be tokenized: ") + e.what());
  }
}

// Queues the generation (start_generation) and counts it in flight.
void launch(Server::Impl& s, Job& job, std::vector<int32_t> ids, ParseOptions parse,
            int64_t thinking_budget = -1, std::shared_ptr<TokenConstraint> constraint = nullptr) {
  job.gen = start_generation(s, job.model, job.common, std::move(ids), std::move(parse),
                             thinking_budget, std::move(constraint));
  job.in_flight = std::make_unique<InFlight>(s.in_flight);
}

json token_json(const Tokenizer& tok, int32_t id, float logprob) {
  const std::string bytes = tok.token_bytes(id);
  json b = json::array();
  for (unsigned char c : bytes) b.push_back(int(c));
  return {{"token", bytes}, {"logprob", logprob}, {"bytes", b}};
}

json chat_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const auto& lp : lps) {
    json e = token_json(tok, lp.id, lp.logprob);
    json top = json::array();
    for (const auto& [id, l] : lp.top) top.push_back(token_json(tok, id, l));
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// The legacy completions shape: tokens, token_logprobs, top_logprobs (dicts), text_offset.
json completion_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& lps,
                         size_t& offset) {
  json tokens = json::array(), lp = json::array(), top = json::array(), offs = json::array();
  for (const auto& t : lps) {
    const std::string s = tok.token_bytes(t.id);
    tokens.push_back(s);
    lp.push_back(t.logprob);
    json d = json::object();
    for (const auto& [id, l] : t.top) d[tok.token_bytes(id)] = l;
    top.push_back(d);
    offs.push_back(offset);
    offset += s.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", offs}};
}

json usage_json(const GenerationResult& r) {
  const int64_t completion = int64_t(r.tokens.size());
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", r.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

const char* finish_name(const GenerationResult& r, bool tool_calls) {
  if (r.finish == FinishReason::Length) return "length";
  return tool_calls ? "tool_calls" : "stop";
}

// The error a finished-but-failed generation reports (in-band: the status line is already sent).
std::optional<json> failure(const GenerationResult& r) {
  if (r.finish == FinishReason::Error)
    return error_body("generation failed: " + r.error, "server_error");
  if (r.finish == FinishReason::Cancelled)
    return error_body("the generation was cancelled (the server is shutting down)", "server_error",
                      "", "cancelled");
  return std::nullopt;
}

json tool_call_json(int index, const ToolCall& c, bool with_index) {
  json j = {{"id", "call_" + random_id(24)},
            {"type", "function"},
            {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
  if (with_index) j["index"] = index;
  return j;
}

bool write_sse(Job& job, httplib::DataSink& sink, const json& j) {
  return emit(job, sink, "data: " + dump(j) + "\n\n");
}

bool write_done(Job& job, httplib::DataSink& sink) {
  return emit(job, sink, "data: [DONE]\n\n");
}

// Streams one chat completion as SSE. Returns false when the client went away (cancelled).
bool stream_chat(Job& job, httplib::DataSink& sink) {
  Generation& g = *job.gen;
  const Tokenizer& tok = *job.model.tokenizer;
  auto chunk = [&](json delta, const char* finish, std::vector<TokenLogprob>* lps) {
    json choice = {{"index", 0},
                   {"delta", std::move(delta)},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
    if (finish) choice["finish_reason"] = finish;
    if (lps && job.common.logprobs && !lps->empty()) {
      choice["logprobs"] = chat_logprobs(tok, *lps);
      lps->clear();
    }
    json j = {{"id", job.id},
              {"object", "chat.completion.chunk"},
              {"created", job.created},
              {"model", job.model.model_id},
              {"system_fingerprint", kFingerprint},
              {"choices", json::array({choice})}};
    if (job.common.include_usage) j["usage"] = nullptr;
    return j;
  };
  auto send = [&](const json& j) { return write_sse(job, sink, j); };
  if (!send(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr))) return false;
  std::vector<TokenLogprob> pending;
  bool any_call = false;
  for (;;) {
    GenerationChunk c = g.next(kPoll);
    pending.insert(pending.end(), c.logprobs.begin(), c.logprobs.end());
    bool wrote = false;
    // In the order written; a call as OpenAI streams one: a head with its id, name and empty
    // arguments, then the arguments fragment by fragment (one per parameter, then the '}').
    for (const ParsedPiece& p : c.pieces) {
      json delta;
      if (p.kind == ParsedPiece::Kind::Reasoning) {
        delta = {{"reasoning_content", p.text}};
      } else if (p.kind == ParsedPiece::Kind::Content) {
        delta = {{"content", p.text}};
      } else if (p.kind == ParsedPiece::Kind::CallStart) {
        any_call = true;
        json head = tool_call_json(p.index, ToolCall{p.text, ""}, true);
        delta = {{"tool_calls", json::array({head})}};
      } else if (p.kind == ParsedPiece::Kind::CallArguments) {
        json args = {{"index", p.index}, {"function", {{"arguments", p.text}}}};
        delta = {{"tool_calls", json::array({args})}};
      } else {
        continue;  // CallEnd: nothing more to say in this API
      }
      if (!send(chunk(std::move(delta), nullptr, &pending))) return false;
      wrote = true;
    }
    if (c.finished) break;
    if (!wrote && !heartbeat(job, sink)) return false;
  }
  const GenerationResult& r = g.result();
  if (auto err = failure(r)) {
    write_sse(job, sink, *err);
  } else {
    if (!send(chunk(json::object(), finish_name(r, any_call), &pending))) return false;
    if (job.common.include_usage) {
      json u = {{"id", job.id},
                {"object", "chat.completion.chunk"},
                {"created", job.created},
                {"model", job.model.model_id},
                {"system_fingerprint", kFingerprint},
                {"choices", json::array()},
                {"usage", usage_json(r)}};
      if (!send(u)) return false;
    }
  }
  write_done(job, sink);
  sink.done();
  return true;
}

// Runs a chat completion to the end and writes the one JSON body.
bool complete_chat(Job& job, httplib::DataSink& sink) {
  Generation& g = *job.gen;
  std::string reasoning, content;
  json calls = json::array();
  std::vector<TokenLogprob> lps;
  for (;;) {
    GenerationChunk c = g.next(kPoll);
    reasoning += c.reasoning;
    content += c.content;
    lps.insert(lps.end(), c.logprobs.begin(), c.logprobs.end());
    for (const auto& [index, call] : c.tool_calls)
      calls.push_back(tool_call_json(index, call, false));
    if (c.finished) break;
    if (!heartbeat(job, sink)) return false;
  }
  const GenerationResult& r = g.result();
  json body;
  if (auto err = failure(r)) {
    body = *err;
  } else {
    json msg = {{"role", "assistant"}, {"content", content}};
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    if (!calls.empty()) {
      msg["tool_calls"] = calls;
      if (content.empty()) msg["content"] = nullptr;
    }
    json choice = {{"index", 0},
                   {"message", msg},
                   {"logprobs", nullptr},
                   {"finish_reason", finish_name(r, !calls.empty())}};
    if (job.common.logprobs) choice["logprobs"] = chat_logprobs(*job.model.tokenizer, lps);
    body = {{"id", job.id},
            {"object", "chat.completion"},
            {"created", job.created},
            {"model", job.model.model_id},
            {"system_fingerprint", kFingerprint},
            {"choices", json::array({choice})},
            {"usage", usage_json(r)}};
  }
  if (!emit(job, sink, dump(body))) return false;
  sink.done();
  return true;
}

bool stream_completion(Job& job, httplib::DataSink& sink) {
  Generation& g = *job.gen;
  size_t offset = 0;
  auto chunk = [&](const std::string& text, const char* finish, std::vector<TokenLogprob>* lps) {
    json choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (finish) choice["finish_reason"] = finish;
    if (lps && job.common.logprobs && !lps->empty()) {
      choice["logprobs"] = completion_logprobs(*job.model.tokenizer, *lps, offset);
      lps->clear();
    }
    return json{{"id", job.id},
                {"object", "text_completion"},
                {"created", job.created},
                {"model", job.model.model_id},
                {"system_fingerprint", kFingerprint},
                {"choices", json::array({choice})}};
  };
  auto send = [&](const json& j) { return write_sse(job, sink, j); };
  if (!job.echo.empty()) {
    offset = job.echo.size();
    if (!send(chunk(job.echo, nullptr, nullptr))) return false;
  }
  std::vector<TokenLogprob> pending;
  for (;;) {
    GenerationChunk c = g.next(kPoll);
    pending.insert(pending.end(), c.logprobs.begin(), c.logprobs.end());
    if (!c.content.empty()) {
      if (!send(chunk(c.content, nullptr, &pending))) return false;
    } else if (!c.finished && !heartbeat(job, sink)) {
      return false;
    }
    if (c.finished) break;
  }
  const GenerationResult& r = g.result();
  if (auto err = failure(r)) {
    write_sse(job, sink, *err);
  } else {
    if (!send(chunk("", finish_name(r, false), &pending))) return false;
    if (job.common.include_usage) {
      json u = {{"id", job.id},
                {"object", "text_completion"},
                {"created", job.created},
                {"model", job.model.model_id},
                {"choices", json::array()},
                {"usage", usage_json(r)}};
      if (!send(u)) return false;
    }
  }
  write_done(job, sink);
  sink.done();
  return true;
}

bool complete_completion(Job& job, httplib::DataSink& sink) {
  Generation& g = *job.gen;
  std::string text = job.echo;
  std::vector<TokenLogprob> lps;
  for (;;) {
    GenerationChunk c = g.next(kPoll);
    text += c.content;
    lps.insert(lps.end(), c.logprobs.begin(), c.logprobs.end());
    if (c.finished) break;
    if (!heartbeat(job, sink)) return false;
  }
  const GenerationResult& r = g.result();
  json body;
  if (auto err = failure(r)) {
    body = *err;
  } else {
    json choice = {{"index", 0},
                   {"text", text},
                   {"logprobs", nullptr},
                   {"finish_reason", finish_name(r, false)}};
    size_t offset = job.echo.size();
    if (job.common.logprobs)
      choice["logprobs"] = completion_logprobs(*job.model.tokenizer, lps, offset);
    body = {{"id", job.id},
            {"object", "text_completion"},
            {"created", job.created},
            {"model", job.model.model_id},
            {"system_fingerprint", kFingerprint},
            {"choices", json::array({choice})},
            {"usage", usage_json(r)}};
  }
  if (!emit(job, sink, dump(body))) return false;
  sink.done();
  return true;
}

void respond(httplib::Response& res, std::shared_ptr<Job> job,
             bool (*body)(Job&, httplib::DataSink&)) {
  const bool stream = job->common.stream;
  respond_chunked(res, std::move(job), stream, body);
}

ChatRequest parse_chat(const ServingModel& m, const httplib::Request& req) {
  return parse_chat_request(with_default_kwargs(parse_body(req.body), m.chat_template_kwargs),
                            m.defaults);
}

std::string render(const ServingModel& m, const ChatRequest& r) {
  try {
    return m.chat_template->render(r.messages, r.tools, r.chat);
  } catch (const Error& e) {
    throw ApiError(
        400, std::string("the messages cannot be rendered with the chat template: ") + e.what(),
        "invalid_request_error", "messages");
  }
}

}  // namespace

void handle_chat(Server::Impl& s, const httplib::Request& req, httplib::Response& res) {
  auto job = std::make_shared<Job>();
  job->model = s.serving();
  ChatRequest r = parse_chat(job->model, req);
  const std::string prompt = render(job->model, r);
  job->common = r.common;
  job->id = "chatcmpl-" + random_id(24);
  job->created = int64_t(std::time(nullptr));
  ParseOptions parse;
  parse.chat = true;
  parse.in_reasoning = prompt_opens_reasoning(prompt);
  parse.tools = r.tools;
  parse.max_tool_calls = r.parallel_tool_calls ? -1 : 1;
  parse.stream_calls = r.common.stream;
  auto constraint = chat_constraint(req.body, r, *job->model.tokenizer, parse.in_reasoning);
  launch(s, *job, encode_prompt(job->model, prompt), std::move(parse), chat_thinking_budget(r),
         std::move(constraint));
  respond(res, job, job->common.stream ? stream_chat : complete_chat);
}

void handle_completions(Server::Impl& s, const httplib::Request& req, httplib::Response& res) {
  auto job = std::make_shared<Job>();
  job->model = s.serving();
  CompletionRequest r = parse_completion_request(parse_body(req.body), job->model.defaults);
  job->common = r.common;
  job->chat = false;
  job->id = "cmpl-" + random_id(24);
  job->created = int64_t(std::time(nullptr));
  std::vector<int32_t> ids = r.prompt_ids;
  if (ids.empty()) {
    ids = encode_prompt(job->model, r.prompt);
  } else {
    for (int32_t id : ids)
      if (id >= job->model.tokenizer->size())
        throw ApiError(400,
                       fmt::format("token id {} is out of range (the vocabulary has {} ids)", id,
                                   job->model.tokenizer->size()),
                       "invalid_request_error", "prompt");
  }
  if (ids.empty())
    throw ApiError(400, "the prompt encodes to no tokens", "invalid_request_error", "prompt");
  if (r.echo) job->echo = r.prompt.empty() ? job->model.tokenizer->decode(ids) : r.prompt;
  ParseOptions parse;
  parse.chat = false;
  auto constraint = completion_constraint(req.body, *job->model.tokenizer);
  launch(s, *job, std::move(ids), std::move(parse), -1, std::move(constraint));
  respond(res, job, job->common.stream ? stream_completion : complete_completion);
}

void handle_tokenize(Server::Impl& s, const httplib::Request& req, httplib::Response& res) {
  const ServingModel m = s.serving();
  const json b = with_default_kwargs(parse_body(req.body), m.chat_template_kwargs);
  std::string text;
  bool parse_special = true;
  if (b.contains("parse_special")) {
    if (!b["parse_special"].is_boolean())
      throw ApiError(400, "'parse_special' must be true or false", "invalid_request_error",
                     "parse_special");
    parse_special = b["parse_special"].get<bool>();
  }
  if (b.contains("messages")) {
    ChatRequest r = parse_chat_request(b, m.defaults);
    if (b.contains("add_generation_prompt") && b["add_generation_prompt"].is_boolean())
      r.chat.add_generation_prompt = b["add_generation_prompt"].get<bool>();
    text = render(m, r);
    parse_special = true;
  } else {
    const char* key = b.contains("content") ? "content" : b.contains("text") ? "text" : "prompt";
    if (!b.contains(key) || !b[key].is_string())
      throw ApiError(400, "give the text to tokenize as 'content' (a string), or 'messages'",
                     "invalid_request_error", "content");
    text = b[key].get<std::string>();
  }
  std::vector<int32_t> ids;
  try {
    ids = m.tokenizer->encode(text, parse_special);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "invalid_request_error", "content");
  }
  json out = {{"tokens", ids}, {"count", ids.size()}};
  if (optional_bool(b, "with_pieces", false)) {
    json pieces = json::array();
    for (int32_t id : ids) pieces.push_back(m.tokenizer->token_bytes(id));
    out["pieces"] = pieces;
  }
  send_json(res, 200, out);
}

void handle_detokenize(Server::Impl& s, const httplib::Request& req, httplib::Response& res) {
  const ServingModel m = s.serving();
  const json b = parse_body(req.body);
  if (!b.contains("tokens") || !b["tokens"].is_array())
    throw ApiError(400, "'tokens' must be an array of token ids", "invalid_request_error",
                   "tokens");
  std::vector<int32_t> ids;
  for (const auto& t : b["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= m.tokenizer->size())
      throw ApiError(400,
                     fmt::format("'tokens' holds {}, not a token id (0 to {})", t.dump(),
                                 m.tokenizer->size() - 1),
                     "invalid_request_error", "tokens");
    ids.push_back(t.get<int32_t>());
  }
  bool skip = optional_bool(b, "skip_special_tokens", false);
  send_json(res, 200, {{"text", m.tokenizer->decode(ids, skip)}});
}

void handle_apply_template(Server::Impl& s, const httplib::Request& req, httplib::Response& res) {
  const ServingModel m = s.serving();
  const json b = with_default_kwargs(parse_body(req.body), m.chat_template_kwargs);
  ChatRequest r = parse_chat_request(b, m.defaults);
  if (b.contains("add_generation_prompt")) {
    if (!b["add_generation_prompt"].is_boolean())
      throw ApiError(400, "'add_generation_prompt' must be true or false", "invalid_request_error",
                     "add_generation_prompt");
    r.chat.add_generation_prompt = b["add_generation_prompt"].get<bool>();
  }
  send_json(res, 200, {{"prompt", render(m, r)}});
}

}  // namespace lilac::server
