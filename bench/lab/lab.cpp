// The kernel lab's shared helpers and its main (lab.h).
#include "lab.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../cuda/bench_timing.h"

namespace lilac::lab {

Error compare(const std::vector<float>& got, const std::vector<float>& want, double atol,
              double rtol) {
  Error e;
  if (got.size() != want.size()) {
    e.worst = INFINITY;
    return e;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (!std::isfinite(d)) {
      e.max_abs = e.worst = INFINITY;
      return e;
    }
    e.max_abs = std::max(e.max_abs, d);
    e.worst = std::max(e.worst, d / (atol + rtol * std::fabs(double(want[i]))));
  }
  return e;
}

void merge(Error& into, const Error& e) {
  into.max_abs = std::max(into.max_abs, e.max_abs);
  into.worst = std::max(into.worst, e.worst);
}

bool report_check(const std::string& what, const Error& e) {
  std::printf("  check %-44s max |err| %9.3e (%5.2f of the tolerance) %s\n", what.c_str(),
              e.max_abs, e.worst, e.ok() ? "ok" : "FAIL");
  std::fflush(stdout);
  return e.ok();
}

double graph_us(cudaStream_t s, int runs, int launches, const std::function<void(int)>& launch) {
  const double seconds = bench::median_graph_replay_seconds(s, runs, [&] {
    for (int i = 0; i < launches; ++i) launch(i);
  });
  return seconds * 1e6 / launches;
}

}  // namespace lilac::lab

namespace {

void usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--op NAME] [--version N] [--runs N (>= 5)] [--list]\n", argv0);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lilac::lab;
  Options opt;
  std::string only_op;
  int only_version = 0;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--op") && i + 1 < argc) {
      only_op = argv[++i];
    } else if (!std::strcmp(argv[i], "--version") && i + 1 < argc) {
      only_version = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      opt.runs = std::max(5, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--list")) {
      list = true;
    } else {
      usage(argv[0]);
      return 2;
    }
  }
  const std::vector<Op> ops = {gdn_decode_op(), attention_decode_op(), q_gemv_rows_op(),
                               q_gemm_op(),     q_moe_grouped_op(),    q_moe_small_op(),
                               sampling_op()};
  bool known = only_op.empty();
  for (const Op& op : ops) known = known || only_op == op.name;
  if (!known) {
    std::fprintf(stderr, "unknown op '%s'; --list names them\n", only_op.c_str());
    return 2;
  }
  if (list) {
    for (const Op& op : ops) {
      std::printf("%s (%s)\n", op.name, op.shapes);
      for (const Version& v : op.versions)
        std::printf("  v%d %-10s %s%s\n", v.number, v.name, v.summary,
                    v.production ? " [production]" : "");
    }
    return 0;
  }
  bool all_ok = true;
  int ran = 0;
  try {
    if (lilac::cuda::device_count() == 0) {
      std::fprintf(stderr, "no CUDA device\n");
      return 1;
    }
    cudaDeviceProp prop{};
    LILAC_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("lilac kernel lab on %s (%d SMs, cc %d.%d); median of %d graph replays\n",
                prop.name, prop.multiProcessorCount, prop.major, prop.minor, opt.runs);
    for (const Op& op : ops) {
      if (!only_op.empty() && only_op != op.name) continue;
      for (const Version& v : op.versions) {
        if (only_version && only_version != v.number) continue;
        std::printf("\n== %s v%d %s%s: %s\n", op.name, v.number, v.name,
                    v.production ? " (production)" : "", v.summary);
        std::fflush(stdout);
        all_ok = op.run(opt, v) && all_ok;
        ++ran;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lilac_cuda_bench_lab: %s\n", e.what());
    return 1;
  }
  if (ran == 0) {
    std::fprintf(stderr, "no version %d of %s\n", only_version,
                 only_op.empty() ? "any op" : only_op.c_str());
    return 2;
  }
  std::printf("\n%s\n", all_ok ? "all checks passed" : "SOME CHECKS FAILED");
  return all_ok ? 0 : 1;
}
