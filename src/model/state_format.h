// How a sequence keeps the Gated DeltaNet recurrent state [Hv, Dk, Dv] between calls
// (docs/batching.md, "The recurrent state's format"). The arithmetic is f32 either way; bf16
// rounds the state to bf16 (round to nearest even) each time a call stores it: after every decode
// step, and at the end of a prompt chunk (the chunk's own tokens carry it in f32). bf16 halves the
// state's bytes, which the batched decode step reads and writes once per sequence and layer
// (126 MB per sequence per step in f32 at the real shapes), and its memory per sequence slot.
// SGLang offers the same choice (--mamba-ssm-dtype, default float32); f32 is lilac's default and
// the format the HF references use.
#pragma once

#include <string_view>

namespace lilac {

enum class GdnStateFormat { f32, bf16 };

// "f32" or "bf16"; anything else throws lilac::Error naming the value.
GdnStateFormat parse_gdn_state_format(std::string_view s);
const char* gdn_state_format_name(GdnStateFormat f);

}  // namespace lilac
