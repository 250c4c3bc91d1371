// OutputParser with stream_calls: a tool call released as it is written (CallStart, one
// arguments fragment per parameter, the closing brace, CallEnd), checked against the parser
// without stream_calls on the same output.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <random>

#include "chat/output_parser.h"

namespace lilac::test {
namespace {

using json = nlohmann::json;
using Kind = ParsedPiece::Kind;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "detailed": {"type": "boolean"},
    "filters": {"type": "object"}}}}},
  {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "f"}}
])");

const std::string kWeatherCall =
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
    "</parameter>\n</function>";

// One streamed call as a client assembles it.
struct StreamedCall {
  std::string name;
  std::vector<std::string> fragments;
  bool ended = false;
  std::string end_text;  // CallEnd's text
};

struct StreamRun {
  std::string reasoning, content;
  std::vector<std::pair<int, ToolCall>> calls;  // tool_calls
  std::map<int, StreamedCall> streamed;
  std::vector<size_t> start_at;  // bytes pushed when each CallStart came out
  std::vector<size_t> fragment_at;
};

void absorb(StreamRun& r, const ParsedDelta& d, size_t pushed) {
  r.reasoning += d.reasoning;
  r.content += d.content;
  for (const auto& c : d.tool_calls) r.calls.push_back(c);
  for (const auto& p : d.pieces) {
    if (p.index < 0) continue;
    StreamedCall& s = r.streamed[p.index];
    if (p.kind == Kind::CallStart) {
      EXPECT_TRUE(s.name.empty() && s.fragments.empty());
      s.name = p.text;
      r.start_at.push_back(pushed);
    } else if (p.kind == Kind::CallArguments) {
      EXPECT_FALSE(s.ended);
      s.fragments.push_back(p.text);
      r.fragment_at.push_back(pushed);
    } else if (p.kind == Kind::CallEnd) {
      s.ended = true;
      s.end_text = p.text;
    }
  }
}

StreamRun run(const std::vector<std::string>& chunks, bool stream, bool in_reasoning = true) {
  OutputParser p(in_reasoning, kTools, stream);
  StreamRun r;
  size_t pushed = 0;
  for (const auto& c : chunks) {
    pushed += c.size();
    absorb(r, p.push(c), pushed);
  }
  absorb(r, p.finish(), pushed);
  return r;
}

std::vector<std::string> bytes_of(const std::string& s) {
  std::vector<std::string> out;
  for (char c : s) out.emplace_back(1, c);
  return out;
}

std::string joined(const StreamedCall& s) {
  std::string out;
  for (const auto& f : s.fragments) out += f;
  return out;
}

// What every streamed run must satisfy against the parser without stream_calls: the same text;
// each call's fragments join to its CallEnd and its tool_calls arguments, a JSON object; and the
// calls the plain parser finds are streamed with the same names and arguments, in order.
void expect_consistent(const StreamRun& streamed, const StreamRun& plain, const std::string& what) {
  EXPECT_EQ(streamed.reasoning, plain.reasoning) << what;
  EXPECT_EQ(streamed.content, plain.content) << what;
  ASSERT_EQ(streamed.streamed.size(), streamed.calls.size()) << what;
  for (const auto& [index, call] : streamed.calls) {
    const StreamedCall& s = streamed.streamed.at(index);
    EXPECT_TRUE(s.ended) << what;
    EXPECT_EQ(s.name, call.name) << what;
    EXPECT_EQ(joined(s), call.arguments) << what;
    EXPECT_EQ(s.end_text, call.arguments) << what;
    json args = json::parse(call.arguments, nullptr, false);
    EXPECT_TRUE(args.is_object()) << what << ": " << call.arguments;
  }
  size_t k = 0;
  for (const auto& [index, call] : streamed.calls)
    if (k < plain.calls.size() && plain.calls[k].second.name == call.name &&
        plain.calls[k].second.arguments == call.arguments)
      ++k;
  EXPECT_EQ(k, plain.calls.size()) << what;
}

