// config.json -> ModelConfig. Accepts the variants of docs/model.md section 1: keys under
// text_config or at the top, rope keys under rope_parameters or at the top of text_config,
// layer_types or full_attention_interval.
#include <cmath>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "util/error.h"
#include "util/json_parse.h"
#include "util/mapped_file.h"

namespace lilac {

using nlohmann::json;

int64_t ModelConfig::count_layers(LayerType t) const {
  int64_t n = 0;
  for (auto l : layer_types) n += (l == t);
  return n;
}

int64_t ModelConfig::slot_of_layer(int64_t i) const {
  int64_t n = 0;
  for (int64_t j = 0; j < i; ++j) n += (layer_types[size_t(j)] == layer_types[size_t(i)]);
  return n;
}

std::string ModelConfig::summary() const {
  return fmt::format(
      "{}: hidden {}, {} layers ({} Gated DeltaNet, {} full attention), vocab {}, attention "
      "{}q/{}kv "
      "x {} (rotary {}), GDN {}k/{}v x {}/{}, {} experts top-{} (I={}, shared {}), mtp {}",
      model_type, hidden, layers, count_layers(LayerType::GatedDeltaNet),
      count_layers(LayerType::FullAttention), vocab, heads, kv_heads, head_dim, rotary_dim,
      gdn_key_heads, gdn_value_heads, gdn_key_dim, gdn_value_dim, experts, experts_per_token,
      expert_intermediate, shared_intermediate, mtp_layers);
}

namespace {

// Every size is checked against a range before anything is allocated from it: the bounds are
// far beyond any real model (Qwen3.6-35B-A3B: hidden 2048, 40 layers, vocab 248,320, 256
// experts), but small enough that the products the loader and the backends form (rows x cols,
// experts x rows x cols, layers x heads x dims) fit in int64 with room to spare.
struct Reader {
  const json& obj;
  const json* fallback;  // top-level object for keys older configs keep there
  const std::string& source;

