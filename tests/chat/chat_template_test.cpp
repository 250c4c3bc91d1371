#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "../test_data.h"
#include "chat/chat_template.h"
#include "util/error.h"

namespace lilac {
extern const std::string_view kBuiltinQwen36Template;  // generated from the .jinja at build time
}

namespace lilac::test {
namespace {

using ojson = nlohmann::ordered_json;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << path;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ChatOptions options_of(const ojson& c) {
  ChatOptions o;
  o.add_generation_prompt = c.value("add_generation_prompt", false);
  if (c.contains("enable_thinking")) o.enable_thinking = c["enable_thinking"].get<bool>();
  o.preserve_thinking = c.value("preserve_thinking", false);
  return o;
}

void check_golden(const std::string& variant) {
  std::string dir = data_path("tokenizer/");
  auto tmpl =
      ChatTemplate::from_string(slurp(dir + "chat_template_" + variant + ".jinja"), variant);
  ojson golden = ojson::parse(slurp(dir + "chat-golden-" + variant + ".json"));
  ASSERT_EQ(golden["cases"].size(), 15u);
  for (const ojson& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ojson tools = c.contains("tools") ? c["tools"] : ojson();
    EXPECT_EQ(tmpl->render(c["messages"], tools, options_of(c)), c["rendered"].get<std::string>());
  }
}

TEST(ChatTemplate, GoldenQwen36) {
  check_golden("qwen36");
}
TEST(ChatTemplate, GoldenQwen35) {
  check_golden("qwen35");
}

std::string error_of(const ChatTemplate& t, const ojson& messages, const ojson& tools = ojson(),
                     ChatOptions o = {}) {
  try {
    t.render(messages, tools, o);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for " << messages.dump();
  return "";
}

bool contains(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}

TEST(ChatTemplate, TemplateRaisedErrorsAreClear) {
  auto t = ChatTemplate::builtin_qwen36();
  EXPECT_TRUE(contains(error_of(*t, ojson::array()), "No messages provided."));
  EXPECT_TRUE(contains(error_of(*t, ojson::parse(R"([{"role": "system", "content": "s"}])")),
                       "No user query found in messages."));
  EXPECT_TRUE(contains(
      error_of(*t, ojson::parse(
                       R"([{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}])")),
      "No user query found in messages."));
  EXPECT_TRUE(contains(
      error_of(*t,
               ojson::parse(
                   R"([{"role": "user", "content": "q"}, {"role": "system", "content": "late"}])")),
      "System message must be at the beginning."));
  EXPECT_TRUE(contains(
      error_of(*t, ojson::parse(
                       R"([{"role": "user", "content": "q"}, {"role": "robot", "content": "x"}])")),
      "Unexpected message role."));
  // raise_exception's message comes first, then where it was raised.
  EXPECT_EQ(error_of(*t, ojson::array()),
            "No messages provided. (raised by builtin Qwen3.6 chat template line 43)");
}

TEST(ChatTemplate, BadRequestsNameTheField) {
  auto t = ChatTemplate::builtin_qwen36();
  EXPECT_EQ(error_of(*t, ojson::parse(R"({"role": "user"})")), "messages must be an array");
  EXPECT_EQ(error_of(*t, ojson::parse(R"([42])")), "messages[0] must be an object");
  EXPECT_EQ(error_of(*t, ojson::parse(R"([{"content": "x"}])")),
            "messages[0].role must be a string");
  EXPECT_EQ(error_of(*t, ojson::parse(R"([{"role": "user", "content": 7}])")),
            "messages[0].content must be a string, an array of content parts or null");
  EXPECT_EQ(
      error_of(
          *t,
          ojson::parse(
              R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])")),
      "messages[0].content[0]: unsupported content part type 'image_url' (only text is supported)");
  EXPECT_EQ(error_of(*t, ojson::parse(R"([{"role": "user", "content": [{"type": "text"}]}])")),
            "messages[0].content[0]: a text part needs a string 'text'");
  EXPECT_TRUE(contains(
      error_of(*t, ojson::parse(
                       R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
      "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1"}}]}])")),
      "messages[1].tool_calls[0].function.arguments is not valid JSON"));
  EXPECT_EQ(
      error_of(*t, ojson::parse(
                       R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
      "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}])")),
      "messages[1].tool_calls[0].function.arguments must be a JSON object, got array");
  EXPECT_EQ(error_of(*t, ojson::parse(R"([{"role": "user", "content": "q"}])"),
                     ojson::parse(R"({"type": "function"})")),
            "tools must be an array");
}