TEST(OutputParserStream, SingleCharacterTokensGiveOneFragmentPerParameter) {
  const std::string s = "</think>\n\n<tool_call>\n" + kWeatherCall + "\n</tool_call>";
  StreamRun plain = run({s}, false);
  StreamRun r = run(bytes_of(s), true);
  expect_consistent(r, plain, s);
  ASSERT_EQ(r.calls.size(), 1u);
  const StreamedCall& c = r.streamed.at(0);
  EXPECT_EQ(c.name, "get_weather");
  EXPECT_EQ(c.fragments, (std::vector<std::string>{R"({"city":"Paris")", R"(,"days":2)", "}"}));
  EXPECT_EQ(joined(c), plain.calls[0].second.arguments);
  // The start as soon as <function=get_weather> is complete; "Paris" once the next
  // <parameter= shows its </parameter> ended it; 2 once </function> does; the brace at the end.
  const size_t open = s.find("<function=");
  ASSERT_EQ(r.start_at.size(), 1u);
  EXPECT_EQ(r.start_at[0], s.find('>', open) + 1);
  ASSERT_EQ(r.fragment_at.size(), 3u);
  EXPECT_EQ(r.fragment_at[0], s.find("<parameter=days>") + std::string("<parameter=").size());
  EXPECT_EQ(r.fragment_at[1], s.find("</function>") + std::string("</function>").size());
  EXPECT_EQ(r.fragment_at[2], s.size());
}

TEST(OutputParserStream, ManyCallsAndEveryChunkingAgreeWithThePlainParser) {
  const std::string s =
      "Weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
      "<parameter=detailed>\ntrue\n</parameter>\n<parameter=filters>\n{\"rain\": false}\n"
      "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=write_file>\n"
      "<parameter=path>\n/tmp/a.py\n</parameter>\n<parameter=content>\nif a < b:\n    "
      "print(\"</parameter>\")\n\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=f>\n</function>\n</tool_call>\nDone.";
  StreamRun plain = run({s}, false);
  ASSERT_EQ(plain.calls.size(), 3u);
  StreamRun bytes = run(bytes_of(s), true);
  expect_consistent(bytes, plain, s);
  ASSERT_EQ(bytes.calls.size(), 3u);
  EXPECT_EQ(bytes.streamed.at(0).fragments.size(), 5u);  // four parameters and the brace
  EXPECT_EQ(bytes.streamed.at(1).fragments.size(), 3u);
  EXPECT_EQ(bytes.streamed.at(2).fragments, std::vector<std::string>{"{}"});
  std::mt19937 rng(5);
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<std::string> chunks;
    for (size_t i = 0; i < s.size();) {
      size_t n = std::min<size_t>(s.size() - i, 1 + rng() % 12);
      chunks.push_back(s.substr(i, n));
      i += n;
    }
    expect_consistent(run(chunks, true), plain, "random chunks");
  }
}

TEST(OutputParserStream, CallInsideThinkingAndCallWithoutItsOpeningTag) {
  for (const std::string& s :
       {"I need the weather.\n<tool_call>\n" + kWeatherCall + "\n</tool_call>\nWaiting.\n</think>",
        "Checking.\n</think>\n\nOne moment.\n" + kWeatherCall + "\n</tool_call>\n",
        "</think>" + kWeatherCall + "\n" + kWeatherCall + "\nDone."}) {
    StreamRun plain = run({s}, false);
    ASSERT_FALSE(plain.calls.empty()) << s;
    StreamRun r = run(bytes_of(s), true);
    expect_consistent(r, plain, s);
    ASSERT_EQ(r.calls.size(), plain.calls.size()) << s;
    for (const auto& [index, call] : r.streamed) EXPECT_EQ(call.fragments.size(), 3u) << s;
  }
}

