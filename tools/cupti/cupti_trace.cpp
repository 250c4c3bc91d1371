// A kernel timeline without Nsight Systems: a CUPTI injection library (the CUDA driver loads it
// when CUDA_INJECTION64_PATH names it and calls InitializeInjection) that records every kernel's
// GPU start and end, graph nodes included (CUPTI traces a graph's kernels one by one unless
// graph-level tracing is asked for), and writes them as tab-separated lines
//     start_ns <TAB> end_ns <TAB> demangled name
// to $LILAC_CUPTI_OUT (default cupti-kernels.tsv) when the process exits. tools/nsys_steps.py
// reads that file like an nsys export. The GPU machine has CUPTI (this machine and CI do not), so
// tools/gpu-steps.sh builds it there when nsys is absent:
//     g++ -O2 -shared -fPIC -I<cupti>/include -DKERNEL_RECORD=CUpti_ActivityKernelN
//         tools/cupti/cupti_trace.cpp -L<cupti>/lib64 -lcupti -o libcupti_trace.so
// KERNEL_RECORD names the newest kernel record of the installed CUPTI (the one it emits); the
// fields used here (start, end, name) are in every version.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>

#ifndef KERNEL_RECORD
#error "define KERNEL_RECORD as the installed CUPTI's newest CUpti_ActivityKernel record"
#endif

namespace {

FILE* out = nullptr;
constexpr size_t kBufferBytes = 16u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const KERNEL_RECORD*>(record);
    int status = 0;
    char* name = abi::__cxa_demangle(k->name, nullptr, nullptr, &status);
    std::fprintf(out, "%llu\t%llu\t%s\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end), status == 0 && name ? name : k->name);
    std::free(name);
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped) std::fprintf(stderr, "cupti_trace: %zu records dropped\n", dropped);
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  if (out) std::fclose(out);
  out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("LILAC_CUPTI_OUT");
  out = std::fopen(path ? path : "cupti-kernels.tsv", "w");
  if (!out) return 0;
  std::atexit(flush_at_exit);
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "cupti_trace: CUPTI refused the kernel activity\n");
    return 0;
  }
  return 1;
}
