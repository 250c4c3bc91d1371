#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "chat/output_parser.h"

namespace lilac::test {
namespace {

using json = nlohmann::json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "ratio": {"type": "number"},
    "detailed": {"type": "boolean"}, "filters": {"type": "object"}, "hours": {"type": "array"},
    "note": {"type": ["string", "null"]}, "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}}}},
  {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g"}},
  {"type": "function", "function": {"name": "x"}}
])");

struct Result {
  std::string reasoning, content;
  std::vector<std::pair<int, ToolCall>> calls;
  std::vector<ParsedDelta> deltas;
};

void add(Result& r, ParsedDelta d) {
  r.reasoning += d.reasoning;
  r.content += d.content;
  for (auto& c : d.tool_calls) r.calls.push_back(c);
  r.deltas.push_back(std::move(d));
}

Result parse_chunks(const std::vector<std::string>& chunks, bool in_reasoning = true,
                    const json& tools = kTools) {
  OutputParser p(in_reasoning, tools);
  Result r;
  for (const auto& c : chunks) add(r, p.push(c));
  add(r, p.finish());
  return r;
}

Result parse_all(const std::string& text, bool in_reasoning = true, const json& tools = kTools) {
  return parse_chunks({text}, in_reasoning, tools);
}

std::vector<std::string> bytes_of(const std::string& s) {
  std::vector<std::string> out;
  for (char c : s) out.emplace_back(1, c);
  return out;
}

void expect_same(const Result& a, const Result& b, const std::string& what) {
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << what;
  for (size_t k = 0; k < a.calls.size(); ++k) {
    EXPECT_EQ(a.calls[k].first, b.calls[k].first) << what;
    EXPECT_EQ(a.calls[k].second.name, b.calls[k].second.name) << what;
    EXPECT_EQ(a.calls[k].second.arguments, b.calls[k].second.arguments) << what;
  }
}

// A response as Qwen3.6 writes it: reasoning, an answer, two calls, text after them.
const std::string kFull =
    "The user wants weather.\nCheck Paris.\n</think>\n\nLet me check.\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</"
    "parameter>\n<parameter=days>\n3\n"
    "</parameter>\n<parameter=detailed>\ntrue\n</parameter>\n<parameter=filters>\n{\"rain\": "
    "false}\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</"
    "parameter>\n"
    "<parameter=content>\nif a < b and c > d:\n    "
    "print(\"</parameter>\")\n\n</parameter>\n</function>\n</tool_call>\n"
    "Done.";

TEST(OutputParser, SplitsReasoningContentAndToolCalls) {
  Result r = parse_all(kFull);
  EXPECT_EQ(r.reasoning, "The user wants weather.\nCheck Paris.");
  EXPECT_EQ(r.content, "Let me check.Done.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].first, 0);
  EXPECT_EQ(r.calls[0].second.name, "get_weather");
  EXPECT_EQ(r.calls[0].second.arguments,
            R"({"city":"Paris","days":3,"detailed":true,"filters":{"rain":false}})");
  EXPECT_EQ(r.calls[1].first, 1);
  EXPECT_EQ(r.calls[1].second.name, "write_file");
  EXPECT_EQ(
      r.calls[1].second.arguments,
      R"({"path":"/tmp/a.py","content":"if a < b and c > d:\n    print(\"</parameter>\")\n"})");
}

TEST(OutputParser, EverySplitPositionGivesTheSameResult) {
  Result whole = parse_all(kFull);
  for (size_t i = 0; i <= kFull.size(); ++i)
    expect_same(parse_chunks({kFull.substr(0, i), kFull.substr(i)}), whole,
                "split at " + std::to_string(i));
  expect_same(parse_chunks(bytes_of(kFull)), whole, "byte by byte");
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::string> chunks;
    for (size_t i = 0; i < kFull.size();) {
      size_t n = std::min<size_t>(kFull.size() - i, 1 + rng() % 12);
      chunks.push_back(kFull.substr(i, n));
      i += n;
    }
    expect_same(parse_chunks(chunks), whole, "random chunks, trial " + std::to_string(trial));
  }
}

TEST(OutputParser, HoldsBackOnlyWhatMayBeATag) {
  OutputParser p(false, json());
  EXPECT_EQ(p.push("a < b, x<y").content, "a < b, x<y");
  EXPECT_EQ(p.push(" then <tool_c").content, " then");
  ParsedDelta d = p.push("ool> is a tag name");  // not a tag after all
  EXPECT_EQ(d.content, " <tool_cool> is a tag name");
  EXPECT_EQ(p.push(" <").content, "");
  EXPECT_EQ(p.push("b>").content, " <b>");
  EXPECT_TRUE(p.finish().empty());

  OutputParser r(true, json());
  EXPECT_EQ(r.push("think </thi").reasoning, "think");
  ParsedDelta e = r.push("nk>\n\nanswer");
  EXPECT_EQ(e.reasoning, "");
  EXPECT_EQ(e.content, "answer");
}

TEST(OutputParser, TrailingWhitespaceWaitsForWhatFollows) {
  OutputParser p(false, json());
  EXPECT_EQ(p.push("Para one.\n\n").content, "Para one.");
  EXPECT_EQ(p.push("Para two.").content, "\n\nPara two.");
  EXPECT_EQ(p.push("\n").content, "");
  EXPECT_EQ(p.finish().content, "");  // the end of the answer is trimmed
}

TEST(OutputParser, NeverSplitsAUtf8Character) {
  OutputParser p(false, json());
  std::string s = "caf\xC3\xA9 \xF0\x9F\x98\x80!";
  std::string got;
  for (char c : s) {
    std::string d = p.push(std::string(1, c)).content;
    if (!d.empty()) {
      unsigned char last = static_cast<unsigned char>(d.back());
      EXPECT_TRUE(last < 0x80 || (last & 0xC0) == 0x80) << "delta ends inside a character";
    }
    got += d;
  }
  got += p.finish().content;
  EXPECT_EQ(got, s);
}

TEST(OutputParser, OutputMayOpenWithThinkWhenThePromptDidNot) {
  Result r = parse_all("\n<think>\nhmm\n</think>\n\nHi!", false);
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.content, "Hi!");
  Result split = parse_chunks({"<th", "ink>hmm</th", "ink>Hi!"}, false);
  EXPECT_EQ(split.reasoning, "hmm");
  EXPECT_EQ(split.content, "Hi!");
  // Not at the start: literal text.
  Result mid = parse_all("I like <think> tags", false);
  EXPECT_EQ(mid.content, "I like <think> tags");
  EXPECT_EQ(mid.reasoning, "");
  // A lone "<th" at the end is text.
  EXPECT_EQ(parse_all("<th", false).content, "<th");
}

