// Server logging: one line per event on stderr, plain ("2026-01-01T00:00:00Z info  message k=v")
// or JSON ({"ts":..,"level":..,"msg":..,k:v}) with --log-json. Thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace lilac::server {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

// Parses "debug", "info", "warn"/"warning", "error", "off"; throws lilac::Error otherwise.
LogLevel parse_log_level(const std::string& s);

class Log {
 public:
  static void configure(LogLevel level, bool json);
  static bool enabled(LogLevel level);
  // `fields` (an object) is printed as k=v pairs, or merged into the JSON line.
  static void write(LogLevel level, const std::string& msg,
                    const nlohmann::json& fields = nlohmann::json::object());
  static void debug(const std::string& m, const nlohmann::json& f = nlohmann::json::object()) {
    write(LogLevel::Debug, m, f);
  }
  static void info(const std::string& m, const nlohmann::json& f = nlohmann::json::object()) {
    write(LogLevel::Info, m, f);
  }
  static void warn(const std::string& m, const nlohmann::json& f = nlohmann::json::object()) {
    write(LogLevel::Warn, m, f);
  }
  static void error(const std::string& m, const nlohmann::json& f = nlohmann::json::object()) {
    write(LogLevel::Error, m, f);
  }
};

}  // namespace lilac::server
