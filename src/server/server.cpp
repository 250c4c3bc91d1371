#include "server/server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chrono>
#include <filesystem>
#include <random>

#include "server/agent_api.h"
#include "server/log.h"
#include "server/server_impl.h"

namespace lilac::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

thread_local Clock::time_point t_request_start;
thread_local std::string t_request_id;

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Compares every byte of the longer string, whatever the lengths, in time independent of
  // where they differ.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string default_message(int status, const httplib::Request& req, size_t max_body) {
  switch (status) {
    case 400:
      return "bad request";
    case 404:
      return fmt::format("no route for {} {}", req.method, req.path);
    case 405:
      return fmt::format("method {} is not allowed on {}", req.method, req.path);
    case 413:
      return fmt::format("the request body is larger than the limit of {} bytes (--max-body)",
                         max_body);
    case 414:
      return "the request URI is too long";
    default:
      return fmt::format("HTTP {}", status);
  }
}

std::string error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

}  // namespace

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status, e.to_json());
}

std::string random_id(size_t n) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s(n, 'x');
  for (auto& c : s) c = kChars[rng() % (sizeof(kChars) - 1)];
  return s;
}

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng() >> 1;
}

std::string default_model_id(const std::string& dir, bool demo) {
  if (demo) return "lilac-demo";
  namespace fs = std::filesystem;
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  // .../models--Org--Name/snapshots/<hash>
  if (p.parent_path().filename() == "snapshots") {
    std::string repo = p.parent_path().parent_path().filename().string();
    if (repo.rfind("models--", 0) == 0) {
      repo = repo.substr(8);
      if (auto pos = repo.find("--"); pos != std::string::npos) repo.replace(pos, 2, "/");
      return repo;
    }
  }
  return p.filename().string();
}

ServingModel Server::Impl::serving() {
  if (draining)
    throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
  std::lock_guard lock(model_mutex);
  if (!model)
    throw ApiError(503, "the model is still loading; retry when GET /health returns 200",
                   "server_error", "", "model_loading");
  if (std::string fault = model->engine->fault(); !fault.empty()) {
    report_fault(fault);
    throw ApiError(503, "the device failed (" + fault + "); the server must be restarted",
                   "server_error", "", "device_fault");
  }
  return *model;
}

void Server::Impl::report_fault(const std::string& fault) {
  if (!fault_reported.exchange(true))
    Log::error("device fault: the engine stopped taking work; restart the process",
               {{"error", fault}});
}

namespace {

ConnectionLimits connection_limits(const ServerOptions& o) {
  ConnectionLimits l;
  l.max_connections = std::max(o.max_connections, size_t(std::max(o.threads, 1)));
  l.head_timeout_s = o.head_timeout;
  return l;
}

}  // namespace