TEST(OutputParser, ToolCallBeforeThinkCloseEndsReasoning) {
  Result r = parse_all(
      "I should call "
      "it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</"
      "function>\n"
      "</tool_call>");
  EXPECT_EQ(r.reasoning, "I should call it.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second.arguments, R"({"city":"Oslo"})");
}

TEST(OutputParser, ValuesAreTypedByTheSchema) {
  auto args = [](const std::string& tool, const std::string& params) {
    Result r = parse_all("</think><tool_call>\n<function=" + tool + ">\n" + params +
                         "</function>\n</tool_call>");
    EXPECT_EQ(r.calls.size(), 1u) << params;
    return r.calls.empty() ? std::string() : r.calls[0].second.arguments;
  };
  auto p = [](const std::string& k, const std::string& v) {
    return "<parameter=" + k + ">\n" + v + "\n</parameter>\n";
  };
  // Strings are raw: exactly one newline is stripped at each end.
  EXPECT_EQ(args("get_weather", p("city", "\n 42 \n")), R"({"city":"\n 42 \n"})");
  EXPECT_EQ(args("get_weather", p("city", "true")), R"({"city":"true"})");
  EXPECT_EQ(args("get_weather", p("days", "7") + p("ratio", "0.5") + p("detailed", "false")),
            R"({"days":7,"ratio":0.5,"detailed":false})");
  // Python spellings (the Qwen3.5 template writes True/None) count where string is not allowed.
  EXPECT_EQ(args("get_weather", p("detailed", "True") + p("note", "None")),
            R"({"detailed":true,"note":"None"})");
  EXPECT_EQ(args("get_weather", p("hours", "[6, 12]") + p("filters", "{\"a\": {\"b\": [1]}}")),
            R"({"hours":[6,12],"filters":{"a":{"b":[1]}}})");
  EXPECT_EQ(args("get_weather", p("note", "null") + p("days", "three")),
            R"({"note":null,"days":"three"})");
  EXPECT_EQ(args("get_weather", p("either", "5")), R"({"either":5})");
  EXPECT_EQ(args("get_weather", p("either", "five")), R"({"either":"five"})");
  // Unknown parameter or tool: JSON when it parses, else the string.
  EXPECT_EQ(args("get_weather", p("extra", "[1]") + p("other", "x y")),
            R"({"extra":[1],"other":"x y"})");
  Result untyped = parse_all("</think><tool_call>\n<function=any_tool>\n" + p("n", "12") +
                                 p("s", "hello") + "</function>\n</tool_call>",
                             true, json());  // no tool list: any name is a call, values untyped
  ASSERT_EQ(untyped.calls.size(), 1u);
  EXPECT_EQ(untyped.calls[0].second.arguments, R"({"n":12,"s":"hello"})");
  // A value that does not fit its schema keeps the raw string.
  EXPECT_EQ(args("get_weather", p("days", "3.5") + p("detailed", "yes") + p("hours", "{}")),
            R"({"days":"3.5","detailed":"yes","hours":"{}"})");
  // Parameter order is kept; values may hold newlines, code and angle brackets.
  EXPECT_EQ(args("write_file", p("path", "b") + p("content", "<div>\n  a</parameter>b\n</div>")),
            R"({"path":"b","content":"<div>\n  a</parameter>b\n</div>"})");
}

TEST(OutputParser, ToolCallTagInsideAValueDoesNotEndTheCall) {
  Result r = parse_all(
      "</think><tool_call>\n<function=write_file>\n<parameter=content>\nExample: <tool_call> ... "
      "</tool_call>\n"
      "</parameter>\n</function>\n</tool_call>after");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second.arguments, R"({"content":"Example: <tool_call> ... </tool_call>"})");
  EXPECT_EQ(r.content, "after");
}

