// config.json -> ModelConfig. Accepts the variants of docs/model.md section 1: keys under
// text_config or at the top, rope keys under rope_parameters or at the top of text_config,
// layer_types or full_attention_interval.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/config.h"
#include "util/error.h"

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

struct Reader {
  const json& obj;
  const json* fallback;  // top-level object for keys older configs keep there
  const std::string& source;

  const json* find(const char* key) const {
    if (obj.contains(key)) return &obj[key];
    if (fallback && fallback->contains(key)) return &(*fallback)[key];
    return nullptr;
  }
  int64_t positive_int(const char* key) const {
    const json* v = find(key);
    if (!v) fail("{}: missing \"{}\"", source, key);
    if (!v->is_number_integer() || v->get<int64_t>() <= 0)
      fail("{}: \"{}\" must be a positive integer, got {}", source, key, v->dump());
    return v->get<int64_t>();
  }
  int64_t int_or(const char* key, int64_t dflt) const {
    const json* v = find(key);
    if (!v || v->is_null()) return dflt;
    if (!v->is_number_integer() || v->get<int64_t>() < 0)
      fail("{}: \"{}\" must be a non-negative integer, got {}", source, key, v->dump());
    return v->get<int64_t>();
  }
  double number_or(const json& o, const char* key, double dflt) const {
    if (!o.contains(key) || o[key].is_null()) return dflt;
    if (!o[key].is_number())
      fail("{}: \"{}\" must be a number, got {}", source, key, o[key].dump());
    return o[key].get<double>();
  }
};

void read_eos(const json& v, std::vector<int32_t>& out) {
  if (v.is_number_integer()) out.push_back(v.get<int32_t>());
  if (v.is_array())
    for (const auto& e : v)
      if (e.is_number_integer()) out.push_back(e.get<int32_t>());
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  json top = json::parse(json_text, nullptr, false);
  if (top.is_discarded() || !top.is_object()) fail("{}: not a JSON object", source);
  const json& text =
      top.contains("text_config") && top["text_config"].is_object() ? top["text_config"] : top;
  Reader r{text, &top, source};

  ModelConfig c;
  c.model_type = top.value("model_type", text.value("model_type", std::string("qwen3_5_moe")));
  c.hidden = r.positive_int("hidden_size");
  c.layers = r.positive_int("num_hidden_layers");
  c.vocab = r.positive_int("vocab_size");
  c.heads = r.positive_int("num_attention_heads");
  c.kv_heads = r.positive_int("num_key_value_heads");
  c.head_dim = r.int_or("head_dim", 0);
  if (c.head_dim == 0) c.head_dim = c.hidden / c.heads;
  c.gdn_key_heads = r.positive_int("linear_num_key_heads");
  c.gdn_value_heads = r.positive_int("linear_num_value_heads");
  c.gdn_key_dim = r.positive_int("linear_key_head_dim");
  c.gdn_value_dim = r.positive_int("linear_value_head_dim");
  c.gdn_conv_kernel = r.int_or("linear_conv_kernel_dim", 4);
  c.experts = r.positive_int("num_experts");
  c.experts_per_token = r.positive_int("num_experts_per_tok");
  c.expert_intermediate = r.positive_int("moe_intermediate_size");
  c.shared_intermediate = r.positive_int("shared_expert_intermediate_size");
  c.mtp_layers = r.int_or("mtp_num_hidden_layers", 0);
  c.max_position_embeddings = r.int_or("max_position_embeddings", 262144);
  {
    const json* eps = r.find("rms_norm_eps");
    c.rms_eps = eps && eps->is_number() ? eps->get<float>() : 1e-6f;
  }
  {
    const json* tie = r.find("tie_word_embeddings");
    c.tie_word_embeddings = tie && tie->is_boolean() && tie->get<bool>();
  }

  // RoPE: rope_parameters (new) or rope_scaling / top-level keys (old).
  const json* rope = nullptr;
  if (text.contains("rope_parameters") && text["rope_parameters"].is_object())
    rope = &text["rope_parameters"];
  c.rope_theta =
      float(r.number_or(rope ? *rope : text, "rope_theta", r.number_or(text, "rope_theta", 1e7)));
  c.partial_rotary_factor = float(r.number_or(rope ? *rope : text, "partial_rotary_factor",
                                              r.number_or(text, "partial_rotary_factor", 0.25)));
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
    int64_t interval = r.int_or("full_attention_interval", 4);
    if (interval <= 0) fail("{}: full_attention_interval must be positive", source);
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
        b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0)
      fail("{}: quantization_config.weight_block_size must be two positive integers", source);
    c.fp8_block_rows = b[0].get<int64_t>();
    c.fp8_block_cols = b[1].get<int64_t>();
    break;
  }

  if (text.contains("eos_token_id"))
    read_eos(text["eos_token_id"], c.eos_token_ids);
  else if (top.contains("eos_token_id"))
    read_eos(top["eos_token_id"], c.eos_token_ids);
  return c;
}

ModelConfig load_model_config(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  std::ifstream in(path);
  if (!in) fail("{}: cannot open (is {} a model directory?)", path, model_dir);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace lilac
