// Model discovery (--model, LILAC_MODEL, the Hugging Face cache, the demo model), sampling
// defaults from generation_config.json, and request validation details.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../test_data.h"
#include "runtime/model_setup.h"
#include "server/api_error.h"
#include "server/request.h"
#include "server/server.h"

namespace lilac::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Sets an environment variable for the scope; restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    had_ = std::getenv(name) != nullptr;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

void make_model_dir(const fs::path& p) {
  fs::create_directories(p);
  std::ofstream(p / "config.json") << "{}";
}

TEST(ModelSetup, DiscoveryOrder) {
  TempDir t;
  const fs::path hub = t.path() / "hf" / "hub";
  ScopedEnv home("HF_HOME", (t.path() / "hf").string());
  ScopedEnv hub_cache("HF_HUB_CACHE", "");
  unsetenv("HF_HUB_CACHE");
  ScopedEnv model_env("LILAC_MODEL", "");
  unsetenv("LILAC_MODEL");
  EXPECT_EQ(runtime::hf_hub_cache(), hub.string());
  // Nothing configured, nothing cached: the demo model.
  auto c = runtime::choose_model("");
  EXPECT_EQ(c.source, runtime::ModelSource::Demo);
  EXPECT_TRUE(c.demo);
  EXPECT_TRUE(fs::exists(fs::path(c.dir) / "model.safetensors"));
  // A cached snapshot wins over the demo; the newest of several (FP8 and mlx repos count too).
  const fs::path old_snap = hub / "models--Qwen--Qwen3.6-35B-A3B" / "snapshots" / "aaa";
  const fs::path new_snap =
      hub / "models--mlx-community--Qwen3.6-35B-A3B-4bit" / "snapshots" / "bbb";
  make_model_dir(old_snap);
  make_model_dir(new_snap);
  fs::create_directories(hub / "models--Qwen--Qwen3.6-35B-A3B-FP8" / "snapshots" /
                         "empty");  // no config
  fs::last_write_time(old_snap, fs::file_time_type::clock::now() - std::chrono::hours(5));
  c = runtime::choose_model("");
  EXPECT_EQ(c.source, runtime::ModelSource::HfCache);
  EXPECT_EQ(c.dir, new_snap.string());
  EXPECT_FALSE(c.demo);
  EXPECT_EQ(server::default_model_id(c.dir, false), "mlx-community/Qwen3.6-35B-A3B-4bit");
  // LILAC_MODEL wins over the cache, --model over everything.
  const fs::path env_dir = t.path() / "env-model";
  make_model_dir(env_dir);
  setenv("LILAC_MODEL", env_dir.string().c_str(), 1);
  c = runtime::choose_model("");
  EXPECT_EQ(c.source, runtime::ModelSource::Env);
  EXPECT_EQ(c.dir, env_dir.string());
  c = runtime::choose_model(data_path("tiny-a"));
  EXPECT_EQ(c.source, runtime::ModelSource::Flag);
  EXPECT_EQ(server::default_model_id(c.dir, false), "tiny-a");
  EXPECT_THROW(runtime::choose_model((t.path() / "nothing").string()), Error);
}

TEST(ModelSetup, GenerationDefaults) {
  TempDir t;
  std::ofstream(t.path() / "generation_config.json")
      << R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "presence_penalty": 1.5, "eos_token_id": [1, 2]})";
  auto p = runtime::load_generation_defaults(t.str());
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.presence_penalty, 1.5f);
  EXPECT_FLOAT_EQ(p.min_p, 0.0f);
  std::ofstream(t.path() / "generation_config.json")
      << R"({"do_sample": false, "temperature": 0.6})";
  EXPECT_TRUE(runtime::load_generation_defaults(t.str()).greedy());
  std::ofstream(t.path() / "generation_config.json") << R"({"temperature": "hot"})";
  EXPECT_THROW(runtime::load_generation_defaults(t.str()), Error);
  // The request overrides the defaults field by field.
  SamplingParams d;
  d.temperature = 0.6f;
  d.top_k = 20;
  auto r = server::parse_chat_request(
      json::parse(R"({"messages":[{"role":"user","content":"x"}],"top_k":5,"seed":-3})"), d);
  EXPECT_FLOAT_EQ(r.common.sampling.temperature, 0.6f);
  EXPECT_EQ(r.common.sampling.top_k, 5);
  EXPECT_TRUE(r.common.seed_given);
}

TEST(Request, NormalisesMessagesAndChoices) {
  SamplingParams d;
  auto r = server::parse_chat_request(json::parse(R"({
    "messages": [
      {"role": "developer", "content": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "and kind"}]},
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": null, "reasoning": "thinking",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "g"}}],
    "tool_choice": {"type": "function", "function": {"name": "g"}},
    "max_tokens": 10, "max_completion_tokens": 20, "stop": "END",
    "chat_template_kwargs": {"enable_thinking": false, "custom": 1}, "reasoning_effort": "high",
    "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3})"),
                                      d);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[0]["content"],
            "be brief\nand kind\n\nYou must call the function `g` in your answer.");
  EXPECT_EQ(r.messages[2]["reasoning_content"], "thinking");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"], json::parse(R"({"a": 1})"));
  EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["function"]["name"], "g");
  EXPECT_EQ(r.request_tools.size(), 2u);
  EXPECT_EQ(*r.common.max_tokens, 20);
  EXPECT_EQ(r.common.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.chat.enable_thinking, false);
  EXPECT_EQ(r.chat.extra["custom"], 1);
  EXPECT_TRUE(r.common.stream && r.common.include_usage && r.common.logprobs);
  EXPECT_EQ(r.common.sampling.top_logprobs, 3);
  try {
    server::parse_chat_request(
        json::parse(R"({"messages":[{"role":"user","content":"x"}],"temperature":"x"})"), d);
    FAIL();
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "temperature");
  }
  auto none = server::parse_chat_request(
      json::parse(
          R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],
                     "tool_choice":"none","reasoning_effort":"none"})"),
      d);
  EXPECT_TRUE(none.tools.empty());
  EXPECT_EQ(none.chat.enable_thinking, false);
}

}  // namespace
}  // namespace lilac::test