TEST(OutputParser, JsonFormToolCalls) {
  Result r = parse_all(
      "</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"</tool_call>\", \"days\": 2}}\n"
      "</tool_call><tool_call>{\"name\": \"x\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].second.arguments, R"({"city":"</tool_call>","days":2})");
  EXPECT_EQ(r.calls[1].second.name, "x");
  EXPECT_EQ(r.calls[1].second.arguments, R"({"a":1})");
}

TEST(OutputParser, MalformedCallsDegradeToContent) {
  // Not a call: released as soon as that is clear, and parsing goes on.
  OutputParser p(false, kTools);
  ParsedDelta d = p.push("Use the <tool_call> tag");
  EXPECT_EQ(d.content, "Use the <tool_call> tag");
  Result garbage = parse_all("</think>x <tool_call>oops</tool_call> y");
  EXPECT_EQ(garbage.content, "x <tool_call>oops</tool_call> y");
  EXPECT_TRUE(garbage.calls.empty());
  Result bad_json = parse_all("</think><tool_call>{\"nam\": 1}</tool_call>z");
  EXPECT_EQ(bad_json.content, "<tool_call>{\"nam\": 1}</tool_call>z");
  Result junk_after = parse_all("</think><tool_call><function=f></function> junk</tool_call>");
  EXPECT_EQ(junk_after.content, "<tool_call><function=f></function> junk</tool_call>");
  Result empty_name = parse_all("</think><tool_call><function=>\n</function></tool_call>");
  EXPECT_EQ(empty_name.content, "<tool_call><function=>\n</function></tool_call>");
  EXPECT_TRUE(empty_name.calls.empty());
}

TEST(OutputParser, UnclosedCallsAtFinish) {
  // Truncated inside a call: its raw text is content (with the whitespace before it).
  std::string cut = "</think>Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  Result r = parse_all(cut);
  EXPECT_EQ(r.content, "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar");
  EXPECT_TRUE(r.calls.empty());
  Result no_function_close =
      parse_all("</think><tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n");
  EXPECT_EQ(no_function_close.content, "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>");
  // </function> seen, </tool_call> missing: the call stands.
  Result closed_fn =
      parse_all("</think><tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n");
  ASSERT_EQ(closed_fn.calls.size(), 1u);
  EXPECT_EQ(closed_fn.calls[0].second.arguments, R"({"a":1})");
  // Before a real </tool_call>, a missing </function> is forgiven.
  Result lenient =
      parse_all("</think><tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>");
  ASSERT_EQ(lenient.calls.size(), 1u);
  // A value never closed before </tool_call> keeps going to the end: raw content.
  Result open_value =
      parse_all("</think><tool_call>\n<function=f>\n<parameter=a>\n1\n</tool_call> more");
  EXPECT_EQ(open_value.content, "<tool_call>\n<function=f>\n<parameter=a>\n1\n</tool_call> more");
  // Reasoning never closed stays reasoning.
  Result thinking = parse_all("still thinking <tool");
  EXPECT_EQ(thinking.reasoning, "still thinking <tool");
}

TEST(OutputParser, TextBetweenAndAfterCallsIsContent) {
  Result r = parse_all(
      "</think>A\n\n<tool_call>\n<function=f>\n</function>\n</"
      "tool_call>\nB\n<tool_call>\n<function=g>\n</function>\n"
      "</tool_call>\n\nC\n");
  EXPECT_EQ(r.content, "ABC");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].second.name, "f");
  EXPECT_EQ(r.calls[0].second.arguments, "{}");
  EXPECT_EQ(r.calls[1].first, 1);
}

