// FA2 (Q-outer, tensor cores) against the float64 CPU reference: every config of the space (both warp layouts,
// every pipeline depth) on every awkward shape it supports, plus shapes long enough to fill the cp.async ring and
// cross the causal diagonal in several K/V tiles, and head_dim 256.
#include "gpu_test_util.hpp"

using namespace fb;
using fb::test::Case;
using fb::test::Shape;

namespace {

const Variant &fa2() { return catalog().get("fa2_q_outer"); }

// Runs every config that the variant supports on this problem; returns how many ran. Unsupported combinations
// must say why.
int run_all_configs(Case &c) {
  int ran = 0;
  for (const auto &e : fa2().space().expand()) {
    if (e.invalid_reason)
      continue; // structural (e.g. split_q with 8 rows per warp): reported as skipped
    const Support s = fa2().supports(c.problem(), e.config, fb::test::test_device());
    if (!s) {
      EXPECT_FALSE(s.reason.empty()) << fa2().space().to_string(e.config);
      continue;
    }
    c.expect_pass(fa2(), e.config);
    ++ran;
  }
  return ran;
}

class Fa2AllConfigs : public ::testing::TestWithParam<Shape> {};

TEST_P(Fa2AllConfigs, MatchCpuReference) {
  FB_SKIP_WITHOUT_GPU();
  const AttentionProblem p = GetParam().problem();
  if (p.dtype == DType::f32) {
    const Support s = fa2().supports(p, fa2().space().default_config(), fb::test::test_device());
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.reason.find("fp32"), std::string::npos) << s.reason;
    return;
  }
  Case c(p);
  EXPECT_GT(run_all_configs(c), 0) << "no config of fa2_q_outer supports " << key(p);
}

INSTANTIATE_TEST_SUITE_P(Awkward, Fa2AllConfigs, ::testing::ValuesIn(fb::test::awkward_shapes()),
                         fb::test::shape_name);

const std::vector<Shape> kLongShapes = {
    // Several K/V tiles per Q tile (more than the deepest ring), diagonal tiles, ragged ends on both sides.
    {"causal_q300_kv300_d128", 1, 2, 2, 300, 300, 128, true, DType::bf16},
    {"causal_q257_kv513_d64_f16", 1, 2, 1, 257, 513, 64, true, DType::f16},
    {"q333_kv650_d64", 2, 2, 2, 333, 650, 64, false, DType::bf16},
    // seqlen_kv > seqlen_q (diagonal shifted right by 577), GQA: the int mask bounds of d128 128x64x4 (the lean loop).
    {"causal_q200_kv777_d128_gqa", 1, 4, 2, 200, 777, 128, true, DType::bf16},
    {"causal_q513_kv200_d128_bhsd", 1, 4, 2, 513, 200, 128, true, DType::f16, {}, 0, Layout::bhsd},
    {"causal_q190_kv190_d256", 1, 2, 2, 190, 190, 256, true, DType::bf16},
    {"q70_kv300_d256_f16", 1, 2, 1, 70, 300, 256, false, DType::f16},
};
INSTANTIATE_TEST_SUITE_P(Long, Fa2AllConfigs, ::testing::ValuesIn(kLongShapes),
                         fb::test::shape_name);

TEST(Fa2QOuter, BothWarpLayoutsAreCompiledForTheRequiredHeadDims) {
  // Host-only: at least one config of each layout is supported at head_dim 64 and 128 (the acceptance shapes).
  const DeviceInfo dev = nominal_device();
  for (int64_t d : {64, 128})
    for (const char *layout : {"split_q", "split_k"}) {
      AttentionProblem p = Shape{"x", 1, 16, 16, 4096, 4096, d, true, DType::bf16}.problem();
      int supported = 0;
      for (const auto &e : fa2().space().expand())
        if (!e.invalid_reason &&
            fa2().space().to_string(e.config).find(layout) != std::string::npos &&
            fa2().supports(p, e.config, dev))
          ++supported;
      EXPECT_GT(supported, 0) << layout << " head_dim " << d;
    }
}

TEST(Fa2QOuter, UnsupportedCombinationsSayWhy) {
  const DeviceInfo dev = nominal_device();
  AttentionProblem p = Shape{"x", 1, 2, 2, 128, 128, 64, false, DType::f32}.problem();
  EXPECT_NE(fa2().supports(p, fa2().space().default_config(), dev).reason.find("fp32"),
            std::string::npos);
  p.dtype = DType::bf16;
  p.head_dim = 96;
  EXPECT_NE(fa2().supports(p, fa2().space().default_config(), dev).reason.find("head_dim 96"),
            std::string::npos);
  p.head_dim = 256;
  const Config big = fa2().space().make(
      {{"block_m", "128"}, {"block_n", "128"}, {"warps", "4"}, {"warp_layout", "split_q"}});
  EXPECT_NE(fa2().supports(p, big, dev).reason.find("registers"), std::string::npos);
  // The register score's calibration: d64 128x128x4 compiles spill-free for sm_90 (not for sm_80), d128 128x64x4
  // still spills and is skipped with the register reason.
  p.head_dim = 64;
  EXPECT_TRUE(fa2().supports(p, big, dev).ok) << fa2().supports(p, big, dev).reason;
  DeviceInfo ampere = dev;
  ampere.present = true, ampere.cc_major = 8, ampere.cc_minor = 0;
  EXPECT_NE(fa2().supports(p, big, ampere).reason.find("compute capability 8"), std::string::npos);
  // d128 128x64x4 (FA2's d128 shape) compiles spill-free for sm_90 with the lean loop (traits.hpp,
  // lean_loop), not for sm_80; d128 128x128x4 still spills and is skipped with the register reason.
  p.head_dim = 128;
  const Config fa2_shape = fa2().space().make(
      {{"block_m", "128"}, {"block_n", "64"}, {"warps", "4"}, {"warp_layout", "split_q"}});
  EXPECT_TRUE(fa2().supports(p, fa2_shape, dev).ok) << fa2().supports(p, fa2_shape, dev).reason;
  EXPECT_NE(fa2().supports(p, fa2_shape, ampere).reason.find("compute capability 8"),
            std::string::npos);
  EXPECT_NE(fa2().supports(p, big, dev).reason.find("registers"), std::string::npos);
  const Config narrow =
      fa2().space().make({{"block_m", "64"}, {"warps", "8"}, {"warp_layout", "split_q"}});
  ASSERT_TRUE(fa2().space().check(narrow).has_value());
  EXPECT_NE(fa2().space().check(narrow)->find("16"), std::string::npos);
}

TEST(Fa2QOuter, TrafficModelIsOneKvPassPerQTile) {
  AttentionProblem p = Shape{"x", 1, 1, 1, 1024, 1024, 128, false, DType::bf16}.problem();
  const Variant &v = fa2();
  const Config c = v.space().make({{"block_m", "128"}});
  // Q + O once, LSE, and K/V once per Q tile (8 tiles).
  const double want = 2.0 * 2 * 1024 * 128 + 4.0 * 1024 + 8 * 2.0 * 2 * 1024 * 128;
  EXPECT_DOUBLE_EQ(v.model_bytes(p, c), want);
  p.causal = true; // about half the K/V tiles
  EXPECT_LT(v.model_bytes(p, c), 0.65 * want);
}

} // namespace
