// Checkpoint directories: both expert layouts bind, and every mismatch between files, index and
// config is reported naming the tensor (written into temp copies of the tiny-a fixture).
#include "io/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_data.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace lilac::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string slurp(const std::string& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A writable copy of a fixture model directory.
struct ModelCopy {
  TempDir tmp;
  std::string dir;
  explicit ModelCopy(const std::string& fixture) : dir(tmp.str("model")) {
    fs::copy(data_path(fixture), dir, fs::copy_options::recursive);
    for (auto& e : fs::directory_iterator(dir))
      fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_write,
                      fs::perm_options::add);
  }
  // Rewrites one safetensors file through `edit`, which may drop, add or reshape tensors.
  void rewrite(const std::string& file,
               const std::function<void(std::vector<TensorToWrite>&)>& edit) {
    std::string path = dir + "/" + file;
    auto f = SafetensorsFile::open(path);
    std::vector<std::vector<uint8_t>> keep;
    std::vector<TensorToWrite> ts;
    for (const auto& t : f->tensors()) {
      keep.emplace_back(f->data(t), f->data(t) + t.nbytes());
      ts.push_back({t.name, t.dtype, t.shape, keep.back()});
    }
    edit(ts);
    std::string tmp_path = path + ".new";
    write_safetensors(tmp_path, ts, f->metadata());
    f.reset();
    fs::rename(tmp_path, path);
  }
  void edit_index(const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(slurp(dir + "/model.safetensors.index.json"));
    edit(j);
    std::ofstream(dir + "/model.safetensors.index.json") << j.dump(2);
  }
  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(slurp(dir + "/config.json"));
    edit(j);
    std::ofstream(dir + "/config.json") << j.dump(2);
  }
};

std::string load_error(const std::string& dir) {
  try {
    load_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const char* kShard1 = "model-00001-of-00002.safetensors";
const char* kShard2 = "model-00002-of-00002.safetensors";
const std::string kQkv0 = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight";

TEST(Config, ReadsTinyA) {
  ModelConfig c = load_model_config(data_path("tiny-a"));
  EXPECT_EQ(c.hidden, 128);
  EXPECT_EQ(c.layers, 4);
  EXPECT_EQ(c.vocab, 512);
  EXPECT_EQ(c.layer_types[3], LayerType::FullAttention);
  EXPECT_EQ(c.layer_types[0], LayerType::GatedDeltaNet);
  EXPECT_EQ(c.rotary_dim, 16);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e7f);
  EXPECT_EQ(c.gdn_conv_channels(), 256);
  EXPECT_EQ(c.experts_per_token, 4);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{511});
  EXPECT_EQ(c.slot_of_layer(2), 2);
  EXPECT_EQ(c.slot_of_layer(3), 0);
}

TEST(Config, OldStyleKeysAndInterval) {
  // rope keys at the top of text_config, no layer_types: full attention every 4th layer.
  auto c = parse_model_config(
      R"({"text_config": {"hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 100,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rope_theta": 5000.0,
    "partial_rotary_factor": 0.5, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32}})",
      "cfg");
  EXPECT_FLOAT_EQ(c.rope_theta, 5000.f);
  EXPECT_EQ(c.rotary_dim, 16);
  ASSERT_EQ(c.layer_types.size(), 8u);
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(c.layer_types[size_t(i)],
              (i + 1) % 4 == 0 ? LayerType::FullAttention : LayerType::GatedDeltaNet);
}

