// The kernel lab's q_moe_grouped versions 15-18 (s40; README.md here): the rows32 gate_up with a
// producer warp (ws_gate_up.cuh; its file comment has the design) at 10 stages with 1 or 2
// k-tiles per wgmma wait, at 6 stages with 2, and (v18) at 10 with 2 and the weights copied by
// cp.async instead of the bulk copy engine.
#include "q_moe_grouped_lab.h"
#include "ws_gate_up.cuh"

namespace lilac::lab {
using namespace cuda;

void q_moe_grouped_ws_lab(int version, const bf16* x, int H, const QMatrix& gate_up, int I,
                          const MoeRouting& r, bf16* act, cudaStream_t stream) {
  switch (version) {
    case 15:
      qmoe_ws::launch_ws_gate_up<10, 1>(x, H, gate_up, I, r, act, nullptr, stream);
      return;
    case 16:
      qmoe_ws::launch_ws_gate_up<10, 2>(x, H, gate_up, I, r, act, nullptr, stream);
      return;
    case 17:
      qmoe_ws::launch_ws_gate_up<6, 2>(x, H, gate_up, I, r, act, nullptr, stream);
      return;
    case 18:
      qmoe_ws::launch_ws_gate_up<10, 2, false>(x, H, gate_up, I, r, act, nullptr, stream);
      return;
  }
  fail("q_moe_grouped lab: no version {} in v15_ws.cu (15-18)", version);
}

}  // namespace lilac::lab
