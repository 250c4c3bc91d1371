// libFuzzer entry for the request target (see fuzz_targets.h; run: tools/fuzz.sh request).
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lilac::fuzz::request(data, size);
  return 0;
}