TEST(OutputParserStream, CallMalformedAfterFragmentsIsClosedAndItsTextFollows) {
  // Garbage after the second parameter: the plain parser gives text only; the stream has
  // already sent the start and the first parameter, so it closes the object with what it sent.
  const std::string bad =
      "</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n2\n</parameter>\noops\n</tool_call>";
  StreamRun plain = run({bad}, false);
  EXPECT_TRUE(plain.calls.empty());
  StreamRun r = run(bytes_of(bad), true);
  expect_consistent(r, plain, bad);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second.arguments, R"({"city":"Paris"})");
  EXPECT_EQ(r.streamed.at(0).fragments, (std::vector<std::string>{R"({"city":"Paris")", "}"}));
  EXPECT_EQ(r.content, plain.content);
  EXPECT_EQ(r.content, bad.substr(std::string("</think>\n").size()));
  // Text right after <function=NAME>: closed as {} at once, and the markup is text.
  const std::string prose = "</think><tool_call>\n<function=get_weather>\nhello</tool_call>";
  StreamRun p = run(bytes_of(prose), true);
  expect_consistent(p, run({prose}, false), prose);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second.arguments, "{}");
  // Cut off by the end of the output (max_tokens) inside the second value.
  const std::string cut = "</think><tool_call>\n" + kWeatherCall.substr(0, 75);
  StreamRun c = run(bytes_of(cut), true);
  expect_consistent(c, run({cut}, false), cut);
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].second.arguments, R"({"city":"Paris"})");
}

TEST(OutputParserStream, UndeclaredFunctionAndJsonFormAreNotStreamedPiecewise) {
  const std::string undeclared =
      "</think><tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n"
      "</tool_call>";
  StreamRun u = run(bytes_of(undeclared), true);
  EXPECT_TRUE(u.streamed.empty());
  EXPECT_EQ(u.content, undeclared.substr(8));
  // The JSON form: released whole, as one fragment.
  const std::string j =
      "</think><tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";
  StreamRun r = run(bytes_of(j), true);
  expect_consistent(r, run({j}, false), j);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.streamed.at(0).fragments, std::vector<std::string>{R"({"a":1})"});
}

TEST(OutputParserStream, ParameterGivenTwiceKeepsItsFirstValue) {
  const std::string s =
      "</think><tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>";
  StreamRun plain = run({s}, false);
  ASSERT_EQ(plain.calls.size(), 1u);
  EXPECT_EQ(plain.calls[0].second.arguments, R"({"city":"Paris"})");
  expect_consistent(run(bytes_of(s), true), plain, s);
}

TEST(OutputParserStream, LongValuesStayLinear) {
  // A 300 kB file body pushed 4 bytes at a time: the search for its </parameter> resumes where it
  // stopped, so streaming costs no more than the plain parser.
  std::string body(300000, 'x');
  for (size_t i = 0; i < body.size(); i += 61) body[i] = '\n';
  const std::string text =
      "</think><tool_call>\n<function=write_file>\n<parameter=path>\na\n"
      "</parameter>\n<parameter=content>\n" +
      body + "\n</parameter>\n</function>\n</tool_call>";
  std::vector<std::string> chunks;
  for (size_t i = 0; i < text.size(); i += 4) chunks.push_back(text.substr(i, 4));
  auto t0 = std::chrono::steady_clock::now();
  StreamRun r = run(chunks, true);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.streamed.at(0).fragments.size(), 3u);
  EXPECT_EQ(json::parse(r.calls[0].second.arguments)["content"], body);
}

TEST(OutputParserStream, RandomTagSoupStaysConsistent) {
  const char* pieces[] = {"<tool_call>",
                          "</tool_call>",
                          "<function=get_weather>",
                          "<function=f>",
                          "<function=",
                          "</function>",
                          "<parameter=city>",
                          "<parameter=days>",
                          "</parameter>",
                          "\n",
                          "  ",
                          "<",
                          "</",
                          "x",
                          "Paris",
                          "3",
                          "</think>",
                          "\xC3\xA9",
                          ">",
                          "<think>"};
  std::mt19937 rng(17);
  for (int trial = 0; trial < 600; ++trial) {
    std::string s;
    for (int k = 0, n = 1 + int(rng() % 30); k < n; ++k)
      s += pieces[rng() % (sizeof pieces / sizeof *pieces)];
    const bool reasoning = rng() % 2;
    StreamRun plain = run({s}, false, reasoning);
    expect_consistent(run(bytes_of(s), true, reasoning), plain, s);
    std::vector<std::string> chunks;
    for (size_t i = 0; i < s.size();) {
      size_t n = std::min<size_t>(s.size() - i, 1 + rng() % 7);
      chunks.push_back(s.substr(i, n));
      i += n;
    }
    expect_consistent(run(chunks, true, reasoning), plain, s);
  }
}

}  // namespace
}  // namespace lilac::test
