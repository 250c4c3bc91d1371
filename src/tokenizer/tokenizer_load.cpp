// Building a BpeTokenizer from tokenizer.json (+ tokenizer_config.json, generation_config.json,
// config.json). Only what byte-level BPE tokenizers of the Qwen family use is accepted; anything
// else is refused by name rather than silently encoded differently from HF.
#include <filesystem>

#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/tokenizer_file.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace lilac {
namespace tok {
namespace {

using json = nlohmann::json;

// Ids beyond this are refused: id_bytes_ is a dense table.
constexpr int64_t kMaxId = 1 << 24;

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

bool is_empty_str(const json& j) {
  return j.is_null() || (j.is_string() && j.get<std::string>().empty());
}

void load_normalizer(BpeTokenizer& t, const json& n, const std::string& src) {
  if (n.is_null()) return;
  std::string type = type_of(n);
  if (type == "NFC") {
    t.nfc = true;
  } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const json& sub : n["normalizers"]) load_normalizer(t, sub, src);
  } else {
    fail("{}: unsupported normalizer {} (only NFC is implemented)", src, n.dump());
  }
}

void check_byte_level(const json& p, const std::string& src, const char* what) {
  if (p.value("add_prefix_space", false))
    fail("{}: unsupported {}: ByteLevel with add_prefix_space", src, what);
}

// Sets t.splitter from the pre_tokenizer; `regex_override` replaces a Split regex.
void load_pre_tokenizer(BpeTokenizer& t, const json& p, const std::string& src,
                        const std::string& regex_override) {
  std::vector<const json*> parts;
  if (type_of(p) == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
      fail("{}: pre_tokenizer Sequence without pretokenizers", src);
    for (const json& sub : p["pretokenizers"]) parts.push_back(&sub);
  } else if (!p.is_null()) {
    parts.push_back(&p);
  }
  bool byte_level = false;
  std::string pattern;
  for (const json* part : parts) {
    std::string type = type_of(*part);
    if (type == "Split") {
      if (!pattern.empty()) fail("{}: unsupported pre_tokenizer: more than one Split", src);
      const json& pat = part->value("pattern", json());
      if (!pat.is_object() || !pat.contains("Regex") || !pat["Regex"].is_string())
        fail("{}: unsupported Split pattern {} (only Regex)", src, pat.dump());
      if (part->value("behavior", std::string()) != "Isolated" || part->value("invert", false))
        fail("{}: unsupported Split behaviour (only Isolated, not inverted)", src);
      pattern = pat["Regex"].get<std::string>();
    } else if (type == "ByteLevel") {
      check_byte_level(*part, src, "pre_tokenizer");
      byte_level = true;
      if (part->value("use_regex", true)) {
        if (!pattern.empty())
          fail("{}: unsupported pre_tokenizer: Split then a regex ByteLevel", src);
        pattern = kGpt2Regex;
      }
    } else {
      fail("{}: unsupported pre_tokenizer {}", src, part->dump());
    }
  }
  if (!byte_level) fail("{}: the pre_tokenizer has no ByteLevel step (byte-level BPE only)", src);
  if (!regex_override.empty()) pattern = regex_override;
  if (pattern.empty()) return;
  try {
    t.splitter = std::make_unique<RegexSplitter>(pattern);
  } catch (const Error& e) {
    fail("{}: {}", src, e.what());
  }
}

