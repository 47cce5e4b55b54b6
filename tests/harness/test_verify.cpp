#include "flashbench/verify.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
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

// ---- The backward's gradients.
namespace {
// b1 hq2 hkv1 sq3 skv2 d2: dq has 12 elements, dk and dv 4 each. value v, abs a, floor f everywhere.
BackwardReference uniform_reference(const AttentionProblem &p, double v, double a, double f) {
  BackwardReference r;
  for (GradientReference *g : {&r.dq, &r.dk, &r.dv}) {
    const size_t n = static_cast<size_t>(g == &r.dq ? p.q_elems() : p.kv_elems());
    g->value.assign(n, v);
    g->abs.assign(n, a);
    g->floor.assign(n, f);
  }
  return r;
}
AttentionProblem small_bwd(DType t) {
  AttentionProblem p;
  p.heads_q = 2;
  p.heads_kv = 1;
  p.seqlen_q = 3;
  p.seqlen_kv = 2;
  p.head_dim = 2;
  p.dtype = t;
  p.pass = Pass::bwd;
  return p;
}
} // namespace

TEST(Verify, BackwardChecksEachGradientAndNamesItsMismatches) {
  const AttentionProblem p = small_bwd(DType::bf16);
  const GradTolerance t = grad_tolerance_for(p.dtype);
  const BackwardReference ref = uniform_reference(p, 0.5, 0.5, 2.0);
  std::vector<float> dq(p.q_elems(), 0.5f), dk(p.kv_elems(), 0.5f), dv(p.kv_elems(), 0.5f);
  VerifyResult r = verify_backward(p, dq.data(), dk.data(), dv.data(), ref, t);
  EXPECT_TRUE(r.pass) << r.summary();
  ASSERT_EQ(r.tensors.size(), 3u);
  EXPECT_EQ(r.tensors[0].name, "dq");
  EXPECT_EQ(r.tensors[1].name, "dk");
  EXPECT_EQ(r.tensors[2].name, "dv");
  EXPECT_EQ(r.lse_max_error, 0); // LSE is an input of the backward

  // dk[b=0,s=1,h=0,d=1] is element 3; a NaN there (an unwritten element) fails and is named.
  dk[3] = std::numeric_limits<float>::quiet_NaN();
  r = verify_backward(p, dq.data(), dk.data(), dv.data(), ref, t);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.nonfinite, 1);
  EXPECT_EQ(r.tensors[1].nonfinite, 1);
  EXPECT_NE(r.detail.find("dk[b=0,s=1,h=0,d=1]: got nan"), std::string::npos) << r.detail;
  dk[3] = 0.5f;
  // dq[b=0,s=2,h=1,d=0] is element (2 * 2 + 1) * 2 = 10: off by more than its bound.
  const double bound = t.atol + t.rtol * 0.5 + t.term * 0.5 + t.floor * 2.0;
  dq[10] = static_cast<float>(0.5 + 1.5 * bound);
  r = verify_backward(p, dq.data(), dk.data(), dv.data(), ref, t);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.tensors[0].mismatches, 1);
  EXPECT_GT(r.tensors[0].worst_ratio, 1.0);
  EXPECT_NE(r.detail.find("dq[b=0,s=2,h=1,d=0]"), std::string::npos) << r.detail;
  // Within it: passes.
  dq[10] = static_cast<float>(0.5 + 0.5 * bound);
  r = verify_backward(p, dq.data(), dk.data(), dv.data(), ref, t);
  EXPECT_TRUE(r.pass) << r.summary();
}

