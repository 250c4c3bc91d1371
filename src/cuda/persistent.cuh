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

__device__ __forceinline__ void release_store(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Called by every thread of the block once its stores for the task are issued. kFence: a
// __threadfence before the release add (what cooperative groups' grid sync does); without it the
// release alone orders the block's stores (cumulative through the barrier: the PTX memory model's
// causality order). The chain bench (bench/cuda/chain_bench.cu) times both.
template <bool kFence = true>
__device__ __forceinline__ void signal(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (kFence) __threadfence();
    release_add(counter, 1u);
  }
}

// Called by every thread of the block: returns once *counter has reached `target` (modulo 2^32),
// true; or, after spin_limit polls, false for every thread, with *error set to 1. The polls
// back off (a short sleep) after the first 64, so that waiting blocks leave the L2 to the ones
// working.
// sleep_after: polls before the back-off starts (the chain bench times it without).
__device__ __forceinline__ bool wait(const unsigned* counter, unsigned target, unsigned* error,
                                     unsigned spin_limit = 1u << 26, unsigned sleep_after = 64) {
  int failed = 0;
  if (threadIdx.x == 0) {
    unsigned polls = 0;
    while (int(acquire_load(counter) - target) < 0) {
      if (++polls >= spin_limit) {
        failed = 1;
        atomicExch(error, 1u);
        break;
      }
      if (polls > sleep_after) __nanosleep(32);
    }
  }
  return __syncthreads_or(failed) == 0;
}

// The same dependency as one flag per producer instead of one counter: no atomics, so the
// producers' signals do not queue on one L2 address. Producer block b stores `epoch` into
// flags[b] (a release store after the block barrier); a waiter's first warp reads all
// `producers` flags (lane l: flags l, l + 32, ...) with acquire loads until every one has reached
// `target`. One flag array per op; epochs count up as the counters do.
__device__ __forceinline__ void signal_flag(unsigned* flags, unsigned epoch) {
  __syncthreads();
  if (threadIdx.x == 0) release_store(flags + blockIdx.x, epoch);
}

__device__ __forceinline__ bool wait_flags(const unsigned* flags, int producers, unsigned target,
                                           unsigned* error, unsigned spin_limit = 1u << 26) {
  int failed = 0;
  if (threadIdx.x < 32) {
    unsigned polls = 0;
    for (;;) {
      bool ready = true;
      for (int p = int(threadIdx.x); p < producers; p += 32)
        ready = ready && int(acquire_load(flags + p) - target) >= 0;
      if (__all_sync(0xffffffffu, ready)) break;
      if (++polls >= spin_limit) {
        failed = 1;
        if (threadIdx.x == 0) atomicExch(error, 1u);
        break;
      }
      if (polls > 64) __nanosleep(32);
    }
  }
  return __syncthreads_or(failed) == 0;
}

}  // namespace lilac::cuda::persistent