  const json* find(const char* key) const {
    if (obj.contains(key)) return &obj[key];
    if (fallback && fallback->contains(key)) return &(*fallback)[key];
    return nullptr;
  }
  int64_t checked_int(const char* key, const json& v, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) ||
        v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      fail("{}: \"{}\" must be an integer from {} to {}, got {}", source, key, lo, hi, v.dump());
    return v.get<int64_t>();
  }
  int64_t int_in(const char* key, int64_t lo, int64_t hi) const {
    const json* v = find(key);
    if (!v) fail("{}: missing \"{}\"", source, key);
    return checked_int(key, *v, lo, hi);
  }
  int64_t int_or(const char* key, int64_t dflt, int64_t lo, int64_t hi) const {
    const json* v = find(key);
    if (!v || v->is_null()) return dflt;
    return checked_int(key, *v, lo, hi);
  }
  // A finite number in (lo, hi]: rms_norm_eps of 0 or -1 or a rope_theta of 0 load fine and
  // then give all-NaN logits.
  double number_in(const json& o, const char* key, double dflt, double lo, double hi) const {
    if (!o.contains(key) || o[key].is_null()) return dflt;
    if (!o[key].is_number())
      fail("{}: \"{}\" must be a number, got {}", source, key, o[key].dump());
    const double x = o[key].get<double>();
    if (!std::isfinite(x) || !(x > lo) || x > hi)
      fail("{}: \"{}\" must be greater than {} and at most {}, got {}", source, key, lo, hi,
           o[key].dump());
    return x;
  }
};

void read_eos(const json& v, int64_t vocab, const std::string& source, std::vector<int32_t>& out) {
  auto one = [&](const json& e) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab)
      fail("{}: \"eos_token_id\" holds {}, not a token id (0 to {})", source, e.dump(), vocab - 1);
    out.push_back(int32_t(e.get<int64_t>()));
  };
  if (v.is_null()) return;
  if (v.is_array()) {
    for (const auto& e : v) one(e);
  } else {
    one(v);
  }
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  json top;
  try {
    top = parse_json(json_text);
  } catch (const JsonParseError& e) {
    fail("{}: not valid JSON: {}{}", source, e.what(),
         e.field.empty() ? "" : " (at " + e.field + ")");
  }
  if (!top.is_object()) fail("{}: not a JSON object", source);
  const json& text =
      top.contains("text_config") && top["text_config"].is_object() ? top["text_config"] : top;
  Reader r{text, &top, source};

  ModelConfig c;
  {
    const json* type = text.contains("model_type") ? &text["model_type"] : nullptr;
    if (top.contains("model_type")) type = &top["model_type"];
    if (type && !type->is_string()) fail("{}: \"model_type\" must be a string", source);
    c.model_type = type ? type->get<std::string>() : "qwen3_5_moe";
  }
  constexpr int64_t kDims = 1 << 16, kHeads = 1 << 10, kHeadDim = 1 << 12;
  c.hidden = r.int_in("hidden_size", 1, kDims);
  c.layers = r.int_in("num_hidden_layers", 1, 1024);
  c.vocab = r.int_in("vocab_size", 1, 1 << 22);
  c.heads = r.int_in("num_attention_heads", 1, kHeads);
  c.kv_heads = r.int_in("num_key_value_heads", 1, kHeads);
  c.head_dim = r.int_or("head_dim", 0, 0, kHeadDim);
  if (c.head_dim == 0) c.head_dim = c.hidden / c.heads;
  if (c.head_dim < 1)
    fail("{}: head_dim (hidden_size {} / num_attention_heads {}) is 0", source, c.hidden, c.heads);
  c.gdn_key_heads = r.int_in("linear_num_key_heads", 1, kHeads);
  c.gdn_value_heads = r.int_in("linear_num_value_heads", 1, kHeads);
  c.gdn_key_dim = r.int_in("linear_key_head_dim", 1, kHeadDim);
  c.gdn_value_dim = r.int_in("linear_value_head_dim", 1, kHeadDim);
  c.gdn_conv_kernel = r.int_or("linear_conv_kernel_dim", 4, 1, 64);
  c.experts = r.int_in("num_experts", 1, 4096);
  c.experts_per_token = r.int_in("num_experts_per_tok", 1, 4096);
  c.expert_intermediate = r.int_in("moe_intermediate_size", 1, 1 << 17);
  c.shared_intermediate = r.int_in("shared_expert_intermediate_size", 1, 1 << 17);
  c.mtp_layers = r.int_or("mtp_num_hidden_layers", 0, 0, 64);
  c.max_position_embeddings = r.int_or("max_position_embeddings", 262144, 1, 1 << 24);
  c.rms_eps =
      float(r.number_in(text.contains("rms_norm_eps") ? text : top, "rms_norm_eps", 1e-6, 0, 0.1));
  {
    const json* tie = r.find("tie_word_embeddings");
    if (tie && !tie->is_null() && !tie->is_boolean())
      fail("{}: \"tie_word_embeddings\" must be true or false, got {}", source, tie->dump());
    c.tie_word_embeddings = tie && tie->is_boolean() && tie->get<bool>();
  }

  // RoPE: rope_parameters (new) or rope_scaling / top-level keys (old).
  const json* rope = nullptr;
  if (text.contains("rope_parameters") && text["rope_parameters"].is_object())
    rope = &text["rope_parameters"];
  const json& rope_scope = rope && rope->contains("rope_theta") ? *rope : text;
  c.rope_theta = float(r.number_in(rope_scope, "rope_theta", 1e7, 0, 1e12));
  const json& factor_scope = rope && rope->contains("partial_rotary_factor") ? *rope : text;
  c.partial_rotary_factor = float(r.number_in(factor_scope, "partial_rotary_factor", 0.25, 0, 1));
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    fail("{}: partial_rotary_factor {} must be in (0, 1]", source, c.partial_rotary_factor);
  c.rotary_dim = int64_t(double(c.head_dim) * c.partial_rotary_factor);
  if (c.rotary_dim % 2 != 0 || c.rotary_dim <= 0)
    fail("{}: rotary dim {} (head_dim {} x {}) must be even and positive", source, c.rotary_dim,
         c.head_dim, c.partial_rotary_factor);

  // Layer types.
  if (text.contains("layer_types") && text["layer_types"].is_array()) {
    const json& lt = text["layer_types"];
    if (int64_t(lt.size()) != c.layers)
      fail("{}: layer_types has {} entries but num_hidden_layers is {}", source, lt.size(),
           c.layers);
    for (size_t i = 0; i < lt.size(); ++i) {
      std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t == "linear_attention")
        c.layer_types.push_back(LayerType::GatedDeltaNet);
      else if (t == "full_attention")
        c.layer_types.push_back(LayerType::FullAttention);
      else
        fail("{}: layer_types[{}] = {} is neither linear_attention nor full_attention", source, i,
             lt[i].dump());
    }
  } else {
    int64_t interval = r.int_or("full_attention_interval", 4, 1, 1024);
    for (int64_t i = 0; i < c.layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::FullAttention
                                                      : LayerType::GatedDeltaNet);
  }

  if (c.heads % c.kv_heads != 0)
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source, c.heads,
         c.kv_heads);
  if (c.gdn_value_heads % c.gdn_key_heads != 0)
    fail("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", source,
         c.gdn_value_heads, c.gdn_key_heads);
  if (c.experts_per_token > c.experts)
    fail("{}: num_experts_per_tok {} exceeds num_experts {}", source, c.experts_per_token,
         c.experts);
  if (c.gdn_conv_kernel < 1) fail("{}: linear_conv_kernel_dim must be >= 1", source);

  // FP8 block size: quantization_config.weight_block_size, at the top or in text_config.
  for (const json* scope : std::initializer_list<const json*>{&top, &text}) {
    if (!scope->contains("quantization_config")) continue;
    const json& q = (*scope)["quantization_config"];
    if (!q.is_object() || !q.contains("weight_block_size")) continue;
    const json& b = q["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
        b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0 || b[0].get<int64_t>() > kDims ||
        b[1].get<int64_t>() > kDims)
      fail("{}: quantization_config.weight_block_size must be two integers from 1 to {}", source,
           kDims);
    c.fp8_block_rows = b[0].get<int64_t>();
    c.fp8_block_cols = b[1].get<int64_t>();
    break;
  }

  if (text.contains("eos_token_id"))
    read_eos(text["eos_token_id"], c.vocab, source, c.eos_token_ids);
  else if (top.contains("eos_token_id"))
    read_eos(top["eos_token_id"], c.vocab, source, c.eos_token_ids);
  return c;
}

ModelConfig load_model_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  return parse_model_config(read_small_file(path, 16 << 20), path);
}

}  // namespace lilac
