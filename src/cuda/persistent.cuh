// Dependencies inside one resident kernel: the device counters of the persistent decode step
// (docs/persistent-decode.md; the schedule's tasks and counters: model/decode_schedule.h). A
// block that finished a task's stores signals the task's counter; a block that needs an op's
// output waits until the op's counter counts all its producers. Counters only count up: step s
// of a replayed graph waits for s x producers, so nothing resets them between steps (the
// comparison is modulo 2^32, good while a wait is less than 2^31 signals behind).
//
// Memory order. signal(): a block barrier (every thread's stores happen before thread 0's next
// instruction), then thread 0's fence and release add at GPU scope (cumulative: it releases the
// stores it observed through the barrier). wait(): thread 0's acquire load at GPU scope, then a
// block barrier (every thread's later loads happen after it). Data another block wrote must be
// read past L1 (ld.global.cg, __ldcg, or the bulk copy engine): L1 is not coherent.
//
// Residency. Every block of such a grid must be resident at once (no more blocks than the
// occupancy allows): a block waiting for a block that cannot start would wait for ever. wait()
// therefore gives up after `spin_limit` polls and sets *error, so that a schedule bug becomes a
// reported failure instead of a stuck GPU.
#pragma once

#include <cstdint>

namespace lilac::cuda::persistent {

__device__ __forceinline__ void release_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned acquire_load(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Called by every thread of the block once its stores for the task are issued.
__device__ __forceinline__ void signal(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    release_add(counter, 1u);
  }
}

// Called by every thread of the block: returns once *counter has reached `target` (modulo 2^32),
// true; or, after spin_limit polls, false for every thread, with *error set to 1. The polls
// back off (a short sleep) after the first 64, so that waiting blocks leave the L2 to the ones
// working.
__device__ __forceinline__ bool wait(const unsigned* counter, unsigned target, unsigned* error,
                                     unsigned spin_limit = 1u << 26) {
  int failed = 0;
  if (threadIdx.x == 0) {
    unsigned polls = 0;
    while (int(acquire_load(counter) - target) < 0) {
      if (++polls >= spin_limit) {
        failed = 1;
        atomicExch(error, 1u);
        break;
      }
      if (polls > 64) __nanosleep(32);
    }
  }
  return __syncthreads_or(failed) == 0;
}

}  // namespace lilac::cuda::persistent