TEST(Verify, BackwardBoundGrowsWithTheTermsSums) {
  // The same absolute error passes against an element whose terms sum to much more than its value (rounding
  // errors of many terms), and fails where the terms are small.
  const AttentionProblem p = small_bwd(DType::bf16);
  const GradTolerance t = grad_tolerance_for(p.dtype);
  std::vector<float> dq(p.q_elems(), 0.52f), dk(p.kv_elems(), 0.52f), dv(p.kv_elems(), 0.52f);
  EXPECT_FALSE(
      verify_backward(p, dq.data(), dk.data(), dv.data(), uniform_reference(p, 0.5, 0.5, 0.5), t)
          .pass);
  // abs = 1: bound 4u * 1 + 2u * 0.5 = 5 * 2^-9 < 0.02: still fails element-wise ...
  EXPECT_FALSE(
      verify_backward(p, dq.data(), dk.data(), dv.data(), uniform_reference(p, 0.5, 1.0, 0.5), t)
          .pass);
  // ... and passes every element at abs = 8 (bound 0.0645), where the norm bound then fails it: 4% > 8u.
  const VerifyResult r =
      verify_backward(p, dq.data(), dk.data(), dv.data(), uniform_reference(p, 0.5, 8.0, 0.5), t);
  EXPECT_EQ(r.mismatches, 0);
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.detail.find("rel_l2"), std::string::npos) << r.detail;
  // 1% relative everywhere passes both.
  std::fill(dq.begin(), dq.end(), 0.505f);
  std::fill(dk.begin(), dk.end(), 0.505f);
  std::fill(dv.begin(), dv.end(), 0.505f);
  EXPECT_TRUE(
      verify_backward(p, dq.data(), dk.data(), dv.data(), uniform_reference(p, 0.5, 8.0, 0.5), t)
          .pass);
}

TEST(Verify, BackwardFloorCountsOnlyForFp16) {
  // fp16's subnormal P and dS carry an absolute rounding error; bf16 and fp32 have none in play.
  EXPECT_GT(grad_tolerance_for(DType::f16).floor, 0);
  EXPECT_EQ(grad_tolerance_for(DType::bf16).floor, 0);
  EXPECT_EQ(grad_tolerance_for(DType::f32).floor, 0);
  for (auto f : {&GradTolerance::rtol, &GradTolerance::term, &GradTolerance::rel_l2}) {
    EXPECT_LT(grad_tolerance_for(DType::f32).*f, grad_tolerance_for(DType::f16).*f);
    EXPECT_LT(grad_tolerance_for(DType::f16).*f, grad_tolerance_for(DType::bf16).*f);
  }
  // fp16 with value 0 and a large floor sum: an error the floor covers passes, and only in fp16.
  AttentionProblem p = small_bwd(DType::f16);
  const BackwardReference ref = uniform_reference(p, 0.0, 0.0, 4096.0);
  std::vector<float> dq(p.q_elems(), 1e-4f), dk(p.kv_elems(), 1e-4f), dv(p.kv_elems(), 1e-4f);
  EXPECT_EQ(verify_backward(p, dq.data(), dk.data(), dv.data(), ref, grad_tolerance_for(p.dtype))
                .mismatches,
            0);
  EXPECT_GT(
      verify_backward(p, dq.data(), dk.data(), dv.data(), ref, grad_tolerance_for(DType::bf16))
          .mismatches,
      0);
}

TEST(Verify, BackwardResultJsonHasEachTensor) {
  const AttentionProblem p = small_bwd(DType::bf16);
  std::vector<float> dq(p.q_elems(), 0.5f), dk(p.kv_elems(), 0.5f), dv(p.kv_elems(), 0.5f);
  const VerifyResult r =
      verify_backward(p, dq.data(), dk.data(), dv.data(), uniform_reference(p, 0.5, 0.5, 0.5),
                      grad_tolerance_for(p.dtype));
  const nlohmann::json j = r;
  ASSERT_TRUE(j.contains("tensors"));
  for (const char *n : {"dq", "dk", "dv"})
    EXPECT_TRUE(j["tensors"].contains(n)) << j.dump();
  EXPECT_NE(r.summary().find("dk:{"), std::string::npos) << r.summary();
}
