#include "server/agent_api.h"

#include <algorithm>

namespace lilac::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kHeartbeat = std::chrono::milliseconds(200);

}  // namespace

int64_t effort_budget(const std::string& effort, const std::string& field) {
  if (effort == "none" || effort == "xhigh" || effort == "max") return -1;
  if (effort == "minimal") return 512;
  if (effort == "low") return 2048;
  if (effort == "medium") return 8192;
  if (effort == "high") return 24576;
  bad_field(field, "'{}' must be none, minimal, low, medium, high or xhigh; got '{}'", field,
            effort);
}

int64_t chat_thinking_budget(const ChatRequest& r) {
  int64_t budget = -1;
  if (!r.reasoning_effort.empty()) budget = effort_budget(r.reasoning_effort, "reasoning_effort");
  if (auto it = r.chat.extra.find("thinking_budget"); it != r.chat.extra.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < -1)
      bad_field("chat_template_kwargs.thinking_budget",
                "'thinking_budget' must be an integer >= 0 (tokens; -1: no budget)");
    budget = it->get<int64_t>();
  }
  return budget;
}

void apply_thinking_budget(GenerationRequest& rq, const Tokenizer& tok, int64_t budget,
                           bool starts_in_reasoning) {
  rq.thinking_budget = budget;
  rq.starts_in_reasoning = starts_in_reasoning;
  if (budget < 0) return;
  if (auto id = tok.token_id("</think>")) rq.think_end_id = *id;
  rq.think_close = tok.encode("</think>\n\n", true);
}

json with_default_kwargs(json body, const json& defaults) {
  if (!defaults.is_object() || defaults.empty()) return body;
  if (!body.contains("chat_template_kwargs") || body["chat_template_kwargs"].is_null())
    body["chat_template_kwargs"] = json::object();
  json& k = body["chat_template_kwargs"];
  if (!k.is_object()) bad_field("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  for (const auto& [key, v] : defaults.items())
    if (!k.contains(key)) k[key] = v;
  return body;
}

std::vector<int32_t> render_and_encode(AgentJob& job) {
  const ServingModel& m = job.model;
  try {
    job.prompt = m.chat_template->render(job.chat.messages, job.chat.tools, job.chat.chat);
  } catch (const Error& e) {
    throw ApiError(
        400, std::string("the messages cannot be rendered with the chat template: ") + e.what(),
        "invalid_request_error", "messages");
  }
  std::vector<int32_t> ids;
  try {
    ids = m.tokenizer->encode(job.prompt, true);
  } catch (const Error& e) {
    throw ApiError(400, std::string("the prompt cannot be tokenized: ") + e.what());
  }
  job.prompt_tokens = int64_t(ids.size());
  return ids;
}

void check_length(const ServingModel& m, size_t n) {
  if (int64_t(n) >= m.context_size)
    throw ApiError(
        400,
        fmt::format(
            "the prompt has {} tokens, and this server's context is {} tokens (prompt + answer)", n,
            m.context_size),
        "invalid_request_error", "messages", "context_length_exceeded");
}

std::unique_ptr<Generation> start_generation(Server::Impl& s, const ServingModel& m,
                                             const CommonParams& c, std::vector<int32_t> ids,
                                             ParseOptions parse, int64_t thinking_budget,
                                             std::shared_ptr<TokenConstraint> constraint) {
  check_length(m, ids.size());
  GenerationRequest rq;
  rq.sampling = c.sampling;
  if (!c.seed_given) rq.sampling.seed = random_seed();
  rq.max_tokens = c.max_tokens.value_or(m.context_size);
  if (!c.ignore_eos) rq.stop_ids = m.tokenizer->eos_ids();
  rq.stop_strings = c.stop;
  if (size_t at = last_turn_start(ids, *m.tokenizer); at > 0) rq.snapshot_at.push_back(at);
  apply_thinking_budget(rq, *m.tokenizer, thinking_budget, parse.in_reasoning);
  rq.prompt = std::move(ids);
  rq.constraint = std::move(constraint);  // structured output (structured_output.h)
  try {
    return std::make_unique<Generation>(*m.engine, std::move(rq), std::move(parse));
  } catch (const QueueFull&) {
    throw ApiError(429, "the server is busy (the request queue is full); retry later",
                   "rate_limit_error", "", "queue_full");
  } catch (const Error& e) {
    if (s.draining)
      throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
    throw ApiError(400, e.what());
  }
}

void launch_agent_job(Server::Impl& s, AgentJob& job, std::vector<int32_t> ids,
                      int64_t thinking_budget) {
  ParseOptions parse;
  parse.chat = true;
  parse.in_reasoning = prompt_opens_reasoning(job.prompt);
  parse.tools = job.chat.tools;
  parse.max_tool_calls = job.chat.parallel_tool_calls ? -1 : 1;
  parse.stream_calls = job.stream;
  job.gen = start_generation(s, job.model, job.chat.common, std::move(ids), std::move(parse),
                             thinking_budget);
  job.in_flight = std::make_unique<InFlight>(s.in_flight);
}

bool agent_emit(AgentJob& job, httplib::DataSink& sink, const std::string& s) {
  job.last_write = Clock::now();
  if (sink.write(s.data(), s.size())) return true;
  job.gen->cancel();
  return false;
}

bool agent_heartbeat(AgentJob& job, httplib::DataSink& sink) {
  if (Clock::now() - job.last_write < kHeartbeat) return true;
  if (agent_emit(job, sink, job.stream ? ":\n\n" : " ") && sink.is_writable()) return true;
  job.gen->cancel();
  return false;
}

bool agent_event(AgentJob& job, httplib::DataSink& sink, const std::string& name,
                 const json& data) {
  return agent_emit(job, sink, "event: " + name + "\ndata: " + dump(data) + "\n\n");
}

std::optional<std::string> matched_stop(const AgentJob& job, const GenerationResult& r) {
  if (r.finish != FinishReason::Stop || r.tokens.empty() || job.chat.common.stop.empty())
    return std::nullopt;
  const auto& eos = job.model.tokenizer->eos_ids();
  if (std::find(eos.begin(), eos.end(), r.tokens.back()) != eos.end()) return std::nullopt;
  const std::string all = job.model.tokenizer->decode(r.tokens);
  std::optional<std::string> best;
  size_t best_at = std::string::npos;
  for (const auto& s : job.chat.common.stop)
    if (size_t at = all.find(s); at < best_at) best_at = at, best = s;
  return best;
}

int64_t count_tokens(const ServingModel& m, const std::string& text) {
  if (text.empty()) return 0;
  try {
    return int64_t(m.tokenizer->encode(text, false).size());
  } catch (const Error&) {
    return 0;
  }
}

}  // namespace lilac::server
