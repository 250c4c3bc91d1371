// Errors a request causes, in the OpenAI shape {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

#include "util/error.h"

namespace lilac::server {

class ApiError : public Error {
 public:
  ApiError(int status_, std::string message, std::string type_ = "invalid_request_error",
           std::string param_ = "", std::string code_ = "")
      : Error(message),
        status(status_),
        type(std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}
  int status;
  std::string type, param, code;
  nlohmann::json to_json() const;
};

// The OpenAI error body.
nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::string& param = "", const std::string& code = "");

// A 400 naming the offending field.
template <typename... Args>
[[noreturn]] void bad_field(const std::string& param, fmt::format_string<Args...> f,
                            Args&&... args) {
  throw ApiError(400, fmt::format(f, std::forward<Args>(args)...), "invalid_request_error", param);
}

}  // namespace lilac::server