TEST(OutputParser, CallsAreReleasedOnceComplete) {
  OutputParser p(false, kTools);
  EXPECT_TRUE(p.push("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n")
                  .empty());
  EXPECT_TRUE(p.push("</function>\n</tool").empty());
  ParsedDelta d = p.push("_call>\n");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].second.arguments, R"({"city":"Rome"})");
  EXPECT_TRUE(p.finish().empty());
}

TEST(OutputParser, LongArgumentsStayLinear) {
  std::string body(300000, 'x');
  for (size_t i = 0; i < body.size(); i += 61) body[i] = '\n';
  std::string text = "</think><tool_call>\n<function=write_file>\n<parameter=content>\n" + body +
                     "\n</parameter>\n</function>\n</tool_call>";
  OutputParser p(true, kTools);
  auto t0 = std::chrono::steady_clock::now();
  Result r;
  for (size_t i = 0; i < text.size(); i += 4) add(r, p.push(text.substr(i, 4)));
  add(r, p.finish());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].second.arguments)["content"], body);
}

TEST(OutputParser, NoToolsAndOddInputNeverCrash) {
  const char* odd[] = {
      "",
      "<",
      "</",
      "<tool_call>",
      "</tool_call>",
      "<tool_call><tool_call></tool_call>",
      "</think></think>",
      "<tool_call>\n<function=a>\n<parameter=>\nx\n</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n<function=a\n",
      "\xFF\xFE<tool_call>{",
      "<tool_call>{\"name\": \"f\", \"arguments\": \"nope\"}</tool_call>"};
  for (const char* s : odd)
    for (bool reasoning : {false, true}) {
      Result whole = parse_all(s, reasoning, json());
      expect_same(parse_chunks(bytes_of(s), reasoning, json()), whole, s);
    }
}

