// Issue 10: nothing one request or one client does may take the server down or lock others out.
// Each test reproduces a finding of the 2026-12-01 probe (items 1-7 and 9) against the real
// server in-process (ScriptedBackend), and failed before the fix.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <memory>
#include <thread>

#include "raw_socket.h"
#include "server/api_error.h"
#include "server/request.h"
#include "server_fixture.h"
#include "util/device_fault.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

json user(const std::string& text) {
  return json::array({{{"role", "user"}, {"content", text}}});
}

std::unique_ptr<TestServer> make_server(ServerFixtureOptions o = {}) {
  auto tok = Tokenizer::from_model_dir(demo_dir());
  if (o.script.empty()) o.script = {script_text(*tok, "ok")};
  return std::make_unique<TestServer>(std::move(o));
}

void expect_alive(const TestServer& ts) {
  auto h = ts.client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// A 400 whose error names `param`.
void expect_400_naming(const httplib::Result& r, const std::string& param) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  EXPECT_EQ(j["error"]["param"], param) << r->body;
}

std::string nested(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

// ---- item 1: deep JSON ----------------------------------------------------------------------

TEST(Hardening, DeepJsonIsA400OnEveryEndpoint) {
  auto ts = make_server();
  const std::string deep = nested(100000);
  const std::string deep_obj = [] {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += "{\"a\":";
    s += "1";
    s += std::string(100000, '}');
    return s;
  }();
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  const std::vector<std::pair<std::string, std::string>> bodies = {
      {"/v1/chat/completions", "{" + msgs + R"(,"tools":[{"type":)" + deep + "}]}"},
      {"/v1/chat/completions",
       "{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)" +
           deep_obj + "}}]}"},
      {"/v1/chat/completions", "{" + msgs + R"(,"chat_template_kwargs":{"x":)" + deep + "}}"},
      {"/apply-template", "{" + msgs + R"(,"chat_template_kwargs":{"x":)" + deep_obj + "}}"},
      {"/apply-template",
       R"({"messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":)" +
           deep_obj + "}}]}]}"},
      {"/v1/completions", R"({"prompt":"x","stop":)" + deep + "}"},
      {"/tokenize", R"({"content":"x","extra":)" + deep + "}"},
      {"/detokenize", R"({"tokens":)" + deep + "}"},
  };
  for (const auto& [path, body] : bodies) {
    auto r = ts->post_raw(path, body);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 400) << path << ": " << r->body.substr(0, 300);
    EXPECT_THAT(r->body, HasSubstr("nested deeper")) << path;
  }
  // Deep JSON inside a string (tool-call arguments) is refused too, as that field's error.
  std::string args = deep_obj;
  auto r = ts->post("/apply-template",
                    {{"messages",
                      {{{"role", "assistant"},
                        {"content", ""},
                        {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", args}}}}}}}}}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  expect_alive(*ts);
}

TEST(Hardening, ModeratelyNestedJsonStillWorks) {
  auto ts = make_server();
  json params = {{"type", "object"}};
  json* p = &params;
  for (int i = 0; i < 30; ++i) {
    (*p)["properties"] = {{"x", {{"type", "object"}}}};
    p = &(*p)["properties"]["x"];
  }
  auto r = ts->post(
      "/apply-template",
      {{"messages", user("hi")},
       {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", params}}}}}}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// ---- item 2: numbers and types ----------------------------------------------------------------

TEST(Hardening, OutOfRangeNumbersAndWrongTypesAre400NamingTheField) {
  auto ts = make_server();
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"temperature", "1e309"},
           {"max_tokens", "-1e309"},
           {"max_tokens", "1e300"},
           {"max_tokens", "-1e300"},
           {"top_k", "1e300"},
           {"n", "1e300"},
           {"top_logprobs", "1e300"},
           {"max_completion_tokens", "9.3e18"},
           {"seed", "1e309"},
           {"top_p", "-1e309"},
       }) {
    auto r = ts->post_raw("/v1/chat/completions", "{" + msgs + ",\"" + field + "\":" + value + "}");
    expect_400_naming(r, field);
  }
  auto r = ts->post_raw("/v1/completions", R"({"prompt":"x","best_of":1e300})");
  expect_400_naming(r, "best_of");
  expect_400_naming(ts->post("/tokenize", {{"content", "x"}, {"with_pieces", "yes"}}),
                    "with_pieces");
  expect_400_naming(ts->post("/detokenize", {{"tokens", {1, 2}}, {"skip_special_tokens", "x"}}),
                    "skip_special_tokens");
  // A number deep inside a message: the error names where it is.
  r = ts->post_raw("/v1/chat/completions",
                   R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"x":[1,1e999]}]})");
  expect_400_naming(r, "tools[0].x[1]");
  expect_alive(*ts);
}

TEST(Hardening, IntegerFieldsConvertOnlyInRange) {
  SamplingParams d;
  for (const char* v : {"1e300", "-1e300", "9223372036854775808.0", "1e19"}) {
    const json b = json::parse(std::string(R"({"prompt":"x","max_tokens":)") + v + "}");
    try {
      server::parse_completion_request(b, d);
      FAIL() << v;
    } catch (const server::ApiError& e) {
      EXPECT_EQ(e.param, "max_tokens");
      EXPECT_THAT(std::string(e.what()), HasSubstr("must be between")) << e.what();
    }
  }
  const json ok = json::parse(R"({"prompt":"x","max_tokens":12.0})");
  EXPECT_EQ(server::parse_completion_request(ok, d).common.max_tokens, 12);
}

// ---- item 3: compressed bodies ------------------------------------------------------------------

std::string gzip(const std::string& in) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  std::string out;
  std::vector<unsigned char> buf(1 << 16);
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    z.next_out = buf.data();
    z.avail_out = uInt(buf.size());
    rc = deflate(&z, Z_FINISH);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) break;
    out.append(reinterpret_cast<const char*>(buf.data()), buf.size() - z.avail_out);
  }
  deflateEnd(&z);
  return out;
}

TEST(Hardening, CompressedBodiesAreRefused) {
  ServerFixtureOptions o;
  o.http.max_body = 1 << 20;
  auto ts = make_server(std::move(o));
  // 20 MiB of JSON that gzips to ~20 KB: was inflated past --max-body.
  const std::string bomb = gzip(R"({"content":")" + std::string(20 << 20, 'a') + R"("})");
  ASSERT_LT(bomb.size(), size_t(100000));
  httplib::Headers h = {{"Content-Encoding", "gzip"}};
  auto r = ts->client().Post("/tokenize", h, bomb, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 415) << r->body;
  EXPECT_THAT(r->body, HasSubstr("Content-Encoding"));
  // A small, honest gzip body is refused the same way (the rule is simple to state).
  r = ts->client().Post("/tokenize", h, gzip(R"({"content":"hi"})"), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 415);
  expect_alive(*ts);
}

// ---- item 4: early answers and the unread body ----------------------------------------------

TEST(Hardening, A401DoesNotLeaveTheBodyToBeParsedAsTheNextRequest) {
  ServerFixtureOptions o;
  o.http.api_key = "sekret";
  auto ts = make_server(std::move(o));
  // One keep-alive connection, as openai-python uses: wrong key, then the right key.
  httplib::Client c("127.0.0.1", ts->srv->port());
  c.set_keep_alive(true);
  const std::string body = json{{"content", "hello there"}}.dump();
  auto r = c.Post("/tokenize", {{"Authorization", "Bearer wrong"}}, body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = c.Post("/tokenize", {{"Authorization", "Bearer sekret"}}, body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;

  // On the wire: the 401 closes the connection, so the body is never read as a request.
  RawSocket s(ts->srv->port());
  ASSERT_TRUE(s.ok());
  s.send(
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string raw = s.read_all(5);
  EXPECT_EQ(status_of(raw), 401);
  EXPECT_THAT(raw, HasSubstr("Connection: close"));
  EXPECT_EQ(responses_in(raw), 1) << raw;
  EXPECT_TRUE(s.eof());
}

// ---- item 5: slowloris
// ---------------------------------------------------------------------------

TEST(Hardening, SlowClientsDoNotBlockHealthOrStreams) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  auto endless = script_text(*tok, "tick ");
  endless.eos = false;
  o.script = {endless};
  o.step_delay = 0.05;  // 20 tokens a second: the stream outlasts the test
  auto ts = make_server(std::move(o));
  // A stream that runs through the attack.
  std::atomic<size_t> chunks{0};
  std::atomic<bool> done{false};
  std::thread stream([&] {
    RawSocket c(ts->srv->port());
    const std::string body =
        json{{"messages", user("go")}, {"stream", true}, {"max_tokens", 3000}}.dump();
    c.send(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body);
    while (!done && !c.eof()) chunks += c.read_all(0.1).size();
  });
  // 200 connections sending a request head one byte at a time, slower than anyone would.
  std::vector<std::unique_ptr<RawSocket>> slow;
  for (int i = 0; i < 200; ++i) {
    slow.push_back(std::make_unique<RawSocket>(ts->srv->port()));
    slow.back()->send("P");
  }
  for (int second = 0; second < 3; ++second) {
    for (auto& s : slow) s->send("O");
    const auto t0 = Clock::now();
    httplib::Client c("127.0.0.1", ts->srv->port());
    c.set_read_timeout(2, 0);
    c.set_connection_timeout(2, 0);
    auto h = c.Get("/health");
    ASSERT_TRUE(h) << "/health did not answer with 200 slow connections open";
    EXPECT_EQ(h->status, 200);
    EXPECT_LT(Clock::now() - t0, 1s);
    std::this_thread::sleep_for(1s);
  }
  const size_t before = chunks;
  std::this_thread::sleep_for(300ms);
  EXPECT_GT(chunks.load(), before) << "the stream stalled";
  done = true;
  stream.join();
}

TEST(Hardening, ARequestHeadMustArriveInTime) {
  ServerFixtureOptions o;
  o.http.head_timeout = 1;
  auto ts = make_server(std::move(o));
  RawSocket s(ts->srv->port());
  ASSERT_TRUE(s.ok());
  const auto t0 = Clock::now();
  s.send("GET /hea");
  for (int i = 0; i < 8 && !s.eof(); ++i) {
    s.send("a");
    s.read_all(0.25);
  }
  EXPECT_TRUE(s.eof()) << "a head trickling in was not cut off";
  EXPECT_LT(Clock::now() - t0, 2500ms);
  expect_alive(*ts);
}

TEST(Hardening, AtTheConnectionCapTheLongestIdleConnectionMakesRoom) {
  ServerFixtureOptions o;
  o.http.max_connections = 8;
  auto ts = make_server(std::move(o));
  std::vector<std::unique_ptr<RawSocket>> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(std::make_unique<RawSocket>(ts->srv->port()));
    idle.back()->send("G");
    std::this_thread::sleep_for(20ms);  // their waits begin in order
  }
  std::this_thread::sleep_for(200ms);
  for (int i = 0; i < 4; ++i) expect_alive(*ts);
  // Each health check's client has closed its socket, but the server sees that close on its own
  // thread a moment later (seen in CI under ASan: 10 still open right after the fourth check), so
  // the count is given a moment to settle; it must come down to the cap plus the one being served.
  const auto settle_deadline = std::chrono::steady_clock::now() + 2s;
  while (ts->srv->open_connections() > 9 && std::chrono::steady_clock::now() < settle_deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_LE(ts->srv->open_connections(), size_t(9));
  // A waiting connection was closed to make room: the one whose wait began first, normally the
  // front one; on a loaded machine the server's threads may see two waits begin in another order
  // (seen in CI), so any of the idle ones counts.
  size_t closed = 0;
  for (auto& s : idle) {
    s->read_all(closed ? 0.05 : 0.5);
    closed += s->eof() ? 1 : 0;
  }
  EXPECT_GE(closed, size_t(1));
}

// ---- item 6: framing -------------------------------------------------------------------------

struct FramingCase {
  const char* name;
  std::string head_and_body;
  int status;
};

TEST(Hardening, BadFramingIsRefusedAtOnceAndTheConnectionClosed) {
  auto ts = make_server();
  const std::string post =
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  const std::string body = R"({"content":"hi"})";
  const std::string n = std::to_string(body.size());
  const std::vector<FramingCase> cases = {
      {"two Content-Lengths",
       post + "Content-Length: " + n + "\r\nContent-Length: 3\r\n\r\n" + body, 400},
      {"negative Content-Length", post + "Content-Length: -1\r\n\r\n" + body, 400},
      {"huge Content-Length", post + "Content-Length: 99999999999999999999999\r\n\r\n" + body, 400},
      {"over --max-body", post + "Content-Length: 999999999999\r\n\r\n" + body, 413},
      {"Content-Length with a sign", post + "Content-Length: +16\r\n\r\n" + body, 400},
      {"TE and CL", post + "Transfer-Encoding: CHUNKED\r\nContent-Length: " + n + "\r\n\r\n" + body,
       400},
      {"TE gzip, chunked",
       post + "Transfer-Encoding: gzip, chunked\r\n\r\n10\r\n" + body + "\r\n0\r\n\r\n", 501},
      {"negative chunk", post + "Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", 400},
      {"oversize chunk", post + "Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFF\r\nhello", 413},
      {"chunk size not hex", post + "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
       400},
      {"POST without a length", "POST /tokenize HTTP/1.1\r\nHost: x\r\n\r\n" + body, 411},
      {"chunk longer than its size",
       post + "Transfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n", 400},
  };
  for (const auto& c : cases) {
    RawSocket s(ts->srv->port());
    ASSERT_TRUE(s.ok());
    s.send(c.head_and_body);
    const auto t0 = Clock::now();
    const std::string raw = s.read_all(3);
    EXPECT_EQ(status_of(raw), c.status) << c.name << ": " << raw.substr(0, 200);
    EXPECT_TRUE(s.eof()) << c.name << ": the connection was held";
    EXPECT_LT(Clock::now() - t0, 2s) << c.name;
  }
  // A well-formed chunked body still works.
  RawSocket s(ts->srv->port());
  s.send(post + "Transfer-Encoding: chunked\r\n\r\n4\r\n" + body.substr(0, 4) + "\r\n" +
         fmt::format("{:x}", body.size() - 4) + "\r\n" + body.substr(4) + "\r\n0\r\n\r\n");
  const std::string raw = s.read_until("\"count\"", 3);
  EXPECT_EQ(status_of(raw), 200) << raw;
  expect_alive(*ts);
}

TEST(Hardening, ChunkedBodiesCountAgainstMaxBody) {
  ServerFixtureOptions o;
  o.http.max_body = 1 << 16;
  auto ts = make_server(std::move(o));
  RawSocket s(ts->srv->port());
  s.send("POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  const std::string chunk = std::string("1000\r\n") + std::string(0x1000, 'a') + "\r\n";
  for (int i = 0; i < 32 && !s.eof(); ++i) s.send(chunk);
  const std::string raw = s.read_all(3);
  EXPECT_EQ(status_of(raw), 413) << raw.substr(0, 200);
}

// ---- item 7: shutdown with idle keep-alive connections ---------------------------------------

TEST(Hardening, ShutdownClosesIdleKeepAliveConnectionsAtOnce) {
  auto ts = make_server();
  RawSocket s(ts->srv->port());
  s.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(status_of(s.read_until("\"ok\"", 3)), 200);
  // The connection now idles in keep-alive. Drain closes it at once, stop returns at once.
  const auto t0 = Clock::now();
  ts->srv->drain();
  s.read_all(2);
  EXPECT_TRUE(s.eof());
  ts->engine->shutdown();
  ts->srv->stop();
  EXPECT_LT(Clock::now() - t0, 1s);
}

// ---- item 9: a sticky device fault -------------------------------------------------------------

// Throws DeviceFault from step() once armed, as the CUDA error check does for an illegal address.
class FaultyBackend : public server::ScriptedBackend {
 public:
  using ScriptedBackend::ScriptedBackend;
  StepResult step(SequenceState& s, std::span<const int32_t> ids, uint64_t i) override {
    if (armed) throw DeviceFault("CUDA error cudaErrorIllegalAddress (simulated) at x.cu:1");
    return ScriptedBackend::step(s, ids, i);
  }
  std::atomic<bool> armed{false};
};

TEST(Hardening, ADeviceFaultMakesHealth503AndFailsLaterRequests) {
  ServerFixtureOptions o;
  FaultyBackend* faulty = nullptr;
  o.make_backend = [&](const ModelConfig& c, const Tokenizer& t,
                       std::vector<server::ScriptedResponse> s) {
    auto b = std::make_unique<FaultyBackend>(c, t, std::move(s));
    faulty = b.get();
    return std::unique_ptr<server::ScriptedBackend>(std::move(b));
  };
  auto ts = make_server(std::move(o));
  ASSERT_NE(faulty, nullptr);
  auto r = ts->post("/v1/chat/completions", {{"messages", user("hi")}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  faulty->armed = true;
  r = ts->post("/v1/chat/completions", {{"messages", user("hi")}});
  ASSERT_TRUE(r);
  // The status line went out when generation started; the failure is in the body.
  EXPECT_THAT(r->body, HasSubstr("device fault"));
  faulty->armed = false;  // the device "works" again, but a sticky fault never clears
  auto h = ts->client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_EQ(json::parse(h->body)["status"], "device_fault");
  EXPECT_THAT(h->body, HasSubstr("cudaErrorIllegalAddress"));
  r = ts->post("/v1/chat/completions", {{"messages", user("hi")}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "device_fault");
  EXPECT_FALSE(ts->engine->fault().empty());
}

}  // namespace
}  // namespace lilac::test
