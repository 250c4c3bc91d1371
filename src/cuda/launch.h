// Programmatic dependent launch (PDL) for the decode kernels of norm, linear, moe_decode and
// sampling. With PDL a kernel may start while the previous kernel in the stream is still running:
// it issues the loads that do not depend on that kernel (weights) and then waits in
// `griddepcontrol.wait` until the previous kernel has finished and its writes are visible. In a
// decode step of ~300 launches this hides most of each launch's ramp (block scheduling, the first
// DRAM round trip) behind the previous kernel's tail.
//
// Only kernels that wait before touching any memory another kernel writes may be launched this
// way: the launchers of the four families above do so for their own kernels (each kernel calls
// pdl_wait() from vec_util.cuh before its first dependent load or any global store). Kernels of
// other families are launched normally and wait for full completion as usual. Of a prompt chunk's
// own kernels only the grouped wgmma expert kernels use it (s27: prefill +0.7-1.0% at 256-512
// tokens); the GDN and attention prefill kernels measured slower or even under PDL (their early
// blocks hold shared memory the kernel before them still needs; docs/kernels.md, s27), and so did
// the wide dense projections (q_gemm_wgmma's 128 / 256-token forms) in three prologues (s39).
#pragma once

#include <cuda_runtime.h>

namespace lilac::cuda {

// Whether the launchers above use PDL: on unless set off (the CUDA backend applies its
// CudaOptions::pdl, which the runtime reads from LILAC_PDL), and only on devices of compute
// capability 9.0 or newer; a kernel is launched with PDL only if its machine code was built for
// sm_90 or newer (it contains the wait), and never on the legacy default stream (stream 0).
bool pdl_enabled();
// Sets the process-wide setting (the backend from its options; benchmarks and tests compare both
// ways). Takes effect for the next launch; graphs captured before keep what they captured.
void set_pdl_enabled(bool on);

// Sets the setting for a scope and restores it after (e.g. off while per-kernel events are
// recorded between launches: events break the overlap anyway).
class ScopedPdl {
 public:
  explicit ScopedPdl(bool on);
  ~ScopedPdl();
  ScopedPdl(const ScopedPdl&) = delete;
  ScopedPdl& operator=(const ScopedPdl&) = delete;

 private:
  int saved_;
};

// Whether a launch of `kernel` (a __global__ function) on `stream` uses PDL now.
bool pdl_for(const void* kernel, cudaStream_t stream);

// Whether the same kernels prefetch weights into L2 ahead of their loads (cp.async.bulk.prefetch.L2
// on sm_90: the GEMV's first item before pdl_wait, the routed experts' rows once the router's
// choice is read, the shared expert's rows before the wait). Off: the layer bench measured it
// slower (docs/kernels.md); the setter is for benchmarks and tests comparing both ways (no
// environment switch: a measured loser, not a runtime choice).
bool l2_prefetch_enabled();
void set_l2_prefetch_enabled(bool on);

// Kernels checked by pdl_for so far: how many run machine code with the wait (launched with PDL)
// and how many do not (launched normally). For benchmark reports.
void pdl_kernel_counts(int* with_wait, int* without);

}  // namespace lilac::cuda