void load_model(BpeTokenizer& t, TokenizerFile& f, const std::string& src) {
  const json& m = f.rest.value("model", json());
  if (type_of(m) != "BPE") fail("{}: unsupported model type \"{}\" (only BPE)", src, type_of(m));
  if (!f.has_vocab) fail("{}: model.vocab is missing", src);
  if (!f.has_merges) fail("{}: model.merges is missing", src);
  if (!m.value("dropout", json()).is_null() && m["dropout"] != 0.0)
    fail("{}: unsupported BPE dropout", src);
  if (!m.value("unk_token", json()).is_null()) fail("{}: unsupported BPE unk_token", src);
  if (m.value("byte_fallback", false)) fail("{}: unsupported BPE byte_fallback", src);
  if (!is_empty_str(m.value("continuing_subword_prefix", json())) ||
      !is_empty_str(m.value("end_of_word_suffix", json())))
    fail("{}: unsupported BPE continuing_subword_prefix / end_of_word_suffix", src);
  t.ignore_merges = m.value("ignore_merges", false);

  const ByteLevel& bl = byte_level();
  int64_t max_id = -1;
  for (const auto& [tok, id] : f.vocab) max_id = std::max(max_id, id);
  if (max_id >= kMaxId) fail("{}: model.vocab id {} is too large", src, max_id);
  t.id_bytes_.assign(size_t(max_id + 1), std::string());
  std::vector<uint8_t> seen(size_t(max_id + 1), 0);
  for (auto& [tok, id] : f.vocab) {
    if (seen[id]) fail("{}: model.vocab: id {} is used twice", src, id);
    seen[id] = 1;
    bool mapped;
    t.id_bytes_[id] = bl.to_bytes(tok, &mapped);
    if (mapped && t.id_bytes_[id].size() == 1)
      t.bpe.set_byte_id(uint8_t(t.id_bytes_[id][0]), int32_t(id));
  }
  t.vocab.build(t.id_bytes_, seen);
  // Merges name tokens by their strings; the merged token is the concatenation (HF requires all
  // three in the vocab).
  uint32_t rank = 0;
  std::string ba, bb;
  for (const auto& [a, b] : f.merges) {
    ba = bl.to_bytes(a);
    bb = bl.to_bytes(b);
    int32_t ia = t.vocab.find(ba), ib = t.vocab.find(bb);
    ba += bb;
    int32_t im = t.vocab.find(ba);
    if (ia < 0 || ib < 0 || im < 0)
      fail("{}: model.merges[{}] (\"{}\", \"{}\") names a token that is not in the vocab", src,
           rank, a, b);
    t.bpe.add_merge(ia, ib, im, rank++);
  }
  t.bpe.finish();
  f.vocab.clear();
  f.merges.clear();
}

AddedToken parse_added(const json& a, const std::string& src) {
  if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
      !a.contains("content") || !a["content"].is_string())
    fail("{}: malformed added_tokens entry {}", src, a.dump());
  AddedToken t;
  int64_t id = a["id"].get<int64_t>();
  if (id < 0 || id >= kMaxId) fail("{}: added token id {} is out of range", src, id);
  t.id = int32_t(id);
  t.content = a["content"].get<std::string>();
  t.special = a.value("special", false);
  t.lstrip = a.value("lstrip", false);
  t.rstrip = a.value("rstrip", false);
  t.normalized = a.value("normalized", !t.special);
  if (a.value("single_word", false))
    fail("{}: unsupported added token option single_word (\"{}\")", src, t.content);
  return t;
}

void add_token(BpeTokenizer& t, AddedToken a) {
  if (size_t(a.id) >= t.id_bytes_.size()) t.id_bytes_.resize(size_t(a.id) + 1);
  if (a.normalized && t.nfc) a.content = unicode::nfc(a.content);
  t.id_bytes_[a.id] = a.content;
  t.added.push_back(std::move(a));
}

void finish_added(BpeTokenizer& t) {
  t.flags_.assign(t.id_bytes_.size(), 0);
  std::vector<const AddedToken*> raw, norm;
  for (const AddedToken& a : t.added) {
    t.flags_[a.id] = uint8_t(BpeTokenizer::kAdded | (a.special ? BpeTokenizer::kSpecial : 0));
    (a.normalized ? norm : raw).push_back(&a);
  }
  t.raw_matcher.build(raw);
  t.normalized_matcher.build(norm);
}

std::optional<json> read_optional_json(const std::string& path) {
  if (path.empty() || !std::filesystem::exists(path)) return std::nullopt;
  return read_json_file(path);
}

// eos: an int or a list of ints.
std::vector<int32_t> parse_eos_ids(const json& v, const std::string& src) {
  std::vector<int32_t> ids;
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= kMaxId)
      fail("{}: eos_token_id {} is not a valid token id", src, x.dump());
    ids.push_back(int32_t(x.get<int64_t>()));
  };
  if (v.is_array()) {
    for (const json& x : v) one(x);
  } else if (!v.is_null()) {
    one(v);
  }
  return ids;
}

}  // namespace

std::unique_ptr<Tokenizer> load_files(const TokenizerFiles& files);

