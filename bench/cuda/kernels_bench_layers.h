// The layer section of lilac_cuda_bench_kernels (kernels_bench_layers.cpp: host C++20, since it
// uses the CUDA backend's API; kernels_bench.cu is C++17 device code).
#pragma once

#include <string>

namespace lilac::bench {

// Times the production decode layer (CudaBackend::decode_layer) per layer kind on the full-size
// synthetic model, `weights` "bf16", "q4" or "both", at `context` tokens; medians of `runs` graph
// replays. Prints a table.
void bench_decode_layers(const std::string& weights, int context, int runs);

}  // namespace lilac::bench
