// Token-mask cost of structured output over the real Qwen3 vocabulary (151,643 byte strings from
// tests/data/tokenizer/qwen3-tokenizer.json.gz): per schema, generation is simulated by taking a
// random allowed token at each step (seeded), and the time of each fill_mask (the per-step cost
// the sampler waits for) is recorded.
//   cold: the first episodes on a fresh grammar (the per-stack token splits are computed as new
//         parser states appear; what the first requests with a new schema pay)
//   warm: later episodes of the same grammar (the cache shared by requests is filled)
// Prints p50 / p99 / max per schema, and the one-time costs (vocabulary build, grammar compile).
// Usage: grammar_mask_bench [episodes=20] [steps=120] [context depth=4] [--threads N]
//                           [--parallel-ms X]
//   --threads N: threads sharing the walk of a new context (0, the default: GrammarIndex's choice,
//   up to 8 as the machine has cores); the header line prints the number used.
//   --parallel-ms X: the projected walk time from which the threads share it
//   (GrammarIndex::set_parallel_walk_ms; default 0.5).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;
using namespace lilac;

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

struct Case {
  std::string name;
  std::string gbnf;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> positional;
  int threads = 0;
  double parallel_ms = -1;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--threads" && a + 1 < argc) {
      threads = std::atoi(argv[++a]);
    } else if (arg == "--parallel-ms" && a + 1 < argc) {
      parallel_ms = std::atof(argv[++a]);
    } else if (arg.rfind("--threads=", 0) == 0) {
      threads = std::atoi(arg.c_str() + 10);
    } else if (!arg.empty() && arg[0] != '-') {
      positional.push_back(std::atoi(arg.c_str()));
    } else {
      std::fprintf(stderr,
                   "usage: %s [episodes] [steps] [context depth] [--threads N] "
                   "[--parallel-ms X]\n",
                   argv[0]);
      return 2;
    }
  }
  const int episodes = positional.size() > 0 ? positional[0] : 20;
  const int steps = positional.size() > 1 ? positional[1] : 120;
  const int depth = positional.size() > 2 ? positional[2] : grammar::GrammarIndex::kContextDepth;
  auto t0 = Clock::now();
  TokenizerOptions opt;
  opt.force_qwen35_regex = true;
  // The build-time data folder, unless LILAC_TEST_DATA says where it is now (the GPU machine).
  const char* data = std::getenv("LILAC_TEST_DATA");
  auto tok = Tokenizer::from_file(
      std::string(data && *data ? data : LILAC_TEST_DATA) + "/tokenizer/qwen3-tokenizer.json.gz",
      opt);
  const double load_ms = ms_since(t0);
  t0 = Clock::now();
  std::vector<std::string> bytes(size_t(tok->size()));
  for (int32_t id = 0; id < tok->size(); ++id)
    if (!tok->is_special(id)) bytes[size_t(id)] = tok->token_bytes(id);
  std::vector<int32_t> ends = tok->eos_ids();
  if (auto im_end = tok->token_id("<|im_end|>")) ends.push_back(*im_end);
  for (int32_t id : ends) bytes[size_t(id)].clear();
  auto vocab = std::make_shared<const grammar::Vocabulary>(std::move(bytes), ends);
  const double vocab_ms = ms_since(t0);

  const json person = json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 40},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "email": {"type": "string", "format": "email"},
      "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
      "address": {"type": "object", "properties": {
          "street": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["street", "zip"]}
    },
    "required": ["name", "age", "tags"], "additionalProperties": false})");
  const json invoice = json::parse(R"({
    "$defs": {"line": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "qty": {"type": "integer", "minimum": 1, "maximum": 999},
        "price": {"type": "number", "minimum": 0}}, "required": ["sku", "qty", "price"]}},
    "type": "object",
    "properties": {
      "id": {"type": "string", "format": "uuid"},
      "date": {"type": "string", "format": "date"},
      "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1, "maxItems": 5},
      "note": {"anyOf": [{"type": "string", "maxLength": 80}, {"type": "null"}]}
    },
    "required": ["id", "date", "lines", "note"]})");
  const json article = json::parse(R"({"type": "object", "properties": {
      "title": {"type": "string", "maxLength": 200}, "body": {"type": "string", "maxLength": 2000},
      "words": {"type": "integer", "minimum": 0}}, "required": ["title", "body", "words"]})");
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "unit": {"type": "string", "enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1,
      "maximum": 14}}, "required": ["city"]}}}])");
  std::vector<Case> cases = {
      {"json_object", grammar::json_object_grammar()},
      {"schema:person", grammar::json_schema_grammar(person)},
      {"schema:invoice", grammar::json_schema_grammar(invoice)},
      {"schema:article", grammar::json_schema_grammar(article)},
      {"tool_call", server::tool_call_grammar(tools, false)},
  };

  const int used =
      grammar::GrammarIndex(
          std::make_shared<const grammar::Grammar>(grammar::parse_gbnf("root ::= \"a\"")), vocab,
          depth, threads)
          .walk_threads();
  std::printf(
      "grammar mask benchmark: Qwen3 vocabulary %d tokens (%zu bytes max), %u hardware "
      "threads, the walk of a new context over %d thread%s\n",
      vocab->size(), vocab->max_token_bytes(), std::thread::hardware_concurrency(), used,
      used == 1 ? "" : "s");
  std::printf("tokenizer load %.0f ms, vocabulary index build %.0f ms (once per process)\n",
              load_ms, vocab_ms);
  std::printf(
      "%d episodes x <= %d steps per schema; a step = one fill_mask; episodes 1-%d cold, "
      "the rest warm; context depth %d\n"
      "'cached p50/p99': the warm steps whose contexts were all in the cache (no new entry)\n"
      "'all p99': every step, cold episodes included; 'new ctx p50': the steps that made a new "
      "cache entry\n\n",
      episodes, steps, std::max(1, episodes / 4), depth);
  std::printf("%-16s %9s %8s | %9s %9s %9s | %9s %9s %9s %9s | %10s %10s | %9s %11s | %7s\n",
              "schema", "compile", "cache", "cold p50", "cold p99", "cold max", "warm p50",
              "warm p99", "warm max", "mean", "cached p50", "cached p99", "all p99", "new ctx p50",
              "steps");
  std::vector<uint32_t> mask((size_t(vocab->size()) + 31) / 32);
  for (const auto& c : cases) {
    t0 = Clock::now();
    auto index = std::make_shared<grammar::GrammarIndex>(
        std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(c.gbnf)), vocab, depth,
        threads);
    if (parallel_ms >= 0) index->set_parallel_walk_ms(parallel_ms);
    const double compile_ms = ms_since(t0);
    std::vector<double> cold, warm, cached, all, fresh;
    int total = 0;
    for (int e = 0; e < episodes; ++e) {
      std::mt19937 rng(uint32_t(1000 + e));
      grammar::Matcher m(index);
      for (int s = 0; s < steps && !m.finished(); ++s) {
        const size_t entries = index->cached_entries();
        const auto t = Clock::now();
        m.fill_mask(mask);
        const double ms = ms_since(t);
        const bool is_cold = e < std::max(1, episodes / 4);
        (is_cold ? cold : warm).push_back(ms);
        all.push_back(ms);
        const bool made_entry = index->cached_entries() != entries;
        if (made_entry) fresh.push_back(ms);
        if (!is_cold && !made_entry) cached.push_back(ms);
        ++total;
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < vocab->size(); ++id)
          if (mask[size_t(id) / 32] >> (id % 32) & 1u) allowed.push_back(id);
        if (allowed.empty()) break;
        // Prefer ending when possible (a model ends its answer), else a random allowed token.
        int32_t pick = allowed[rng() % allowed.size()];
        if (m.complete() && rng() % 2 == 0) pick = vocab->end_tokens()[0];
        if (!m.accept_token(pick)) {
          std::fprintf(stderr, "%s: the mask allowed token %d that the matcher rejects\n",
                       c.name.c_str(), pick);
          return 1;
        }
      }
    }
    double mean = 0;
    for (double x : warm) mean += x;
    mean /= std::max<size_t>(warm.size(), 1);
    std::printf(
        "%-16s %6.1f ms %8zu | %6.3f ms %6.2f ms %6.1f ms | %6.3f ms %6.3f ms %6.2f ms "
        "%6.3f ms | %7.3f ms %7.3f ms | %6.3f ms %8.3f ms | %7d\n",
        c.name.c_str(), compile_ms, index->cached_entries(), pct(cold, 0.5), pct(cold, 0.99),
        pct(cold, 1.0), pct(warm, 0.5), pct(warm, 0.99), pct(warm, 1.0), mean, pct(cached, 0.5),
        pct(cached, 0.99), pct(all, 0.99), pct(fresh, 0.5), total);
  }
  return 0;
}