std::unique_ptr<Tokenizer> load(const TokenizerFiles& files) {
  // nlohmann's accessors throw their own exceptions on wrongly typed fields.
  try {
    return load_files(files);
  } catch (const json::exception& e) {
    fail("{}: malformed tokenizer files: {}", files.tokenizer_json, e.what());
  }
}

std::unique_ptr<Tokenizer> load_files(const TokenizerFiles& files) {
  const std::string& src = files.tokenizer_json;
  auto t = std::make_unique<BpeTokenizer>();
  t->source = src;
  TokenizerFile f = parse_tokenizer_json(read_file_maybe_gz(src), src);
  load_normalizer(*t, f.rest.value("normalizer", json()), src);
  load_pre_tokenizer(*t, f.rest.value("pre_tokenizer", json()), src,
                     files.options.force_qwen35_regex ? kQwen35Regex : "");
  const json& dec = f.rest.value("decoder", json());
  if (!dec.is_null() && type_of(dec) != "ByteLevel")
    fail("{}: unsupported decoder {} (only ByteLevel)", src, dec.dump());
  load_model(*t, f, src);

  const json& added = f.rest.value("added_tokens", json::array());
  if (!added.is_array()) fail("{}: added_tokens is not an array", src);
  for (const json& a : added) add_token(*t, parse_added(a, src));

  std::optional<json> tc = read_optional_json(files.tokenizer_config);
  if (tc && tc->contains("added_tokens_decoder") && (*tc)["added_tokens_decoder"].is_object()) {
    // transformers adds these too; ones tokenizer.json already has keep its definition.
    for (const auto& [key, a] : (*tc)["added_tokens_decoder"].items()) {
      json entry = a;
      try {
        entry["id"] = std::stoll(key);
      } catch (const std::exception&) {
        fail("{}: added_tokens_decoder key \"{}\" is not an id", files.tokenizer_config, key);
      }
      AddedToken tok = parse_added(entry, files.tokenizer_config);
      bool known = std::any_of(t->added.begin(), t->added.end(),
                               [&](const AddedToken& x) { return x.id == tok.id; });
      if (!known) add_token(*t, std::move(tok));
    }
  }
  finish_added(*t);

  std::optional<json> gc = read_optional_json(files.generation_config);
  if (gc && gc->contains("eos_token_id"))
    t->eos_ = parse_eos_ids((*gc)["eos_token_id"], files.generation_config);
  if (t->eos_.empty() && tc && tc->contains("eos_token")) {
    const json& e = (*tc)["eos_token"];
    std::string name = e.is_string()                            ? e.get<std::string>()
                       : e.is_object() && e.contains("content") ? e["content"].get<std::string>()
                                                                : std::string();
    if (!name.empty()) {
      auto id = t->token_id(name);
      if (!id) fail("{}: eos_token \"{}\" is not a token", files.tokenizer_config, name);
      t->eos_.push_back(*id);
    }
  }
  return t;
}

bool wants_qwen35_regex(const std::string& model_type) {
  return model_type.rfind("qwen3_5", 0) == 0;
}

}  // namespace tok

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& tokenizer_json,
                                                const TokenizerOptions& options) {
  TokenizerFiles files;
  files.tokenizer_json = tokenizer_json;
  files.options = options;
  return from_files(files);
}

std::unique_ptr<Tokenizer> Tokenizer::from_files(const TokenizerFiles& files) {
  return tok::load(files);
}

std::unique_ptr<Tokenizer> Tokenizer::from_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  TokenizerFiles files;
  files.tokenizer_json = (fs::path(dir) / "tokenizer.json").string();
  if (!fs::exists(files.tokenizer_json)) fail("{}: no tokenizer.json in the model directory", dir);
  files.tokenizer_config = (fs::path(dir) / "tokenizer_config.json").string();
  files.generation_config = (fs::path(dir) / "generation_config.json").string();
  std::string config = (fs::path(dir) / "config.json").string();
  if (auto c = tok::read_optional_json(config)) {
    auto type_in = [](const nlohmann::json& j) {
      return j.is_object() && j.contains("model_type") && j["model_type"].is_string()
                 ? j["model_type"].get<std::string>()
                 : std::string();
    };
    std::string type = type_in(*c);
    if (type.empty() && c->contains("text_config")) type = type_in((*c)["text_config"]);
    files.options.force_qwen35_regex = tok::wants_qwen35_regex(type);
  }
  return from_files(files);
}

}  // namespace lilac
