#include "model/state_format.h"

#include <string>

#include "util/error.h"

namespace lilac {

GdnStateFormat parse_gdn_state_format(std::string_view s) {
  if (s == "f32") return GdnStateFormat::f32;
  if (s == "bf16") return GdnStateFormat::bf16;
  fail("unknown Gated DeltaNet state format '{}' (expected f32 or bf16)", std::string(s));
}

const char* gdn_state_format_name(GdnStateFormat f) {
  return f == GdnStateFormat::bf16 ? "bf16" : "f32";
}

}  // namespace lilac
