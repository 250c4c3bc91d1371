// libFuzzer entry for the jinja target (see fuzz_targets.h; run: tools/fuzz.sh jinja).
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lilac::fuzz::jinja(data, size);
  return 0;
}
