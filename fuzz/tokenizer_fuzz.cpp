// libFuzzer entry for the tokenizer target (see fuzz_targets.h; run: tools/fuzz.sh tokenizer).
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lilac::fuzz::tokenizer(data, size);
  return 0;
}
