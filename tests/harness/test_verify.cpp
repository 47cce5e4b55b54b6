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

TEST(Verify, E4m3ElementBoundScalesWithTheReferenceOfAbsV) {
  AttentionProblem p = small();
  p.dtype = DType::e4m3;
  const Tolerance t = tolerance_for(p.dtype);
  ASSERT_GT(t.p_round, 0);
  std::vector<double> ref = {0.5, -0.25, 1.0, 2.0}, ref_lse = {1.0, 2.0};
  std::vector<double> ref_abs = {
      2.0, 2.0, 2.0, 2.0}; // |V| averaged by the softmax: P's rounding may move O by 0.075 x 2
  std::vector<float> out = {0.5f, -0.25f, 1.0f, 2.0f}, lse = {1.0f, 2.0f};
  out[0] = 0.5f + 0.1f; // inside 1e-2 + 2e-2 x 0.5 + 0.075 x 2 = 0.17
  EXPECT_FALSE(verify<double>(p, out.data(), lse.data(), ref.data(), ref_lse.data(), t).pass)
      << "without the |V| reference the element bound is bf16's";
  // 0.1 / ||ref|| = 0.043 is under the norm bound (5%): only the element bound decides here.
  EXPECT_TRUE(
      verify<double>(p, out.data(), lse.data(), ref.data(), ref_lse.data(), t, ref_abs.data())
          .pass);
  out[0] = 0.5f + 0.2f; // beyond it
  EXPECT_FALSE(
      verify<double>(p, out.data(), lse.data(), ref.data(), ref_lse.data(), t, ref_abs.data())
          .pass);
}

TEST(Verify, NormBoundFailsWhatEveryElementBoundLetsThrough) {
  AttentionProblem p = small();
  p.dtype = DType::e4m3;
  const Tolerance t = tolerance_for(p.dtype);
  std::vector<double> ref = {0.5, -0.25, 1.0, 2.0}, ref_lse = {1.0, 2.0},
                      ref_abs = {2.0, 2.0, 2.0, 2.0};
  std::vector<float> out = {0.6f, -0.15f, 1.11f, 2.13f},
                     lse = {1.0f, 2.0f}; // each within its element bound
  const VerifyResult r =
      verify<double>(p, out.data(), lse.data(), ref.data(), ref_lse.data(), t, ref_abs.data());
  EXPECT_EQ(r.mismatches, 0);
  EXPECT_GT(r.rel_l2_error, t.rel_l2);
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.detail.find("rel_l2"), std::string::npos) << r.detail;
}