Server::Server(ServerOptions options)
    : impl_(std::make_unique<Impl>(*this, connection_limits(options))),
      options_(std::move(options)) {
  auto& http = impl_->http;
  Impl& s = *impl_;
  const ServerOptions& o = options_;
  http.set_tcp_nodelay(true);
  http.set_payload_max_length(o.max_body);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);

  http.set_pre_routing_handler([this, &s](const httplib::Request& req, httplib::Response& res) {
    t_request_start = Clock::now();
    t_request_id = random_id(12);
    res.set_header("X-Request-Id", t_request_id);
    // Framing before anything else; then every answer given here, before the body is read,
    // closes a connection that has a body still to come (it would be parsed as a request).
    if (auto bad = check_framing(req, options_.max_body)) {
      HttpServer::close_after_response();
      send_error(res, ApiError(bad->status, bad->message, error_type(bad->status)));
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool chunked = req.has_header("Transfer-Encoding");
    const bool has_body = chunked || (req.has_header("Content-Length") &&
                                      req.get_header_value("Content-Length") != "0");
    auto answered = [&] {
      if (has_body) HttpServer::close_after_response();
      return httplib::Server::HandlerResponse::Handled;
    };
    auto pass = [&] {
      HttpServer::begin_body(chunked, options_.max_body);
      return httplib::Server::HandlerResponse::Unhandled;
    };
    // CORS: echo an allowed Origin (or "*"); answer preflights here.
    const std::string origin = req.get_header_value("Origin");
    bool cors = false;
    for (const auto& allowed : options_.cors_origins)
      if (allowed == "*" || (!origin.empty() && allowed == origin)) cors = true;
    if (cors) {
      const bool any = std::find(options_.cors_origins.begin(), options_.cors_origins.end(), "*") !=
                       options_.cors_origins.end();
      res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
      if (!any) res.set_header("Vary", "Origin");
      res.set_header("Access-Control-Expose-Headers", "X-Request-Id");
      if (req.method == "OPTIONS") {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        const std::string h = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers",
                       h.empty() ? "Authorization, Content-Type" : h);
        res.set_header("Access-Control-Max-Age", "600");
        res.status = 204;
        return answered();
      }
    }
    if (req.path == "/health") return pass();
    if (s.draining) {
      HttpServer::close_after_response();
      const ApiError e(503, "the server is shutting down", "server_error", "", "shutting_down");
      if (is_anthropic_path(req.path)) {
        res.set_header("Retry-After", "1");
        send_json(res, 503, anthropic_error_body(503, e.what()));
      } else {
        send_error(res, e);
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!options_.api_key.empty()) {
      const std::string auth = req.get_header_value("Authorization");
      const std::string expected = "Bearer " + options_.api_key;
      const std::string x_api_key = req.get_header_value("x-api-key");  // Anthropic's header
      const bool ok = constant_time_equal(auth, expected) ||
                      (!x_api_key.empty() && constant_time_equal(x_api_key, options_.api_key));
      if (!ok) {
        const ApiError e(401,
                         auth.empty() && x_api_key.empty()
                             ? "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'"
                             : "incorrect API key provided",
                         "authentication_error", "", "invalid_api_key");
        if (is_anthropic_path(req.path))
          send_json(res, 401, anthropic_error_body(401, e.what()));
        else
          send_error(res, e);
        return answered();
      }
    }
    return pass();
  });

  // An answer that leaves the connection unusable (see above) says so.
  http.set_post_routing_handler([&s](const httplib::Request&, httplib::Response& res) {
    if (s.draining) HttpServer::close_after_response();  // no keep-alive while shutting down
    if (!HttpServer::closing_after_response()) return;
    res.headers.erase("Keep-Alive");
    if (res.get_header_value("Connection") != "close") {
      res.headers.erase("Connection");
      res.set_header("Connection", "close");
    }
  });

  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.status < 400)
          return httplib::Server::HandlerResponse::Unhandled;
        // httplib's own errors: a request it could not parse or whose body it could not read
        // leaves the connection at an unknown position; only a 404 / 405 comes after a complete
        // request.
        if (res.status != 404 && res.status != 405) HttpServer::close_after_response();
        if (res.status == 400 && HttpServer::body_over_limit()) res.status = 413;
        const std::string message = default_message(res.status, req, options_.max_body);
        send_json(res, res.status,
                  is_anthropic_path(req.path) ? anthropic_error_body(res.status, message)
                                              : error_body(message, error_type(res.status)));
        return httplib::Server::HandlerResponse::Handled;
      }));

  http.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown";
        try {
          std::rethrow_exception(ep);
        } catch (const ApiError& e) {
          send_error(res, e);
          return;
        } catch (const Error& e) {
          send_error(res, ApiError(400, e.what()));
          return;
        } catch (const nlohmann::json::exception& e) {
          // A request value of an unexpected type that no check caught: still the client's.
          send_error(res, ApiError(400, std::string("invalid request: ") + e.what()));
          return;
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        Log::error("internal error", {{"path", req.path}, {"error", what}});
        send_json(res, 500, error_body("internal error: " + what, "server_error"));
      });

  http.set_logger([&s](const httplib::Request& req, const httplib::Response& res) {
    {
      std::lock_guard lock(s.counts_mutex);
      s.responses_by_status[res.status]++;
    }
    const LogLevel level = res.status >= 500   ? LogLevel::Error
                           : res.status >= 400 ? LogLevel::Warn
                                               : LogLevel::Info;
    if (req.path == "/health" || req.path == "/metrics") {
      if (!Log::enabled(LogLevel::Debug) && res.status < 500) return;
    }
    if (!Log::enabled(level)) return;
    const double ms =
        std::chrono::duration<double, std::milli>(Clock::now() - t_request_start).count();
    json f = {
        {"id", t_request_id},   {"method", req.method},           {"path", req.path},
        {"status", res.status}, {"ms", std::round(ms * 10) / 10}, {"remote", req.remote_addr}};
    if (res.status >= 400 && !res.body.empty()) {
      auto j = json::parse(res.body, nullptr, false);
      if (j.is_object() && j.contains("error") && j["error"].contains("message"))
        f["error"] = j["error"]["message"];
    }
    Log::write(level, "request", f);
  });

  impl_->routes();
}

Server::~Server() {
  stop();
}

void Server::bind() {
  const ServerOptions& o = options_;
  if (o.port < 0 || o.port > 65535) fail("--port {}: not a TCP port", o.port);
  if (o.port == 0) {
    port_ = impl_->http.bind_to_any_port(o.host);
    if (port_ <= 0) fail("cannot listen on {} (any port)", o.host);
  } else {
    if (!impl_->http.bind_to_port(o.host, o.port))
      fail("cannot listen on {}:{} (address in use, or not an address of this machine)", o.host,
           o.port);
    port_ = o.port;
  }
  impl_->http.deepen_listen_queue();
}

