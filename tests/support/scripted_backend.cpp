#include "support/scripted_backend.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "util/error.h"

namespace lilac::server {
namespace {

struct ScriptedState : SequenceState {
  int64_t max_context = 0;
  std::vector<int32_t> tokens;  // everything consumed (prompt and fed-back outputs)
  const ScriptedResponse* script = nullptr;
  void advance(std::span<const int32_t> ids) {
    if (position_ + int64_t(ids.size()) > max_context)
      fail("context overflow: {} + {} tokens > {}", position_, ids.size(), max_context);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    position_ += int64_t(ids.size());
  }
};

}  // namespace

ScriptedBackend::ScriptedBackend(const ModelConfig& config, const Tokenizer& tokenizer,
                                 std::vector<ScriptedResponse> responses)
    : config_(config), tokenizer_(tokenizer), responses_(std::move(responses)) {
  if (responses_.empty()) fail("scripted backend: the script has no responses");
}

std::vector<ScriptedResponse> ScriptedBackend::load_script(const std::string& path,
                                                           const Tokenizer& tokenizer) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot read the script file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) fail("{}: not valid JSON", path);
  return parse_script(j, tokenizer, path);
}

std::vector<ScriptedResponse> ScriptedBackend::parse_script(const nlohmann::json& j,
                                                            const Tokenizer& tokenizer,
                                                            const std::string& source) {
  if (!j.is_object() || !j.contains("responses") || !j["responses"].is_array() ||
      j["responses"].empty())
    fail("{}: expected {{\"responses\": [ ... ]}} with at least one response", source);
  std::vector<ScriptedResponse> out;
  for (size_t i = 0; i < j["responses"].size(); ++i) {
    const auto& e = j["responses"][i];
    ScriptedResponse r;
    if (!e.is_object()) fail("{}: responses[{}] is not an object", source, i);
    if (e.contains("match")) {
      if (!e["match"].is_string()) fail("{}: responses[{}].match is not a string", source, i);
      r.match = e["match"].get<std::string>();
    }
    if (e.contains("text") && e["text"].is_string()) {
      r.ids = tokenizer.encode(e["text"].get<std::string>(), true);
    } else if (e.contains("ids") && e["ids"].is_array()) {
      for (const auto& id : e["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= tokenizer.size())
          fail("{}: responses[{}].ids holds {} (not a token id)", source, i, id.dump());
        r.ids.push_back(id.get<int32_t>());
      }
    } else {
      fail("{}: responses[{}] needs a \"text\" string or an \"ids\" array", source, i);
    }
    if (e.contains("no_eos") && e["no_eos"].is_boolean()) r.eos = !e["no_eos"].get<bool>();
    if (r.ids.empty() && !r.eos) fail("{}: responses[{}] is empty and has no eos", source, i);
    out.push_back(std::move(r));
  }
  return out;
}

std::unique_ptr<SequenceState> ScriptedBackend::new_sequence(int64_t max_context) {
  auto st = std::make_unique<ScriptedState>();
  st->max_context = max_context;
  return st;
}

void ScriptedBackend::forward(SequenceState& state, std::span<const int32_t> ids,
                              std::span<float> logits, bool all_logits) {
  auto& st = static_cast<ScriptedState&>(state);
  st.advance(ids);
  (void)all_logits;
  std::fill(logits.begin(), logits.end(), 0.0f);
}

void ScriptedBackend::begin_sampling(SequenceState& state, std::span<const int32_t> prompt,
                                     const SamplingParams& params) {
  Backend::begin_sampling(state, prompt, params);
  auto& st = static_cast<ScriptedState&>(state);
  std::string text;
  try {
    text = tokenizer_.decode(prompt);
  } catch (const std::exception&) {
    text.clear();  // ids outside the tokenizer (warm-up): only match-less responses apply
  }
  st.script = nullptr;
  for (const auto& r : responses_)
    if (r.match.empty() || text.find(r.match) != std::string::npos) {
      st.script = &r;
      break;
    }
}

StepResult ScriptedBackend::step(SequenceState& state, std::span<const int32_t> ids,
                                 uint64_t sample_index) {
  auto& st = static_cast<ScriptedState&>(state);
  st.advance(ids);
  if (step_delay_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(step_delay_));
  StepResult r;
  const auto& eos = tokenizer_.eos_ids();
  const int32_t end_id = eos.empty() ? 0 : eos.front();
  if (!st.script) {
    r.token = end_id;
  } else if (sample_index < st.script->ids.size()) {
    r.token = st.script->ids[sample_index];
  } else {
    r.token = st.script->eos || st.script->ids.empty() ? end_id : st.script->ids.back();
  }
  // A fixed, well-formed distribution: the scripted token first, then the lowest other ids.
  r.logprob = -0.25f;
  for (int32_t id = 0; int(r.top.size()) < st.sampling.top_logprobs && id < sampling_vocab();
       ++id) {
    if (r.top.empty()) r.top.push_back({r.token, r.logprob});
    if (id != r.token && int(r.top.size()) < st.sampling.top_logprobs)
      r.top.push_back({id, -4.0f - float(id) / 64});
  }
  if (st.penalties_active) st.penalties.add_output(r.token);
  return r;
}

std::vector<StepResult> ScriptedBackend::step_batch(std::span<const BatchItem> items) {
  std::vector<StepResult> out(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].sample)
      out[i] = step(*items[i].state, items[i].ids, items[i].sample_index);
    else
      forward(*items[i].state, items[i].ids, {}, false);
  }
  return out;
}

std::unique_ptr<SequenceState> ScriptedBackend::clone(const SequenceState& state) {
  return std::make_unique<ScriptedState>(static_cast<const ScriptedState&>(state));
}

size_t ScriptedBackend::state_bytes(const SequenceState& state) const {
  return sizeof(ScriptedState) +
         static_cast<const ScriptedState&>(state).tokens.size() * sizeof(int32_t);
}

}  // namespace lilac::server
