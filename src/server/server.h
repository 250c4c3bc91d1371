// The OpenAI-compatible HTTP server (cpp-httplib): /v1/chat/completions, /v1/completions,
// /v1/models, /health, /metrics, /tokenize, /detokenize, /apply-template. See docs/api.md.
// It listens before the model is ready (/health says 503 "loading" meanwhile), refuses new work
// with 503 while shutting down, and never lets one request's failure affect the next.
// The agent APIs, /v1/messages (Anthropic) and /v1/responses, are in server/agent_api.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chat/chat_template.h"
#include "engine/engine.h"
#include "model/sampling.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace lilac::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                        // 0: any free port (see Server::port())
  std::string api_key;                    // empty: no authentication
  std::vector<std::string> cors_origins;  // allowed Origins, or "*"
  size_t max_body = 16 << 20;             // bytes; larger bodies get 413
  // Connections are served by a thread each (src/server/connection.h): at most max(threads,
  // max_connections) open at once; at the cap the longest-idle one is closed to make room.
  int threads = 0;
  size_t max_connections = 512;
  double head_timeout = 10;  // seconds for a request's line and headers to arrive
};

// The model the server talks to (owned elsewhere; must outlive the server's use of it).
struct ServingModel {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  SamplingParams defaults;
  std::string model_id;  // the `model` the API reports
  int64_t context_size = 0;
  // Server-wide chat_template_kwargs defaults (--chat-template-kwargs); a request's keys win.
  nlohmann::json chat_template_kwargs = nlohmann::json::object();
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; throws lilac::Error when it cannot (port in use, bad host).
  void bind();
  int port() const { return port_; }
  // Serves on a background thread (after bind()).
  void start();
  // From now on the generation endpoints work and /health says 200.
  void set_model(const ServingModel& model);
  // Graceful stop, step 1: new requests get 503; running ones go on.
  void drain();
  // Waits until no generation is in flight or `seconds` pass; true when idle.
  bool wait_idle(double seconds) const;
  size_t in_flight() const;
  // Open HTTP connections (tests and the soak's bookkeeping).
  size_t open_connections() const;
  // Closes the listener and joins the serving thread (call after the engine stopped).
  void stop();

  struct Impl;  // private to the server's sources (server_impl.h)

 private:
  std::unique_ptr<Impl> impl_;
  ServerOptions options_;
  int port_ = 0;
  std::thread thread_;
};

// The model id to report for a directory: "Org/Name" for a Hugging Face snapshot, "lilac-demo"
// for the demo model, else the directory's name.
std::string default_model_id(const std::string& dir, bool demo);

}  // namespace lilac::server
