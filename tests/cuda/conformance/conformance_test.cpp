// Turns the conformance registry (conformance.h) into GoogleTests: one value-parameterised test
// per registered case, Conformance/Op.MatchesCpuTwin/<op>_<shape>_<dtype>.
#include "conformance.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>

#include "../cuda_test_util.h"

namespace lilac::test {

std::vector<OpCase> all_cases() {
  std::vector<OpCase> all;
  for (CaseGenerator g : case_generators())
    for (OpCase& c : g()) all.push_back(std::move(c));
  return all;
}

std::string case_name(const OpCase& c) {
  std::string s = c.op + "_" + c.shape + "_" + c.dtype;
  for (char& ch : s)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')))
      ch = '_';
  return s;
}

namespace {

class Op : public ::testing::TestWithParam<OpCase> {};

TEST_P(Op, MatchesCpuTwin) {
  const OpCase& c = GetParam();
  SCOPED_TRACE("op " + c.op + ", shape " + c.shape + ", " + c.dtype + ", twin " + c.twin);
  LILAC_REQUIRE_GPU();
  c.run();
}

INSTANTIATE_TEST_SUITE_P(Conformance, Op, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& i) {
                           return case_name(i.param);
                         });

// The registry itself (no GPU needed): every family registered, names unique, each case complete.
TEST(ConformanceRegistry, NamesAreUniqueAndCasesComplete) {
  const std::vector<OpCase> cases = all_cases();
  std::set<std::string> names;
  std::map<std::string, int> per_op;
  for (const OpCase& c : cases) {
    EXPECT_TRUE(names.insert(case_name(c)).second) << "duplicate case " << case_name(c);
    EXPECT_FALSE(c.op.empty() || c.shape.empty() || c.dtype.empty() || c.twin.empty())
        << case_name(c);
    EXPECT_TRUE(bool(c.run)) << case_name(c);
    ++per_op[c.op];
  }
  // Every op that has conformance cases (add a new op's name here).
  std::istringstream ops(
      "rms_norm embed gemv gemv_rms gemv_rows gemm q_gemv q_gemv_rms_staged "
      "q_gemv_rows q_embed q_gemm router_topk "
      "moe_router moe_decode "
      "moe_route moe_prefill moe_shared_swiglu q_moe_decode q_moe_prefill q_moe_small "
      "qk_norm_rope_store "
      "attention_decode_qkv attention_prefill attention_prefill_wgmma "
      "attention_prefill_wgmma_overlap attention_prefill_wgmma_ws attention_prefill_wgmma_pingpong "
      "attention_chain gdn_decode "
      "gdn_prefill gdn_chain argmax quantize_mlx repack_mlx");
  std::set<std::string> listed;
  for (std::string op; ops >> op;) {
    listed.insert(op);
    EXPECT_GT(per_op[op], 0) << "no conformance case registered for " << op;
  }
  for (const auto& [op, n] : per_op)
    EXPECT_TRUE(listed.count(op)) << op << " (" << n << " cases) is missing from the list above";
}

}  // namespace
}  // namespace lilac::test