TEST(OutputParser, RandomTagSoupIsChunkingIndependent) {
  // Fragments of every tag, whole and cut, with text, whitespace and multi-byte characters:
  // whatever the soup, byte-by-byte and random chunkings agree with one push.
  const char* pieces[] = {"<think>",
                          "</think>",
                          "<tool_call>",
                          "</tool_call>",
                          "<function=get_weather>",
                          "<function=",
                          "</function>",
                          "<parameter=city>",
                          "<parameter=days>",
                          "</parameter>",
                          "\n",
                          "  ",
                          "<",
                          "</",
                          "<tool",
                          "</thi",
                          "x",
                          "Paris",
                          "3",
                          "{\"name\": \"f\"}",
                          "\xC3\xA9",
                          "\xF0\x9F\x98\x80",
                          ">"};
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    std::string s;
    for (int k = 0, n = 1 + int(rng() % 25); k < n; ++k)
      s += pieces[rng() % (sizeof pieces / sizeof *pieces)];
    bool reasoning = rng() % 2;
    Result whole = parse_all(s, reasoning);
    expect_same(parse_chunks(bytes_of(s), reasoning), whole, s);
    std::vector<std::string> chunks;
    for (size_t i = 0; i < s.size();) {
      size_t n = std::min<size_t>(s.size() - i, 1 + rng() % 7);
      chunks.push_back(s.substr(i, n));
      i += n;
    }
    expect_same(parse_chunks(chunks, reasoning), whole, s);
  }
}

const std::string kWeatherCall =
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
    "</parameter>\n</function>";

// Every chunking (whole, byte by byte, a few random ones) gives `whole`'s result.
void expect_chunking_independent(const std::string& s, bool in_reasoning, const Result& whole) {
  expect_same(parse_chunks(bytes_of(s), in_reasoning), whole, "byte by byte: " + s);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::string> chunks;
    for (size_t i = 0; i < s.size();) {
      size_t n = std::min<size_t>(s.size() - i, 1 + rng() % 9);
      chunks.push_back(s.substr(i, n));
      i += n;
    }
    expect_same(parse_chunks(chunks, in_reasoning), whole, "random chunks: " + s);
  }
}

TEST(OutputParser, CallInsideTheThinkingIsACallAndNothingLeaks) {
  // The model calls a tool before closing its thinking, then closes it: nothing is content.
  const std::string s = "I need the weather.\n<tool_call>\n" + kWeatherCall +
                        "\n</tool_call>\nWaiting for it.\n</think>\n\n";
  Result r = parse_all(s);
  EXPECT_EQ(r.reasoning, "I need the weather.\nWaiting for it.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second.name, "get_weather");
  EXPECT_EQ(r.calls[0].second.arguments, R"({"city":"Paris","days":2})");
  expect_chunking_independent(s, true, r);
  // An answer after the thinking is content; the call then eos is fine too.
  Result answered =
      parse_all("Hm.\n<tool_call>\n" + kWeatherCall + "\n</tool_call>\n</think>\n\nOK.");
  EXPECT_EQ(answered.reasoning, "Hm.");
  EXPECT_EQ(answered.content, "OK.");
  EXPECT_EQ(answered.calls.size(), 1u);
  // Two calls inside the thinking, no </think> at all.
  Result two = parse_all("<tool_call>\n" + kWeatherCall + "\n</tool_call>\n<tool_call>\n" +
                         kWeatherCall + "\n</tool_call>");
  EXPECT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.reasoning, "");
  EXPECT_EQ(two.content, "");
}

