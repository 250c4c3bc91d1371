// A real lilac server in-process on a free loopback port: the demo model's tokenizer and chat
// template, the real engine, output parser and HTTP stack, with the TEST-ONLY ScriptedBackend
// forcing exact output token sequences.
#pragma once

#include "server/httplib_abi.h"

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../test_data.h"
#include "chat/chat_template.h"
#include "engine/engine.h"
#include "model/config.h"
#include "server/server.h"
#include "support/scripted_backend.h"
#include "tokenizer/tokenizer.h"

namespace lilac::test {

inline std::string demo_dir() {
  return data_root() + "/../../models/demo";
}

struct ServerFixtureOptions {
  std::vector<server::ScriptedResponse> script;
  server::ServerOptions http;
  EngineOptions engine;
  double step_delay = 0;
  bool warm_up = true;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();  // --chat-template-kwargs
  // Builds the backend (tests that need a backend of their own, e.g. one that faults).
  std::function<std::unique_ptr<server::ScriptedBackend>(const ModelConfig&, const Tokenizer&,
                                                         std::vector<server::ScriptedResponse>)>
      make_backend;
};

class TestServer {
 public:
  explicit TestServer(ServerFixtureOptions o) {
    tokenizer = Tokenizer::from_model_dir(demo_dir());
    chat_template = ChatTemplate::from_model_dir(demo_dir());
    config = load_model_config(demo_dir());
    backend = o.make_backend ? o.make_backend(config, *tokenizer, std::move(o.script))
                             : std::make_unique<server::ScriptedBackend>(config, *tokenizer,
                                                                         std::move(o.script));
    backend->set_step_delay(o.step_delay);
    if (o.engine.context_size == 32768) o.engine.context_size = 4096;
    engine = std::make_unique<Engine>(*backend, *tokenizer, o.engine);
    o.http.host = "127.0.0.1";
    o.http.port = 0;
    srv = std::make_unique<server::Server>(o.http);
    srv->bind();
    srv->start();
    template_kwargs = o.chat_template_kwargs;
    if (o.warm_up) ready();
  }
  void ready() {
    engine->warm_up();
    server::ServingModel m;
    m.engine = engine.get();
    m.tokenizer = tokenizer.get();
    m.chat_template = chat_template.get();
    m.model_id = "test-model";
    m.context_size = engine->options().context_size;
    m.defaults.temperature = 0;
    m.chat_template_kwargs = template_kwargs;
    srv->set_model(m);
  }
  ~TestServer() {
    engine->shutdown();
    srv->stop();  // idempotent: a test may have stopped it
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", srv->port());
    c.set_read_timeout(30, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const nlohmann::json& body,
                       const httplib::Headers& h = {}) const {
    return client().Post(path.c_str(), h, body.dump(), "application/json");
  }
  httplib::Result post_raw(const std::string& path, const std::string& body) const {
    return client().Post(path.c_str(), body, "application/json");
  }

  nlohmann::json template_kwargs;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  ModelConfig config;
  std::unique_ptr<server::ScriptedBackend> backend;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::Server> srv;
};

inline server::ScriptedResponse script_text(const Tokenizer& tok, const std::string& text,
                                            const std::string& match = "") {
  server::ScriptedResponse r;
  r.ids = tok.encode(text, true);
  r.match = match;
  return r;
}

// The named events of an SSE body ("event: NAME\ndata: JSON"), in order: {name, data}.
inline std::vector<std::pair<std::string, nlohmann::json>> named_events(const std::string& body) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("event: ", 0) != 0) continue;
    const size_t nl = ev.find('\n');
    if (nl == std::string::npos || ev.compare(nl + 1, 6, "data: ") != 0) continue;
    out.emplace_back(ev.substr(7, nl - 7), nlohmann::json::parse(ev.substr(nl + 7)));
  }
  return out;
}

// The `data: ...` events of an SSE body, in order ("[DONE]" kept as a string).
inline std::vector<nlohmann::json> sse_events(const std::string& body) {
  std::vector<nlohmann::json> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    std::string data = ev.substr(6);
    out.push_back(data == "[DONE]" ? nlohmann::json("[DONE]") : nlohmann::json::parse(data));
  }
  return out;
}

// True when `s` is well-formed UTF-8 (lead and continuation bytes; overlongs not checked).
inline bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n;
  }
  return true;
}

}  // namespace lilac::test
