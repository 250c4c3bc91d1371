#include "util/json_parse.h"

#include <set>
#include <vector>

namespace lilac {

namespace {

using nlohmann::json;

// nlohmann's DOM builder, wrapped: every event is forwarded after the limits are checked, and
// a stack of open containers remembers the path to the current value for error messages.
class BoundedSax {
 public:
  BoundedSax(json& out, const JsonLimits& limits) : dom_(out, true), limits_(limits) {}

  bool null() { return value() && dom_.null(); }
  bool boolean(bool v) { return value() && dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return value() && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return value() && dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return value() && dom_.number_float(v, s);
  }
  bool string(json::string_t& v) { return value() && dom_.string(v); }
  bool binary(json::binary_t& v) { return value() && dom_.binary(v); }
  bool start_object(std::size_t n) { return open(false) && dom_.start_object(n); }
  bool start_array(std::size_t n) { return open(true) && dom_.start_array(n); }
  bool end_object() { return close() && dom_.end_object(); }
  bool end_array() { return close() && dom_.end_array(); }
  bool key(json::string_t& k) {
    Frame& f = frames_.back();
    f.key = k;
    if (limits_.reject_duplicate_keys && !f.keys.insert(k).second)
      return stop(fmt::format("the key \"{}\" appears twice in one object", k));
    return dom_.key(k);
  }
  bool parse_error(std::size_t position, const std::string& /*token*/,
                   const nlohmann::detail::exception& e) {
    std::string m = e.what();
    // "[json.exception.parse_error.101] parse error at ...": keep the readable part.
    if (auto p = m.find("] "); p != std::string::npos) m = m.substr(p + 2);
    // A number outside double's range is reported at the value it would have been.
    if (e.id == 406) {
      pending_value_ = true;
      return stop(fmt::format("{} (at byte {})", m, position));
    }
    return stop(m);
  }

  bool failed() const { return !message_.empty(); }
  const std::string& message() const { return message_; }
  const std::string& field() const { return field_; }

 private:
  struct Frame {
    bool array;
    size_t index = 0;  // the next element's index (arrays)
    std::string key;   // the current member's key (objects)
    std::set<std::string> keys;
  };

  // Called before every value (scalars and containers): advances the array index.
  bool value() {
    if (!frames_.empty() && frames_.back().array) frames_.back().index++;
    return true;
  }
  bool open(bool array) {
    value();
    if (frames_.size() >= limits_.max_depth)
      return stop(fmt::format("JSON nested deeper than {} levels", limits_.max_depth));
    frames_.push_back(Frame{array});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }
  bool stop(const std::string& message) {
    message_ = message;
    field_ = path();
    return false;
  }
  // "a.b[2].c": the path of the value being parsed (its first 8 steps, then "...").
  std::string path() const {
    std::string p;
    for (size_t i = 0; i < frames_.size(); ++i) {
      if (i == 8) return p + "...";
      const Frame& f = frames_[i];
      const bool last = i + 1 == frames_.size();
      if (f.array) {
        // The index was advanced when the element started; a pending value has not started.
        const size_t index = f.index == 0 || (last && pending_value_) ? f.index : f.index - 1;
        p += fmt::format("[{}]", index);
      } else if (!f.key.empty()) {
        p += (p.empty() ? "" : ".") + f.key;
      }
    }
    return p;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const JsonLimits& limits_;
  std::vector<Frame> frames_;
  bool pending_value_ = false;
  std::string message_, field_;
};

}  // namespace

json parse_json(std::string_view text, const JsonLimits& limits) {
  json out;
  BoundedSax sax(out, limits);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const json::exception& e) {  // the DOM builder's own errors (none expected)
    throw JsonParseError(e.what(), sax.field());
  }
  if (!ok || sax.failed()) {
    out = json();  // what was built is at most max_depth deep: safe to destroy
    throw JsonParseError(sax.failed() ? sax.message() : "not valid JSON", sax.field());
  }
  return out;
}

}  // namespace lilac