TEST(ChatTemplate, AbsurdlyDeepRequestsAreRejectedNotACrash) {
  auto t = ChatTemplate::builtin_qwen36();
  std::string deep = std::string(200000, '[') + std::string(200000, ']');
  ojson messages = ojson::parse(R"([{"role": "user", "content": "q", "extra": 0}])");
  messages[0]["extra"] = ojson::parse(deep);
  EXPECT_EQ(error_of(*t, messages), "messages nested more than 512 levels deep");
  nlohmann::json plain = nlohmann::json::parse(R"([{"role": "user", "content": "q"}])");
  plain[0]["extra"] = nlohmann::json::parse(deep);
  EXPECT_THROW(t->render(plain, nlohmann::json(), ChatOptions{}), Error);
}

TEST(ChatTemplate, BuiltinTextIsTheFixtureFile) {
  EXPECT_EQ(std::string(kBuiltinQwen36Template),
            slurp(data_path("tokenizer/chat_template_qwen36.jinja")));
}

TEST(ChatTemplate, SyntaxErrorsNameTheSourceAndLine) {
  try {
    ChatTemplate::from_string("ok\n{% if messages %}\n{{ messages[0].content }", "my.jinja");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "my.jinja:3:")) << e.what();
  }
}

TEST(ChatTemplate, NormalisesOpenAiRequests) {
  auto t = ChatTemplate::builtin_qwen36();
  // developer is the newer name of system; reasoning is accepted for reasoning_content; string
  // tool-call arguments are parsed (key order kept); "" means no arguments.
  ojson messages = ojson::parse(R"([
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "a", "reasoning": "thought",
     "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [true]}"}},
                    {"id": "2", "type": "function", "function": {"name": "g", "arguments": ""}}]}])");
  ChatOptions o;
  o.add_generation_prompt = false;
  o.preserve_thinking = true;
  EXPECT_EQ(t->render(messages, ojson(), o),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nthought\n</think>\n\na\n\n<tool_call>\n<function=f>\n"
            "<parameter=z>\n1\n</parameter>\n<parameter=a>\n[true]\n</parameter>\n</function>\n</"
            "tool_call>\n"
            "<tool_call>\n<function=g>\n</function>\n</tool_call><|im_end|>\n");
}

TEST(ChatTemplate, PlainJsonOverloadRendersWithSortedKeys) {
  // nlohmann::json has no key order: the tool schema prints sorted (documented in the header).
  auto t = ChatTemplate::builtin_qwen36();
  nlohmann::json tools =
      nlohmann::json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  std::string out = t->render(nlohmann::json::parse(R"([{"role": "user", "content": "q"}])"), tools,
                              ChatOptions{});
  EXPECT_TRUE(contains(out, R"({"function": {"name": "f"}, "type": "function"})")) << out;
}

TEST(ChatTemplate, BuiltinIsTheQwen36Template) {
  auto builtin = ChatTemplate::builtin_qwen36();
  auto file =
      ChatTemplate::from_string(slurp(data_path("tokenizer/chat_template_qwen36.jinja")), "file");
  ojson golden = ojson::parse(slurp(data_path("tokenizer/chat-golden-qwen36.json")));
  for (const ojson& c : golden["cases"]) {
    ojson tools = c.contains("tools") ? c["tools"] : ojson();
    EXPECT_EQ(builtin->render(c["messages"], tools, options_of(c)),
              file->render(c["messages"], tools, options_of(c)));
  }
  EXPECT_EQ(builtin->source(), "builtin Qwen3.6 chat template");
}

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

