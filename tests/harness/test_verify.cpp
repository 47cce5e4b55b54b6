#include "flashbench/verify.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace fb;

namespace {
AttentionProblem small() {
  AttentionProblem p;
  p.heads_q = p.heads_kv = 1;
  p.seqlen_q = 2;
  p.seqlen_kv = 3;
  p.head_dim = 2;
  p.dtype = DType::bf16;
  return p;
}
} // namespace

TEST(Verify, PassesWithinToleranceAndFailsBeyond) {
  const AttentionProblem p = small();
  const Tolerance t = tolerance_for(p.dtype);
  std::vector<double> ref = {0.5, -0.25, 1.0, 2.0}, ref_lse = {1.0, 2.0};
  std::vector<float> out = {0.501f, -0.2505f, 1.01f, 2.02f}, lse = {1.0f, 2.0f};
  EXPECT_TRUE(verify<double>(p, out.data(), lse.data(), ref.data(), ref_lse.data(), t).pass);
  out[3] = 2.2f;
  const VerifyResult r = verify<double>(p, out.data(), lse.data(), ref.data(), ref_lse.data(), t);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.mismatches, 1);
  EXPECT_NE(r.detail.find("o[b=0,s=1,h=0,d=1]"), std::string::npos) << r.detail;
}

TEST(Verify, UnwrittenNaNAndWrongMaskedRowsFail) {
  const AttentionProblem p = small();
  const Tolerance t = tolerance_for(p.dtype);
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> ref = {0.0, 0.0, 1.0, 2.0}, ref_lse = {ninf, 2.0};
  std::vector<float> out = {0.f, 0.f, 1.f, 2.f}, lse = {-INFINITY, 2.0f};
  EXPECT_TRUE(verify<double>(p, out.data(), lse.data(), ref.data(), ref_lse.data(), t).pass);
  out[1] = NAN; // poison left in place
  VerifyResult r = verify<double>(p, out.data(), lse.data(), ref.data(), ref_lse.data(), t);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.nonfinite, 1);
  out[1] = 0.f;
  lse[0] = NAN; // a fully masked row must say -inf, not NaN
  EXPECT_FALSE(verify<double>(p, out.data(), lse.data(), ref.data(), ref_lse.data(), t).pass);
  lse[0] = -INFINITY;
  lse[1] = 2.5f;
  EXPECT_FALSE(verify<double>(p, out.data(), lse.data(), ref.data(), ref_lse.data(), t).pass);
}

TEST(Verify, TolerancesTightenWithPrecision) {
  EXPECT_LT(tolerance_for(DType::f32).rtol, tolerance_for(DType::f16).rtol);
  EXPECT_LT(tolerance_for(DType::f16).rtol, tolerance_for(DType::bf16).rtol);
}
