// The fuzz targets' bodies, shared by the libFuzzer programs (fuzz/<name>_fuzz.cpp, built with
// clang under ASan+UBSan: the `fuzz` preset) and by the corpus replay test
// (tests/fuzz/corpus_replay_test.cpp, every build), which runs each committed seed and every
// crash found so far (fuzz/regressions/<name>/) through the same code.
//
// Each target feeds untrusted bytes to one parser and accepts exactly one outcome besides
// success: a lilac::Error (ApiError included). Anything else (a crash, a sanitizer report, an
// uncaught exception of another type, a hang) is a finding.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "chat/jinja.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/json_parse.h"

#ifndef LILAC_SOURCE_DIR
#error "LILAC_SOURCE_DIR names the source tree (the demo model's tokenizer lives there)"
#endif

namespace lilac::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A safetensors file: the bytes go to an in-memory file (memfd), which open() maps and checks.
inline void safetensors(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) return;
  if (size > 0 && ::write(fd, data, size) != ssize_t(size)) {
    ::close(fd);
    return;
  }
  try {
    auto f = SafetensorsFile::open("/proc/self/fd/" + std::to_string(fd));
    for (const auto& t : f->tensors()) {
      // Touch each tensor's first and last byte: the ranges open() accepted must be inside.
      if (t.nbytes() > 0) {
        volatile uint8_t a = f->data(t)[0], b = f->data(t)[t.nbytes() - 1];
        (void)a;
        (void)b;
      }
    }
  } catch (const Error&) {
  }
  ::close(fd);
}

inline void model_config(const uint8_t* data, size_t size) {
  try {
    ModelConfig c = parse_model_config(std::string(as_text(data, size)), "config.json");
    // The derived sizes must not overflow for anything accepted.
    (void)c.gdn_conv_channels();
    (void)c.q_proj_rows();
    (void)c.kv_dim();
    for (int64_t i = 0; i < c.layers; ++i) (void)c.slot_of_layer(i);
    (void)c.summary();
  } catch (const Error&) {
  }
}

// A request body as /v1/chat/completions, /v1/completions and /tokenize read it.
inline void request(const uint8_t* data, size_t size) {
  SamplingParams defaults;
  nlohmann::json body;
  try {
    body = server::parse_body(std::string(as_text(data, size)));
  } catch (const Error&) {
    return;
  }
  try {
    auto r = server::parse_chat_request(body, defaults);
    (void)server::tool_instruction(r);
    (void)r.messages.dump();
  } catch (const Error&) {
  }
  try {
    (void)server::parse_completion_request(body, defaults);
  } catch (const Error&) {
  }
  try {
    (void)server::optional_bool(body, "with_pieces", false);
  } catch (const Error&) {
  }
}

inline const Tokenizer& demo_tokenizer() {
  static const std::unique_ptr<Tokenizer> t =
      Tokenizer::from_model_dir(std::string(LILAC_SOURCE_DIR) + "/models/demo");
  return *t;
}

// Text to ids (with and without special tokens) and back; ids made from the bytes (some out of
// range), decoded.
inline void tokenizer(const uint8_t* data, size_t size) {
  const Tokenizer& tok = demo_tokenizer();
  const std::string_view text = as_text(data, size);
  for (bool special : {true, false}) {
    try {
      std::vector<int32_t> ids = tok.encode(text, special);
      (void)tok.decode(ids);
    } catch (const Error&) {
    }
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2)
    ids.push_back(int32_t((data[i] << 8 | data[i + 1]) % (tok.size() + 16)) - 8);
  try {
    (void)tok.decode(ids, true);
    (void)tok.decode(ids, false);
  } catch (const Error&) {
  }
}

// A template, then (after a NUL byte, optional) a JSON context to render it with.
inline void jinja(const uint8_t* data, size_t size) {
  const std::string_view all = as_text(data, size);
  const size_t nul = all.find('\0');
  const std::string source(all.substr(0, nul));
  const std::string context = nul == std::string_view::npos
                                  ? R"({"messages":[{"role":"user","content":"hi"}]})"
                                  : std::string(all.substr(nul + 1));
  try {
    parse_json(context);  // the depth limit first: ordered_json itself has none
    auto ctx = nlohmann::ordered_json::parse(context, nullptr, false);
    if (!ctx.is_object()) return;
    jinja::Template t(source, "fuzz.jinja");
    (void)t.render(jinja::Value::from_json(ctx));
  } catch (const Error&) {
  }
}

}  // namespace lilac::fuzz
