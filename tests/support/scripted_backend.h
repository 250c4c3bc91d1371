// TEST-ONLY backend (tests/support, never in lilac_core or the production binary): instead of
// running a model, each request's sampled tokens come from a script (`lilac_test_server serve
// --scripted FILE`, the client tests; in process, the server and engine tests). It lets the tests
// force exact token texts (reasoning / content / tool-call markup, multibyte characters split
// across tokens) through the real engine, output parser and server.
//
// Script file (JSON): {"responses": [{"match": "weather", "text": "<think>..."}, {"ids": [1, 2]}]}
// A request gets the first response whose "match" (optional) occurs in its decoded prompt. "text"
// is encoded with the model's tokenizer (special tokens parsed); "ids" are used as they are. After
// the script, the backend samples the first eos id (or, with "no_eos": true, repeats the last id).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/backend.h"
#include "tokenizer/tokenizer.h"

namespace lilac::server {

struct ScriptedResponse {
  std::string match;  // empty: matches every prompt
  std::vector<int32_t> ids;
  bool eos = true;  // end with an eos id after the ids
};

class ScriptedBackend : public Backend {
 public:
  // `config` gives the vocab and the other sizes reported; `tokenizer` decodes prompts for "match".
  ScriptedBackend(const ModelConfig& config, const Tokenizer& tokenizer,
                  std::vector<ScriptedResponse> responses);
  // Reads a script file (see above); throws lilac::Error naming the file and entry on a defect.
  static std::vector<ScriptedResponse> load_script(const std::string& path,
                                                   const Tokenizer& tokenizer);
  static std::vector<ScriptedResponse> parse_script(const nlohmann::json& j,
                                                    const Tokenizer& tokenizer,
                                                    const std::string& source);

  std::string name() const override { return "scripted"; }
  std::string device_description() const override { return "scripted (test-only: no model runs)"; }
  const ModelConfig& config() const override { return config_; }
  std::unique_ptr<SequenceState> new_sequence(int64_t max_context) override;
  void forward(SequenceState& state, std::span<const int32_t> ids, std::span<float> logits,
               bool all_logits) override;
  void begin_sampling(SequenceState& state, std::span<const int32_t> prompt,
                      const SamplingParams& params) override;
  StepResult step(SequenceState& state, std::span<const int32_t> ids,
                  uint64_t sample_index) override;
  // step() for every sampled item: the script forces the output, a TokenConstraint does not
  // apply (the engine still calls its accept()).
  std::vector<StepResult> step_batch(std::span<const BatchItem> items) override;
  std::unique_ptr<SequenceState> clone(const SequenceState& state) override;
  size_t state_bytes(const SequenceState& state) const override;

  // Seconds each step() sleeps (slows generation down for cancellation and load tests).
  void set_step_delay(double seconds) { step_delay_ = seconds; }

 private:
  ModelConfig config_;
  const Tokenizer& tokenizer_;
  std::vector<ScriptedResponse> responses_;
  double step_delay_ = 0;
};

}  // namespace lilac::server