TEST(OutputParser, CallMissingItsOpeningTagIsRecovered) {
  const std::string s = "Checking.\n</think>\n\nOne moment.\n" + kWeatherCall + "\n</tool_call>\n";
  Result r = parse_all(s);
  EXPECT_EQ(r.reasoning, "Checking.");
  EXPECT_EQ(r.content, "One moment.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second.arguments, R"({"city":"Paris","days":2})");
  expect_chunking_independent(s, true, r);
  // Without </tool_call> either, twice in a row, and inside the thinking.
  Result bare = parse_all("</think>" + kWeatherCall + "\n" + kWeatherCall + "\nDone.");
  EXPECT_EQ(bare.calls.size(), 2u);
  EXPECT_EQ(bare.content, "Done.");
  expect_chunking_independent("</think>" + kWeatherCall + "\n" + kWeatherCall + "\nDone.", true,
                              bare);
  Result thinking = parse_all("Let me call.\n" + kWeatherCall + "\n</tool_call>");
  EXPECT_EQ(thinking.reasoning, "Let me call.");
  EXPECT_EQ(thinking.calls.size(), 1u);
  // Prose that mentions the tag is text, released without waiting for the end.
  OutputParser p(false, kTools);
  EXPECT_EQ(p.push("Write <function=get_weather> like this").content,
            "Write <function=get_weather> like this");
  EXPECT_EQ(p.push(" or <function=a b>").content, " or <function=a b>");
  // Truncated: raw text.
  Result cut = parse_all("</think>" + kWeatherCall.substr(0, 40));
  EXPECT_EQ(cut.content, "<function=get_weather>\n<parameter=city>");  // trimmed, as content is
  EXPECT_TRUE(cut.calls.empty());
}

TEST(OutputParser, CallToAnUndeclaredFunctionIsText) {
  const std::string call =
      "<tool_call>\n<function=delete_everything>\n<parameter=path>\n/\n</parameter>\n</function>\n"
      "</tool_call>";
  Result r = parse_all("</think>Sure.\n" + call + "\nDone.");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "Sure.\n" + call + "\nDone.");
  expect_chunking_independent("</think>Sure.\n" + call + "\nDone.", true, r);
  // The JSON form, the form without <tool_call>, and inside the thinking (stays reasoning).
  Result j = parse_all("</think><tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>");
  EXPECT_TRUE(j.calls.empty());
  EXPECT_EQ(j.content, "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>");
  Result bare = parse_all("</think><function=nope>\n</function>");
  EXPECT_TRUE(bare.calls.empty());
  EXPECT_EQ(bare.content, "<function=nope>\n</function>");
  Result in_thinking = parse_all("Hm " + call + " ok</think>Answer");
  EXPECT_TRUE(in_thinking.calls.empty());
  EXPECT_EQ(in_thinking.reasoning, "Hm " + call + " ok");
  EXPECT_EQ(in_thinking.content, "Answer");
  // With an empty tool list (tool_choice none) every call is text.
  Result none =
      parse_all("</think><tool_call>\n" + kWeatherCall + "\n</tool_call>", true, json::array());
  EXPECT_TRUE(none.calls.empty());
  EXPECT_EQ(none.content, "<tool_call>\n" + kWeatherCall + "\n</tool_call>");
}

TEST(OutputParser, ThinkingCutByTheBudget) {
  // The engine feeds "</think>\n\n" in the middle of a word when the budget is spent; the tokens
  // arrive one by one.
  OutputParser p(true, kTools);
  Result r;
  for (const char* t : {"Let", " me", " thi", "</think>", "\n\n", "The", " answer", "."})
    add(r, p.push(t));
  add(r, p.finish());
  EXPECT_EQ(r.reasoning, "Let me thi");
  EXPECT_EQ(r.content, "The answer.");
  // Cut right after a call inside the thinking.
  Result c = parse_all("<tool_call>\n" + kWeatherCall + "\n</tool_call></think>\n\nAfter.");
  EXPECT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.content, "After.");
}

TEST(OutputParser, CallSplitAcrossManyTokensIsReleasedOnceWhole) {
  const std::string s = "</think>\n\n<tool_call>\n" + kWeatherCall + "\n</tool_call>";
  OutputParser p(true, kTools);
  size_t released_at = 0, pushed = 0;
  std::vector<std::pair<int, ToolCall>> calls;
  for (size_t i = 0; i < s.size(); i += 2) {
    ParsedDelta d = p.push(s.substr(i, 2));
    pushed += std::min<size_t>(2, s.size() - i);
    EXPECT_EQ(d.content, "");
    if (!d.tool_calls.empty()) released_at = pushed;
    for (auto& c : d.tool_calls) calls.push_back(c);
  }
  EXPECT_TRUE(p.finish().empty());
  EXPECT_EQ(released_at, s.size());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].second.arguments, R"({"city":"Paris","days":2})");
}

}  // namespace
}  // namespace lilac::test
