#include "server/log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "util/error.h"

namespace lilac::server {
namespace {

std::mutex g_mutex;
LogLevel g_level = LogLevel::Info;
bool g_json = false;

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::Debug:
      return "debug";
    case LogLevel::Info:
      return "info";
    case LogLevel::Warn:
      return "warn";
    case LogLevel::Error:
      return "error";
    case LogLevel::Off:
      return "off";
  }
  return "?";
}

std::string timestamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, int(ms));
}

}  // namespace

LogLevel parse_log_level(const std::string& s) {
  if (s == "debug") return LogLevel::Debug;
  if (s == "info") return LogLevel::Info;
  if (s == "warn" || s == "warning") return LogLevel::Warn;
  if (s == "error") return LogLevel::Error;
  if (s == "off" || s == "none") return LogLevel::Off;
  fail("unknown log level '{}' (expected debug, info, warn, error or off)", s);
}

void Log::configure(LogLevel level, bool json) {
  std::lock_guard lock(g_mutex);
  g_level = level;
  g_json = json;
}

bool Log::enabled(LogLevel level) {
  std::lock_guard lock(g_mutex);
  return level >= g_level && level != LogLevel::Off;
}

void Log::write(LogLevel level, const std::string& msg, const nlohmann::json& fields) {
  std::lock_guard lock(g_mutex);
  if (level < g_level || level == LogLevel::Off) return;
  std::string line;
  if (g_json) {
    nlohmann::json j = {{"ts", timestamp()}, {"level", level_name(level)}, {"msg", msg}};
    if (fields.is_object())
      for (auto& [k, v] : fields.items()) j[k] = v;
    line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else {
    line = fmt::format("{} {:<5} {}", timestamp(), level_name(level), msg);
    if (fields.is_object())
      for (auto& [k, v] : fields.items())
        line += " " + k + "=" +
                (v.is_string() ? v.get<std::string>()
                               : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  line += "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace lilac::server
