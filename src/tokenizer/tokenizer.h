// The HF tokenizer.json machinery Qwen3.5/3.6 needs (docs/model.md section 6): NFC normalizer,
// Split pre-tokenizer regex (PCRE2, UTF + UCP), byte-level mapping, BPE merges, added tokens
// matched as whole strings before BPE, byte-level decoding. Ids always come from the files.
//
// INTERFACE CONTRACT (the engine and server code against this; implementations may add to it).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lilac {

struct TokenizerOptions {
  // Replace the file's pre-tokenizer regex with the Qwen3.5/3.6 one (docs/model.md section 6). Set
  // automatically by from_model_dir for model_type qwen3_5 / qwen3_5_moe.
  bool force_qwen35_regex = false;
};

// Explicit file set (from_model_dir fills it from a directory). Empty paths and missing
// optional files are skipped.
struct TokenizerFiles {
  std::string tokenizer_json;     // required; may be gzipped
  std::string tokenizer_config;   // optional: added_tokens_decoder, eos_token
  std::string generation_config;  // optional: eos_token_id (int or list)
  TokenizerOptions options;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads a tokenizer.json. Throws lilac::Error naming the file on any defect.
  static std::unique_ptr<Tokenizer> from_file(const std::string& tokenizer_json,
                                              const TokenizerOptions& = {});
  // Loads DIR/tokenizer.json plus tokenizer_config.json / generation_config.json / config.json
  // (special tokens, eos ids, model_type -> regex choice).
  static std::unique_ptr<Tokenizer> from_model_dir(const std::string& dir);
  static std::unique_ptr<Tokenizer> from_files(const TokenizerFiles& files);

  // Text -> ids. Added/special tokens in the text are matched as whole strings when
  // parse_special (chat prompts), else encoded as plain text. Throws lilac::Error on invalid UTF-8.
  // parse_special = false turns off matching of every added token, special or not (HF would
  // still match non-special ones such as <think>): user text can never inject a control token.
  // Invalid UTF-8 is refused (with the byte offset of the first bad byte) rather than repaired:
  // the caller (server: request JSON) decides whether to reject or replace.
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const = 0;
  // Ids -> text (bytes; may be invalid UTF-8 mid-character if ids cut a character). Throws
  // lilac::Error on an id outside [0, size()).
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;

  // Number of ids (the last real id + 1); the model's vocab may be padded beyond it.
  virtual int32_t size() const = 0;
  // The id of an exact token string (e.g. "<|im_end|>"), if any. The string is the token's bytes
  // (as token_bytes gives them, " hello", not the file's byte-level spelling "Ġhello"); added
  // tokens are searched first.
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;
  // The bytes one token stands for.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  // Stop ids: generation_config.json eos_token_id (list or int), else tokenizer_config's eos.
  virtual const std::vector<int32_t>& eos_ids() const = 0;
};

// Streaming detokenizer: feed ids one at a time; text comes out only once it is complete UTF-8.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tok, bool skip_special);
  // The newly completed text (possibly empty); always valid UTF-8: ill-formed bytes that can
  // never complete become U+FFFD, an unfinished tail waits for the next id. Throws lilac::Error
  // on an id outside [0, size()).
  std::string push(int32_t id);
  std::string flush();  // whatever is pending (invalid tails become U+FFFD)

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace lilac
