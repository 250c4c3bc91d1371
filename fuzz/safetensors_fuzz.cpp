// libFuzzer entry for the safetensors target (see fuzz_targets.h; run: tools/fuzz.sh safetensors).
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lilac::fuzz::safetensors(data, size);
  return 0;
}
