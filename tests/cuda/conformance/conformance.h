// The GPU conformance registry (label gpu): every kernel family checked against its CPU twin
// (src/cpu/) on the real model's shapes and on awkward ones, in the style of llama.cpp's
// test-backend-ops. A family's file registers its cases once, at static-initialisation time:
//
//   LILAC_CONFORMANCE_CASES(gemv) {
//     return {{"gemv", "in_proj_12352x2048", "bf16", "cpu::matmul", [] { check_shape(...); }}};
//   }
//
// conformance_test.cpp turns each case into one value-parameterised GoogleTest named
// Conformance/Op.MatchesCpuTwin/<op>_<shape>_<dtype>, so `--gtest_filter='Conformance*'` runs them
// all and `--gtest_filter='*gemv_*'` one op. A case's body uploads its inputs, runs the kernel,
// runs the twin and compares with `within` (kernel_check.h): a per-element tolerance derived from
// the arithmetic (dot_tolerance for f32 sums of bf16 products, q_gemv_tolerance for the 4-bit
// kernels, one bf16 ulp for bf16 stores), reporting the count, the first and the worst element.
// How to add an op and its cases: docs/adding-an-op.md.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace lilac::test {

struct OpCase {
  std::string op;             // the kernel, e.g. "gemv", "q_gemm", "moe_decode"
  std::string shape;          // role and dims, e.g. "in_proj_12352x2048", "M130_N12352_K2048_f32"
  std::string dtype;          // weight format: "bf16", "q4", "q8", "f32"
  std::string twin;           // the CPU reference it is held to, e.g. "cpu::matmul"
  std::function<void()> run;  // uploads, launches, compares (EXPECT_* / ASSERT_*)
};

using CaseGenerator = std::vector<OpCase> (*)();

// Every registered family's generator (filled by the static registrars below, read lazily).
inline std::vector<CaseGenerator>& case_generators() {
  static std::vector<CaseGenerator> g;
  return g;
}

struct CaseRegistrar {
  explicit CaseRegistrar(CaseGenerator g) { case_generators().push_back(g); }
};

// The registry: all families' cases, built on first use (after static initialisation).
std::vector<OpCase> all_cases();

// The GoogleTest name of a case: <op>_<shape>_<dtype>, [A-Za-z0-9_] only.
std::string case_name(const OpCase& c);

// How GoogleTest prints a case (a failure's "where GetParam() = ..."): its name and twin.
inline void PrintTo(const OpCase& c, std::ostream* os) {
  *os << c.op << " " << c.shape << " " << c.dtype << " vs " << c.twin;
}

}  // namespace lilac::test

#define LILAC_CONFORMANCE_CONCAT_(a, b) a##b
#define LILAC_CONFORMANCE_CASES(family)                                                  \
  static std::vector<::lilac::test::OpCase> LILAC_CONFORMANCE_CONCAT_(family, _cases)(); \
  static const ::lilac::test::CaseRegistrar LILAC_CONFORMANCE_CONCAT_(                   \
      family, _registrar){&LILAC_CONFORMANCE_CONCAT_(family, _cases)};                   \
  static std::vector<::lilac::test::OpCase> LILAC_CONFORMANCE_CONCAT_(family, _cases)()
