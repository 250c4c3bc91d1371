#include "tokenizer/tokenizer_file.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "util/error.h"
#include "util/mapped_file.h"

namespace lilac::tok {

std::string read_file_maybe_gz(const std::string& path) {
  // A regular file only (a FIFO would block forever, /dev/zero never ends), and a bounded
  // inflated size (a gzip bomb): the real tokenizer.json is 11 MB, so 64 MiB leaves room for a
  // larger vocabulary while a bomb is refused after a fraction of a second of inflating.
  constexpr size_t kMaxTokenizerBytes = size_t(64) << 20;
  std::string raw = read_small_file(path, kMaxTokenizerBytes);
  if (raw.size() < 2 || uint8_t(raw[0]) != 0x1F || uint8_t(raw[1]) != 0x8B) return raw;

  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) fail("{}: zlib init failed", path);
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, inflateEnd);
  std::string out;
  out.resize(raw.size() * 4 + 1024);
  zs.next_in = reinterpret_cast<Bytef*>(raw.data());
  zs.avail_in = static_cast<uInt>(raw.size());
  size_t produced = 0;
  for (;;) {
    if (produced == out.size()) {
      if (out.size() >= kMaxTokenizerBytes)
        fail("{}: inflates to more than {} MiB", path, kMaxTokenizerBytes >> 20);
      out.resize(std::min(out.size() * 2, kMaxTokenizerBytes));
    }
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    zs.avail_out = static_cast<uInt>(out.size() - produced);
    int rc = inflate(&zs, Z_NO_FLUSH);
    produced = out.size() - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) fail("{}: truncated gzip data", path);
    if (rc != Z_OK && rc != Z_BUF_ERROR)
      fail("{}: corrupt gzip data ({})", path, zs.msg ? zs.msg : "zlib error");
  }
  out.resize(produced);
  return out;
}

namespace {

using json = nlohmann::json;

// Builds a DOM of everything but model.vocab (streamed into `vocab`) and model.merges.
class Handler : public nlohmann::json_sax<json> {
 public:
  Handler(TokenizerFile& out, const std::string& name) : out_(out), name_(name) {}
  std::string error;

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return vocab_id(v);
    return value(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) {
      if (v > uint64_t(INT32_MAX)) return bad("model.vocab: id out of range for \"" + key_ + "\"");
      return vocab_id(int64_t(v));
    }
    return value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override {
    if (mode_ == Mode::kVocab) return bad("model.vocab: non-integer id for \"" + key_ + "\"");
    return value(json(v));
  }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {
      auto sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos)
        return bad("model.merges[" + std::to_string(out_.merges.size()) + "]: \"" + v +
                   "\" is not two tokens separated by one space");
      out_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    if (mode_ == Mode::kVocab) return bad("model.vocab: id of \"" + key_ + "\" is not a number");
    return value(json(std::move(v)));
  }
  bool binary(binary_t&) override { return bad("binary value"); }

  bool start_object(std::size_t) override {
    if (mode_ != Mode::kDom) return bad(where() + ": unexpected object");
    if (stack_.size() == 2 && path_is_model() && key_ == "vocab") {
      mode_ = Mode::kVocab;
      out_.has_vocab = true;
      return true;
    }
    return open(json::object());
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kDom) return bad(where() + ": unexpected array");
    if (stack_.size() == 2 && path_is_model() && key_ == "merges") {
      mode_ = Mode::kMerges;
      out_.has_merges = true;
      return true;
    }
    return open(json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2)
        return bad("model.merges[" + std::to_string(out_.merges.size()) +
                   "]: a pair must hold exactly two strings");
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }
  bool parse_error(std::size_t pos, const std::string&,
                   const nlohmann::detail::exception& e) override {
    if (error.empty())
      error = fmt::format("{}: invalid JSON near byte {}: {}", name_, pos, e.what());
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool path_is_model() const { return keys_.size() == 2 && keys_[1] == "model"; }
  std::string where() const { return mode_ == Mode::kVocab ? "model.vocab" : "model.merges"; }
  bool bad(const std::string& what) {
    if (error.empty()) error = name_ + ": " + what;
    return false;
  }
  bool vocab_id(int64_t v) {
    if (v < 0) return bad("model.vocab: negative id for \"" + key_ + "\"");
    out_.vocab.emplace_back(std::move(key_), v);
    return true;
  }
  // Attaches a finished value to the container on top of the stack (or makes it the root).
  json* attach(json&& v) {
    if (stack_.empty()) {
      out_.rest = std::move(v);
      return &out_.rest;
    }
    json& top = *stack_.back();
    if (top.is_object()) return &(top[key_] = std::move(v));
    top.push_back(std::move(v));
    return &top.back();
  }
  bool value(json&& v) {
    if (mode_ != Mode::kDom) return bad(where() + ": unexpected value");
    attach(std::move(v));
    return true;
  }
  // Containers below the top are never modified while a child is open, so pointers stay valid.
  bool open(json&& v) {
    keys_.push_back(!stack_.empty() && stack_.back()->is_object() ? key_ : std::string());
    stack_.push_back(attach(std::move(v)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  TokenizerFile& out_;
  const std::string& name_;
  Mode mode_ = Mode::kDom;
  std::vector<json*> stack_;
  std::vector<std::string> keys_;  // the key each open container was stored under
  std::string key_;
  std::vector<std::string> pair_;
};

}  // namespace

TokenizerFile parse_tokenizer_json(const std::string& text, const std::string& name) {
  TokenizerFile out;
  Handler h(out, name);
  bool ok = json::sax_parse(text, &h);
  if (!ok) fail("{}", h.error.empty() ? name + ": invalid JSON" : h.error);
  if (!out.rest.is_object()) fail("{}: not a JSON object", name);
  return out;
}

json read_json_file(const std::string& path) {
  std::string text = read_file_maybe_gz(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

}  // namespace lilac::tok
