// l2_prefetch (src/cuda/l2_prefetch.h) and the decode steps' L2 prefetch of the next layer
// (CudaOptions::l2_ahead). The prefetch is a hint: no result may change by a bit with it, at any
// fork point or cache hint, in the one-stream graph and in the batched pass (both forms of the
// batched MoE); and the chunks it hands to the copy engine cover exactly the usable bytes of each
// range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/l2_prefetch.h"
#include "cuda_test_util.h"
#include "model/backend.h"
#include "model/qwen36.h"
#include "util/error.h"

namespace lilac::test {
namespace {

int32_t argmax_n(const std::vector<float>& x, int32_t n) {
  return int32_t(std::max_element(x.begin(), x.begin() + n) - x.begin());
}

// Host only: the chunk walk the kernel's threads share.
TEST(L2Prefetch, ChunksCoverEachRangesUsableBytesInOrder) {
  std::vector<char> base(1 << 20);
  // 16-byte aligned starts; sizes: exact chunks, a partial last chunk, a tail under 16 bytes.
  const uint64_t sizes[] = {16, cuda::kL2ChunkBytes, cuda::kL2ChunkBytes + 16,
                            3 * cuda::kL2ChunkBytes + 40, 1000};
  cuda::L2Ranges r;
  r.add(nullptr, 4096);    // ignored: no address
  r.add(base.data(), 15);  // ignored: under one 16-byte unit
  r.add(base.data(), 0);   // ignored
  EXPECT_EQ(r.n, 0);
  uint64_t offset = 0;
  for (uint64_t s : sizes) {
    r.add(base.data() + offset, s);
    offset += (s + 4095) / 4096 * 4096;
  }
  ASSERT_EQ(r.n, 5);
  uint64_t want_chunks = 0;
  for (uint64_t s : sizes)
    want_chunks += (s / 16 * 16 + cuda::kL2ChunkBytes - 1) / cuda::kL2ChunkBytes;
  EXPECT_EQ(cuda::l2_chunk_count(r), want_chunks);
  EXPECT_EQ(r.total(), 16 + cuda::kL2ChunkBytes + cuda::kL2ChunkBytes + 16 +
                           3 * cuda::kL2ChunkBytes + 40 + 1000);

  uint64_t i = 0;
  cuda::L2Chunk c{};
  for (int j = 0; j < r.n; ++j) {
    const char* start = static_cast<const char*>(r.ptr[j]);
    const uint64_t usable = r.bytes[j] / 16 * 16;
    uint64_t covered = 0;
    while (covered < usable) {
      ASSERT_TRUE(cuda::l2_chunk(r, cuda::kL2ChunkBytes, i, c)) << "chunk " << i;
      EXPECT_EQ(static_cast<const char*>(c.ptr), start + covered) << "range " << j;
      EXPECT_GT(c.bytes, 0u);
      EXPECT_LE(c.bytes, cuda::kL2ChunkBytes);
      EXPECT_EQ(c.bytes % 16, 0u);
      covered += c.bytes;
      ++i;
    }
    EXPECT_EQ(covered, usable) << "range " << j;
  }
  EXPECT_EQ(i, want_chunks);
  EXPECT_FALSE(cuda::l2_chunk(r, cuda::kL2ChunkBytes, i, c));
  EXPECT_FALSE(cuda::l2_chunk(r, cuda::kL2ChunkBytes, i + 1000, c));

  cuda::L2Ranges full;
  for (int j = 0; j < cuda::L2Ranges::kMax; ++j) full.add(base.data(), 64);
  EXPECT_THROW(full.add(base.data(), 64), Error);
}

// The launch itself on device memory, both hints, on an ordinary stream (nothing to check but
// that it runs and leaves the bytes alone).
TEST(L2Prefetch, KernelRunsAndLeavesTheBytes) {
  LILAC_REQUIRE_GPU();
  const size_t n = (5u << 20) + 48;
  cuda::DeviceBuffer<uint8_t> a, b;
  a.resize(n);
  b.resize(4096);
  std::vector<uint8_t> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = uint8_t(i * 131u + 7u);
  ASSERT_EQ(cudaMemcpy(a.get(), host.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  cuda::L2Ranges r;
  r.add(a.get(), n);
  r.add(b.get(), 4096);
  for (cuda::L2Hint h : {cuda::L2Hint::normal, cuda::L2Hint::evict_last})
    cuda::l2_prefetch(r, h, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), a.get(), n, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
}

// One stream (graph replays of forward()) and a 16-row and a 4-row batched pass (grouped and
// per-token MoE), with the prefetch at each point and hint: logits bit for bit as without it.
struct Logits {
  std::vector<std::vector<float>> single;  // per decode step
  std::vector<std::vector<float>> batch;   // per pass and row
};

Logits run_steps(const std::shared_ptr<cuda::DeviceModel>& model, const cuda::CudaOptions& o) {
  cuda::CudaBackend b(model, o);
  b.set_sampling_vocab(kQwen36RealTokens);
  const int32_t nv = b.sampling_vocab();
  const size_t V = size_t(b.config().vocab);
  Logits out;
  {
    std::vector<int32_t> prompt(40);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 2654435761u) % 100000u);
    auto seq = b.new_sequence(64);
    std::vector<float> logits(V);
    b.forward(*seq, prompt, logits, false);
    for (int j = 0; j < 4; ++j) {
      int32_t next = argmax_n(logits, nv);
      b.forward(*seq, std::span(&next, 1), logits, false);
      out.single.push_back(logits);
    }
  }
  for (int B : {16, 4}) {
    std::vector<std::unique_ptr<SequenceState>> seqs;
    std::vector<std::vector<int32_t>> feed(static_cast<size_t>(B));
    SamplingParams greedy;
    greedy.temperature = 0;
    for (int i = 0; i < B; ++i) {
      std::vector<int32_t> prompt(size_t(5 + 3 * i));
      for (size_t t = 0; t < prompt.size(); ++t)
        prompt[t] = int32_t((t * 40503u + uint32_t(i) * 977u) % 100000u);
      seqs.push_back(b.new_sequence(128));
      b.forward(*seqs.back(), prompt, {}, false);
      b.begin_sampling(*seqs.back(), prompt, greedy);
      feed[size_t(i)] = {prompt.back()};
    }
    for (int j = 0; j < 3; ++j) {
      std::vector<BatchItem> items(static_cast<size_t>(B));
      for (int i = 0; i < B; ++i) {
        items[size_t(i)].state = seqs[size_t(i)].get();
        items[size_t(i)].ids = feed[size_t(i)];
        items[size_t(i)].sample_index = uint64_t(j);
      }
      const auto res = b.step_batch(items);
      for (int i = 0; i < B; ++i) {
        out.batch.push_back(b.last_batch_logits(i));
        feed[size_t(i)] = {res[size_t(i)].token};
      }
    }
  }
  return out;
}

TEST(L2Prefetch, DecodeStepsBitForBitAsWithoutIt) {
  LILAC_REQUIRE_GPU();
  auto model = synthetic_eight_layers(11, /*q4=*/true);
  cuda::CudaOptions off;
  off.batch_min_rows = 1;
  const Logits want = run_steps(model, off);
  struct Setting {
    cuda::L2Ahead ahead;
    cuda::L2AheadAt at;
    const char* name;
  };
  for (const Setting& s : {Setting{cuda::L2Ahead::normal, cuda::L2AheadAt::mixer, "on, mixer"},
                           Setting{cuda::L2Ahead::normal, cuda::L2AheadAt::router, "on, router"},
                           Setting{cuda::L2Ahead::normal, cuda::L2AheadAt::down, "on, down"},
                           Setting{cuda::L2Ahead::evict_last, cuda::L2AheadAt::router, "last"}}) {
    SCOPED_TRACE(s.name);
    cuda::CudaOptions o = off;
    o.l2_ahead = s.ahead;
    o.l2_ahead_at = s.at;
    const Logits got = run_steps(model, o);
    ASSERT_EQ(got.single.size(), want.single.size());
    for (size_t j = 0; j < want.single.size(); ++j)
      EXPECT_EQ(got.single[j], want.single[j]) << "one stream, step " << j;
    ASSERT_EQ(got.batch.size(), want.batch.size());
    for (size_t j = 0; j < want.batch.size(); ++j)
      EXPECT_EQ(got.batch[j], want.batch[j]) << "batched row-step " << j;
  }
}

}  // namespace
}  // namespace lilac::test