TEST(ChatTemplate, FromModelDirPicksTheModelsOwnTemplate) {
  const ojson messages = ojson::parse(R"([{"role": "user", "content": "q"}])");
  ChatOptions o;
  {
    TempDir dir;  // nothing: the built-in template
    EXPECT_EQ(ChatTemplate::from_model_dir(dir.str())->render(messages, ojson(), o),
              "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n");
  }
  {
    TempDir dir;  // tokenizer_config.json with a string template and special tokens
    write(
        dir.str("tokenizer_config.json"),
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"})");
    auto t = ChatTemplate::from_model_dir(dir.str());
    EXPECT_EQ(t->render(messages, ojson(), o), "<s>q</s>");
    EXPECT_TRUE(contains(t->source(), "tokenizer_config.json"));
    // chat_template.jinja wins over tokenizer_config.json; the special tokens still apply.
    write(dir.str("chat_template.jinja"), "[{{ eos_token }}]{{ messages|length }}\n");
    EXPECT_EQ(ChatTemplate::from_model_dir(dir.str())->render(messages, ojson(), o), "[</s>]1");
  }
  {
    TempDir dir;  // HF's list form: the one named "default"
    write(
        dir.str("tokenizer_config.json"),
        R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ add_generation_prompt }}"}]})");
    EXPECT_EQ(ChatTemplate::from_model_dir(dir.str())->render(messages, ojson(), o), "DTrue");
    write(dir.str("tokenizer_config.json"),
          R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
    EXPECT_THROW(ChatTemplate::from_model_dir(dir.str()), Error);
    write(dir.str("tokenizer_config.json"), R"({"chat_template": )");
    EXPECT_THROW(ChatTemplate::from_model_dir(dir.str()), Error);
  }
  {
    // The Qwen3 tokenizer_config in the fixtures carries its own (Qwen3) template.
    TempDir dir;
    write(dir.str("tokenizer_config.json"),
          slurp(data_path("tokenizer/qwen3-tokenizer_config.json")));
    ChatOptions off;
    off.enable_thinking = false;
    EXPECT_EQ(ChatTemplate::from_model_dir(dir.str())->render(messages, ojson(), off),
              "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  }
}

TEST(ChatTemplate, KwargsBecomeTemplateVariables) {
  auto t = ChatTemplate::from_string(
      "{{ custom|tojson }}|{{ enable_thinking is defined }}|{{ preserve_thinking is defined }}",
      "t");
  ChatOptions o;
  o.extra = ojson::parse(R"({"custom": {"z": 1, "a": 2}})");
  EXPECT_EQ(t->render(ojson::array(), ojson(), o), R"({"z": 1, "a": 2}|False|False)");
  o.enable_thinking = false;
  o.preserve_thinking = true;
  EXPECT_EQ(t->render(ojson::array(), ojson(), o), R"({"z": 1, "a": 2}|True|True)");
}

// `lilac render`, as the cross-check and users call it.
struct RunResult {
  int status;
  std::string out, err;
};

RunResult run_render(const std::string& args, const std::string& input) {
  TempDir dir;
  write(dir.str("in.json"), input);
  std::string cmd = std::string(LILAC_BINARY) + " render " + args + " < " + dir.str("in.json") +
                    " > " + dir.str("out") + " 2> " + dir.str("err");
  int rc = std::system(cmd.c_str());
  return {WEXITSTATUS(rc), slurp(dir.str("out")), slurp(dir.str("err"))};
}

TEST(ChatTemplate, RenderCommandPrintsExactlyTheGoldenText) {
  ojson golden = ojson::parse(slurp(data_path("tokenizer/chat-golden-qwen35.json")));
  std::string tmpl = data_path("tokenizer/chat_template_qwen35.jinja");
  for (const ojson& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    RunResult r = run_render("--chat-template " + tmpl, c.dump());
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, c["rendered"].get<std::string>());
  }
  // Without a template option: the built-in Qwen3.6 template; add_generation_prompt defaults off.
  RunResult r = run_render("", R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.out, "<|im_start|>user\nhi<|im_end|>\n");
}

TEST(ChatTemplate, RenderCommandReportsErrorsWithExit1) {
  RunResult bad_json = run_render("", "{not json");
  EXPECT_EQ(bad_json.status, 1);
  EXPECT_TRUE(contains(bad_json.err, "stdin is not valid JSON")) << bad_json.err;
  RunResult no_user = run_render("", R"({"messages": [{"role": "system", "content": "s"}]})");
  EXPECT_EQ(no_user.status, 1);
  EXPECT_TRUE(contains(no_user.err, "No user query found in messages.")) << no_user.err;
  EXPECT_EQ(no_user.out, "");
  TempDir dir;
  write(dir.str("bad.jinja"), "{% for x in messages %}");
  RunResult syntax = run_render("--chat-template " + dir.str("bad.jinja"), R"({"messages": []})");
  EXPECT_EQ(syntax.status, 1);
  EXPECT_TRUE(contains(syntax.err, "bad.jinja:1:1: syntax error")) << syntax.err;
  RunResult missing = run_render("--chat-template " + dir.str("none.jinja"), R"({"messages": []})");
  EXPECT_EQ(missing.status, 1);
  RunResult model = run_render(
      "--model " + dir.str(),
      R"({"messages": [{"role": "user", "content": "q"}], "add_generation_prompt": true, "enable_thinking": false})");
  EXPECT_EQ(model.status, 0) << model.err;
  EXPECT_EQ(model.out,
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

}  // namespace
}  // namespace lilac::test
