// libFuzzer entry for the model_config target (see fuzz_targets.h; run: tools/fuzz.sh
// model_config).
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lilac::fuzz::model_config(data, size);
  return 0;
}