TEST(Config, Errors) {
  EXPECT_THAT(
      [] {
        try {
          parse_model_config("{not json", "cfg.json");
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      HasSubstr("cfg.json"));
  ModelCopy m("tiny-a");
  m.edit_config([](auto& j) { j["text_config"].erase("hidden_size"); });
  EXPECT_THAT(load_error(m.dir), AllOf(HasSubstr("config.json"), HasSubstr("hidden_size")));
  m.edit_config([](auto& j) {
    j["text_config"]["hidden_size"] = 128;
    j["text_config"]["layer_types"][1] = "sliding";
  });
  EXPECT_THAT(load_error(m.dir), HasSubstr("layer_types[1]"));
  m.edit_config([](auto& j) {
    j["text_config"]["layer_types"][1] = "linear_attention";
    j["text_config"]["num_key_value_heads"] = 3;
  });
  EXPECT_THAT(load_error(m.dir), HasSubstr("not a multiple"));
}

TEST(Checkpoint, BothLayoutsBind) {
  auto hub = load_model(data_path("tiny-a"));
  auto per = load_model(data_path("tiny-a-per-expert"));
  EXPECT_EQ(hub->report.layout, ExpertLayout::Fused);
  EXPECT_EQ(per->report.layout, ExpertLayout::PerExpert);
  EXPECT_EQ(hub->checkpoint->format(), WeightFormat::BF16);
  EXPECT_EQ(hub->report.parameters, per->report.parameters);
  EXPECT_EQ(hub->checkpoint->files().size(), 2u);
  // Vision tensors are skipped, not bound.
  EXPECT_THAT(hub->report.notes.front(), HasSubstr("vision"));
  // Expert 5's gate rows are the same numbers in both layouts.
  const auto& a = hub->weights.layers[1].moe.experts[5];
  const auto& b = per->weights.layers[1].moe.experts[5];
  EXPECT_EQ(0, std::memcmp(a.gate.data, b.gate.data, size_t(a.gate.numel()) * 2));
  EXPECT_EQ(0, std::memcmp(a.up.data, b.up.data, size_t(a.up.numel()) * 2));
  EXPECT_EQ(0, std::memcmp(a.down.data, b.down.data, size_t(a.down.numel()) * 2));
}

TEST(Checkpoint, MissingShard) {
  ModelCopy m("tiny-a");
  fs::remove(m.dir + "/" + kShard2);
  EXPECT_THAT(load_error(m.dir), AllOf(HasSubstr("missing shard"), HasSubstr(kShard2)));
}

TEST(Checkpoint, TruncatedShard) {
  ModelCopy m("tiny-a");
  fs::resize_file(m.dir + "/" + kShard1, fs::file_size(m.dir + "/" + kShard1) - 100);
  EXPECT_THAT(load_error(m.dir), AllOf(HasSubstr(kShard1), HasSubstr("truncated")));
}

TEST(Checkpoint, NoWeightsAtAll) {
  TempDir t;
  std::ofstream(t.str("config.json")) << slurp(data_path("tiny-a/config.json"));
  EXPECT_THAT(load_error(t.str()), HasSubstr("no model.safetensors"));
  EXPECT_THAT(load_error(t.str("nowhere")), HasSubstr("config.json"));
}

TEST(Checkpoint, BrokenIndex) {
  ModelCopy m("tiny-a");
  std::ofstream(m.dir + "/model.safetensors.index.json") << "{\"weight_map\": ";
  EXPECT_THAT(load_error(m.dir), AllOf(HasSubstr("index.json"), HasSubstr("not valid JSON")));
}

TEST(Checkpoint, IndexNamesTensorTheShardLacks) {
  ModelCopy m("tiny-a");
  m.edit_index([](auto& j) { j["weight_map"]["model.language_model.extra.weight"] = kShard1; });
  EXPECT_THAT(load_error(m.dir), AllOf(HasSubstr("extra.weight"), HasSubstr("does not hold")));
}

TEST(Checkpoint, ShardHoldsTensorTheIndexLacks) {
  ModelCopy m("tiny-a");
  m.edit_index([](auto& j) { j["weight_map"].erase(kQkv0); });
  EXPECT_THAT(load_error(m.dir), AllOf(HasSubstr(kQkv0), HasSubstr("does not list")));
}

TEST(Checkpoint, TensorInTwoShards) {
  ModelCopy m("tiny-a");
  m.rewrite(kShard2, [](auto& ts) {
    static std::vector<uint8_t> bytes(256 * 128 * 2);
    ts.push_back({kQkv0, DType::BF16, {256, 128}, bytes});
  });
  // The index lists it in shard 1 only; the check for duplicates across shards fires first.
  EXPECT_THAT(load_error(m.dir), AllOf(HasSubstr(kQkv0), HasSubstr("appears in both")));
}

TEST(Checkpoint, MissingTensor) {
  ModelCopy m("tiny-a-per-expert");
  const std::string gone = "model.language_model.layers.2.mlp.experts.7.up_proj.weight";
  m.rewrite("model.safetensors",
            [&](auto& ts) { std::erase_if(ts, [&](auto& t) { return t.name == gone; }); });
  EXPECT_THAT(load_error(m.dir),
              AllOf(HasSubstr("missing tensor"), HasSubstr("layers.2.mlp.experts.7.up_proj")));
}

TEST(Checkpoint, UnexpectedTensor) {
  ModelCopy m("tiny-a-per-expert");
  std::vector<uint8_t> bytes(128 * 2);
  m.rewrite("model.safetensors", [&](auto& ts) {
    ts.push_back({"model.language_model.layers.0.mystery.weight", DType::BF16, {128}, bytes});
  });
  EXPECT_THAT(load_error(m.dir),
              AllOf(HasSubstr("unexpected tensor"), HasSubstr("layers.0.mystery.weight")));
}

TEST(Checkpoint, ShapeAgainstConfig) {
  ModelCopy m("tiny-a-per-expert");
  m.edit_config([](auto& j) { j["text_config"]["moe_intermediate_size"] = 32; });
  std::string err = load_error(m.dir);
  EXPECT_THAT(err, AllOf(HasSubstr("experts.0.gate_proj.weight"),
                         HasSubstr("shape [64, 128], expected [32, 128]")));
}

TEST(Checkpoint, WrongDtype) {
  ModelCopy m("tiny-a-per-expert");
  m.rewrite("model.safetensors", [&](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.language_model.norm.weight") t.dtype = DType::I16;
  });
  EXPECT_THAT(load_error(m.dir),
              AllOf(HasSubstr("model.language_model.norm.weight"), HasSubstr("dtype I16")));
}

TEST(Checkpoint, ShapeDiffersFromConfigForFusedExperts) {
  ModelCopy m("tiny-a");
  m.edit_config([](auto& j) { j["text_config"]["num_experts"] = 8; });
  EXPECT_THAT(load_error(m.dir),
              AllOf(HasSubstr("gate_up_proj"), HasSubstr("expected [8, 128, 128]")));
}

TEST(Checkpoint, F32AndF16WeightsAccepted) {
  // Rewrite a matrix as F32 and a norm as F16 with the same values: the model must load.
  ModelCopy m("tiny-a-per-expert");
  std::vector<std::vector<uint8_t>> keep;
  m.rewrite("model.safetensors", [&](auto& ts) {
    for (auto& t : ts) {
      if (t.name == "model.language_model.layers.0.linear_attn.out_proj.weight") {
        std::vector<uint8_t> b(t.bytes.size() * 2);
        for (size_t i = 0; i < t.bytes.size() / 2; ++i) {
          uint32_t u = uint32_t(t.bytes[2 * i] | (t.bytes[2 * i + 1] << 8)) << 16;
          std::memcpy(&b[4 * i], &u, 4);
        }
        keep.push_back(std::move(b));
        t.dtype = DType::F32;
        t.bytes = keep.back();
      }
    }
  });
  auto model = load_model(m.dir);
  EXPECT_EQ(model->weights.layers[0].gdn.out_proj.dtype, DType::F32);
}

TEST(Checkpoint, MtpHeadLoadsWhenPresent) {
  // The MTP head (docs/model.md section 8): fc [H, 2H], three norms, one full-attention decoder
  // layer with MoE under mtp.layers.0. Built here from tiny-a's own layer-3 tensors (per-expert
  // layout).
  ModelCopy m("tiny-a-per-expert");
  std::vector<std::vector<uint8_t>> keep;
  m.rewrite("model.safetensors", [&](auto& ts) {
    const std::string prefix = "model.language_model.layers.3.";
    std::vector<TensorToWrite> extra;
    for (const auto& t : ts)
      if (t.name.starts_with(prefix))
        extra.push_back(
            {"mtp.layers.0." + t.name.substr(prefix.size()), t.dtype, t.shape, t.bytes});
    keep.emplace_back(size_t(128 * 256 * 2), uint8_t(0));
    extra.push_back({"mtp.fc.weight", DType::BF16, {128, 256}, keep.back()});
    keep.emplace_back(size_t(128 * 2), uint8_t(0));
    for (const char* n :
         {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"})
      extra.push_back({n, DType::BF16, {128}, keep.back()});
    ts.insert(ts.end(), extra.begin(), extra.end());
  });
  auto model = load_model(m.dir);
  ASSERT_TRUE(model->weights.mtp.has_value());
  ASSERT_EQ(model->weights.mtp->layers.size(), 1u);
  EXPECT_EQ(model->weights.mtp->layers[0].type, LayerType::FullAttention);
  EXPECT_EQ(model->weights.mtp->fc.cols, 256);
  EXPECT_EQ(model->weights.mtp->layers[0].moe.experts.size(), 16u);
  EXPECT_FLOAT_EQ(model->weights.mtp->final_norm_scale[0], 1.0f);  // stored 0, zero-centred: 1 + w
  // A partial MTP head is a problem named by tensor, not a silent skip.
  m.rewrite("model.safetensors", [&](auto& ts) {
    std::erase_if(ts, [](auto& t) { return t.name == "mtp.norm.weight"; });
  });
  EXPECT_THAT(load_error(m.dir), AllOf(HasSubstr("missing tensor"), HasSubstr("mtp.norm.weight")));
}

}  // namespace
}  // namespace lilac::test
