// Private to the server: state shared by the infrastructure (server.cpp) and the endpoint
// handlers (handlers.cpp, streaming.cpp).
#pragma once

#include "server/httplib_abi.h"

#include <atomic>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "server/api_error.h"
#include "server/connection.h"
#include "server/server.h"

namespace lilac::server {

struct Server::Impl {
  Server& owner;
  HttpServer http;
  std::mutex model_mutex;
  std::optional<ServingModel> model;  // set once ready
  std::atomic<bool> draining{false};
  std::atomic<bool> listen_returned{false};  // the listener thread's listen_after_bind() is over
  std::atomic<size_t> in_flight{0};          // generations whose response is not finished
  std::atomic<bool> fault_reported{false};   // the device fault was logged
  std::mutex counts_mutex;
  std::map<int, uint64_t> responses_by_status;

  Impl(Server& s, const ConnectionLimits& limits) : owner(s), http(limits) {}
  // The model, or an ApiError 503 while loading / shutting down.
  ServingModel serving();
  // Logs a device fault (once).
  void report_fault(const std::string& fault);
  void routes();
};

// Counts a generation in flight for the owner's lifetime.
class InFlight {
 public:
  explicit InFlight(std::atomic<size_t>& n) : n_(n) { ++n_; }
  ~InFlight() { --n_; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<size_t>& n_;
};

// JSON out: invalid UTF-8 (a token's bytes cut a character) becomes U+FFFD, never an exception.
std::string dump(const nlohmann::json& j);
void send_json(httplib::Response& res, int status, const nlohmann::json& j);
void send_error(httplib::Response& res, const ApiError& e);

// Endpoint bodies (handlers.cpp).
void handle_chat(Server::Impl& s, const httplib::Request& req, httplib::Response& res);
void handle_completions(Server::Impl& s, const httplib::Request& req, httplib::Response& res);
void handle_tokenize(Server::Impl& s, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(Server::Impl& s, const httplib::Request& req, httplib::Response& res);
void handle_apply_template(Server::Impl& s, const httplib::Request& req, httplib::Response& res);

// A random id suffix of `n` alphanumerics ("chatcmpl-" + random_id(24)).
std::string random_id(size_t n);
// A random 63-bit seed for requests that give none.
uint64_t random_seed();

}  // namespace lilac::server