void Server::start() {
  impl_->listen_returned = false;
  thread_ = std::thread([this] {
    impl_->http.listen_after_bind();
    impl_->listen_returned = true;
  });
}

void Server::set_model(const ServingModel& model) {
  std::lock_guard lock(impl_->model_mutex);
  impl_->model = model;
}

void Server::drain() {
  impl_->draining = true;
  // Idle keep-alive connections close now, not after their keep-alive timeout: a client's next
  // request goes to a fresh connection (and gets the 503 there, or a successor's answer).
  impl_->http.close_idle();
}

size_t Server::open_connections() const {
  return impl_->http.open_connections();
}

size_t Server::in_flight() const {
  return impl_->in_flight;
}

bool Server::wait_idle(double seconds) const {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (impl_->in_flight > 0) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void Server::stop() {
  if (!thread_.joinable()) return;
  // httplib's stop() acts only on a listener that is already running: called before the thread
  // reaches its accept loop (a model that fails to load right after start()), it would do nothing
  // and the loop would then run forever. So wait until the loop runs, or has ended, first.
  while (!impl_->http.is_running() && !impl_->listen_returned)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.close_idle();
  impl_->http.stop();
  thread_.join();
}

void Server::Impl::routes() {
  Impl& s = *this;
  http.Get("/health", [&s](const httplib::Request&, httplib::Response& res) {
    if (s.draining) return send_json(res, 503, {{"status", "shutting_down"}});
    bool ready;
    std::string fault;
    {
      std::lock_guard lock(s.model_mutex);
      ready = s.model && s.model->engine->ready();
      if (s.model) fault = s.model->engine->fault();
    }
    if (!fault.empty()) {
      s.report_fault(fault);
      return send_json(res, 503, {{"status", "device_fault"}, {"error", fault}});
    }
    send_json(res, ready ? 200 : 503, {{"status", ready ? "ok" : "loading"}});
  });
  http.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    std::string text;
    {
      std::lock_guard lock(s.model_mutex);
      if (s.model)
        text = s.model->engine->metrics().render(s.model->engine->queue_length(),
                                                 s.model->engine->running());
    }
    text +=
        "# HELP lilac_http_responses_total HTTP responses by status code\n# TYPE "
        "lilac_http_responses_total counter\n";
    {
      std::lock_guard lock(s.counts_mutex);
      for (auto& [code, n] : s.responses_by_status)
        text += fmt::format("lilac_http_responses_total{{code=\"{}\"}} {}\n", code, n);
    }
    text += fmt::format(
        "# HELP lilac_http_in_flight Generation requests in flight\n# TYPE lilac_http_in_flight "
        "gauge\n"
        "lilac_http_in_flight {}\n",
        s.owner.in_flight());
    res.set_content(text, "text/plain; version=0.0.4");
  });
  auto models = [&s](const httplib::Request& req, httplib::Response& res) {
    ServingModel m = s.serving();
    json card = {{"id", m.model_id},
                 {"object", "model"},
                 {"created", 0},
                 {"owned_by", "lilac"},
                 {"max_model_len", m.context_size}};
    if (req.matches.size() > 1) {
      if (req.matches[1] != m.model_id)
        throw ApiError(404, "the model '" + std::string(req.matches[1]) + "' does not exist",
                       "invalid_request_error", "model", "model_not_found");
      return send_json(res, 200, card);
    }
    send_json(res, 200, {{"object", "list"}, {"data", json::array({card})}});
  };
  http.Get("/v1/models", models);
  http.Get(R"(/v1/models/(.+))", models);
  http.Post("/v1/chat/completions",
            [&s](const httplib::Request& q, httplib::Response& r) { handle_chat(s, q, r); });
  http.Post("/v1/completions",
            [&s](const httplib::Request& q, httplib::Response& r) { handle_completions(s, q, r); });
  http.Post("/v1/messages",
            [&s](const httplib::Request& q, httplib::Response& r) { handle_messages(s, q, r); });
  http.Post("/v1/messages/count_tokens", [&s](const httplib::Request& q, httplib::Response& r) {
    handle_count_tokens(s, q, r);
  });
  http.Post("/v1/responses",
            [&s](const httplib::Request& q, httplib::Response& r) { handle_responses(s, q, r); });
  http.Post("/tokenize",
            [&s](const httplib::Request& q, httplib::Response& r) { handle_tokenize(s, q, r); });
  http.Post("/detokenize",
            [&s](const httplib::Request& q, httplib::Response& r) { handle_detokenize(s, q, r); });
  http.Post("/apply-template", [&s](const httplib::Request& q, httplib::Response& r) {
    handle_apply_template(s, q, r);
  });
}

}  // namespace lilac::server
