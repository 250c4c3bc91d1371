// What the agent-facing APIs share: the Anthropic Messages API (messages_api.cpp) and the OpenAI
// Responses API (responses_api.cpp) are converted into a chat-completions request (so the one
// validator, chat template, engine and output parser serve all three), run as a job like
// handlers.cpp's, and answered in their own shapes. Also here: the thinking budget (how efforts
// and budgets map onto GenerationRequest::thinking_budget) and the server-wide chat-template
// kwargs defaults (--chat-template-kwargs). See docs/api.md.
#pragma once

#include "server/httplib_abi.h"

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/generation.h"
#include "server/request.h"
#include "server/server_impl.h"

namespace lilac::server {

// ---- thinking budget -----------------------------------------------------------------------

// The thinking budget (tokens) an effort names: none -1 (thinking is turned off instead),
// minimal 512, low 2048, medium 8192, high 24576, xhigh -1 (unlimited). 400 naming `field` on
// anything else.
int64_t effort_budget(const std::string& effort, const std::string& field);

// The budget of a chat request: chat_template_kwargs.thinking_budget (an integer >= 0; -1: none)
// wins over reasoning_effort; -1 when neither is given.
int64_t chat_thinking_budget(const ChatRequest& r);

// Sets the engine's thinking-budget fields: the budget, the </think> id, the ids that close the
// thinking ("</think>\n\n", as the chat template closes it) and whether the prompt opened it.
void apply_thinking_budget(GenerationRequest& rq, const Tokenizer& tok, int64_t budget,
                           bool starts_in_reasoning);

// ---- chat-template kwargs defaults ---------------------------------------------------------

// `body` with the server's default chat_template_kwargs added where the request sets none of
// its own (a request's key wins). 400 when the request's chat_template_kwargs is not an object.
nlohmann::json with_default_kwargs(nlohmann::json body, const nlohmann::json& defaults);

// ---- starting a generation (every endpoint) ------------------------------------------------

// 400 (`context_length_exceeded`) when a prompt of n tokens leaves no room for an answer.
void check_length(const ServingModel& m, size_t n);

// Queues a generation of `ids` with the request's common parameters (sampling, seed, max tokens,
// stops, ignore_eos), a snapshot where the last turn starts, the thinking budget and the
// constraint (structured output). 400 when the prompt does not fit, 429 when the queue is full,
// 503 while shutting down.
std::unique_ptr<Generation> start_generation(Server::Impl& s, const ServingModel& m,
                                             const CommonParams& c, std::vector<int32_t> ids,
                                             ParseOptions parse, int64_t thinking_budget = -1,
                                             std::shared_ptr<TokenConstraint> constraint = nullptr);

// ---- running a converted request -----------------------------------------------------------

// A generation for one of the agent APIs, and the state its response writer needs.
struct AgentJob {
  ServingModel model;
  ChatRequest chat;
  bool stream = false;
  std::string prompt;  // rendered
  int64_t prompt_tokens = 0;
  std::unique_ptr<Generation> gen;
  std::unique_ptr<InFlight> in_flight;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};

// Renders the chat (400 when the template refuses it) and tokenizes it.
std::vector<int32_t> render_and_encode(AgentJob& job);

// Queues the generation (429 when the queue is full, 400 when the prompt does not fit) with the
// thinking budget; the output parser gets the request's tools.
void launch_agent_job(Server::Impl& s, AgentJob& job, std::vector<int32_t> ids,
                      int64_t thinking_budget);

// Writes to the client; false (and the generation cancelled) when the client is gone.
bool agent_emit(AgentJob& job, httplib::DataSink& sink, const std::string& s);
// After a while without a write: an SSE comment (or a space before a JSON body). False when the
// client is gone.
bool agent_heartbeat(AgentJob& job, httplib::DataSink& sink);
// One SSE event with a name: "event: NAME\ndata: JSON\n\n".
bool agent_event(AgentJob& job, httplib::DataSink& sink, const std::string& name,
                 const nlohmann::json& data);

// Hands a job (anything with a `gen`) to httplib: the body is produced on the handler thread by
// `body`, chunked (SSE when `stream`), so a client that disconnects is noticed (a failed write,
// or the socket polled while waiting) and cancels the generation. Every endpoint answers this way.
template <typename JobT, typename Body>
void respond_chunked(httplib::Response& res, std::shared_ptr<JobT> job, bool stream, Body body) {
  res.status = 200;
  if (stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
  }
  res.set_chunked_content_provider(
      stream ? "text/event-stream" : "application/json",
      [job, body](size_t, httplib::DataSink& sink) { return body(*job, sink); },
      [job](bool success) {
        if (!success && job->gen) job->gen->cancel();
      });
}

// respond_chunked for the agent APIs.
inline void respond_agent(httplib::Response& res, std::shared_ptr<AgentJob> job,
                          std::function<bool(AgentJob&, httplib::DataSink&)> body) {
  const bool stream = job->stream;
  respond_chunked(res, std::move(job), stream, std::move(body));
}

// The stop string that ended a generation (finish Stop without an eos id), if any: the one that
// occurs first in the decoded output.
std::optional<std::string> matched_stop(const AgentJob& job, const GenerationResult& r);

// Tokens of `text` (reasoning token counts for usage).
int64_t count_tokens(const ServingModel& m, const std::string& text);

// ---- the endpoints -------------------------------------------------------------------------

void handle_messages(Server::Impl& s, const httplib::Request& req, httplib::Response& res);
void handle_count_tokens(Server::Impl& s, const httplib::Request& req, httplib::Response& res);
void handle_responses(Server::Impl& s, const httplib::Request& req, httplib::Response& res);

// Anthropic's error shape {"type": "error", "error": {"type", "message"}} for the /v1/messages
// routes (server.cpp uses it for the errors it answers itself: 401, 404, 413, 503).
bool is_anthropic_path(const std::string& path);
nlohmann::json anthropic_error_body(int status, const std::string& message);

}  // namespace lilac::server
