// FA1 (KV-outer) against the float64 CPU reference: every config on two shapes that exercise
// partial tiles and causal skipping, and a handful of configs on every awkward shape.
#include "gpu_test_util.hpp"

using namespace fb;
using fb::test::Case;
using fb::test::Shape;

namespace {

const Variant &fa1() { return catalog().get("fa1_kv_outer"); }

// Default, the smallest tiles, FA1's original one-CTA-per-head form, and a mixed one.
std::vector<Config> few_configs() {
  const ConfigSpace &s = fa1().space();
  return {
      s.default_config(),
      s.make({{"block_m", "16"}, {"block_n", "16"}, {"q_tiles_per_cta", "1"}, {"threads", "128"}}),
      s.make({{"block_m", "64"}, {"block_n", "64"}, {"q_tiles_per_cta", "0"}, {"threads", "256"}}),
      s.make(
          {{"block_m", "32"}, {"block_n", "32"}, {"q_tiles_per_cta", "16"}, {"threads", "128"}})};
}

class Fa1AllConfigs : public ::testing::TestWithParam<Shape> {};

TEST_P(Fa1AllConfigs, MatchCpuReference) {
  FB_SKIP_WITHOUT_GPU();
  Case c(GetParam().problem());
  for (const auto &e : fa1().space().expand()) {
    ASSERT_FALSE(e.invalid_reason) << *e.invalid_reason;
    c.expect_pass(fa1(), e.config);
  }
}

const std::vector<Shape> kAllConfigShapes = {
    // Some rows see no key, tiles straddle the diagonal, K/V share one head (MQA), lengths fit no
    // tile size.
    {"causal_q131_kv77_mqa", 1, 2, 1, 131, 77, 64, true, DType::bf16},
    {"causal_q150_kv203_d128", 1, 2, 2, 150, 203, 128, true, DType::f32},
    {"q97_kv61_f16", 2, 2, 2, 97, 61, 64, false, DType::f16},
};
INSTANTIATE_TEST_SUITE_P(Fa1, Fa1AllConfigs, ::testing::ValuesIn(kAllConfigShapes),
                         fb::test::shape_name);

class Fa1Shapes : public ::testing::TestWithParam<Shape> {};

TEST_P(Fa1Shapes, MatchCpuReference) {
  FB_SKIP_WITHOUT_GPU();
  Case c(GetParam().problem());
  for (const Config &cfg : few_configs())
    c.expect_pass(fa1(), cfg);
}

INSTANTIATE_TEST_SUITE_P(Awkward, Fa1Shapes, ::testing::ValuesIn(fb::test::awkward_shapes()),
                         fb::test::shape_name);

const std::vector<Shape> kHeadDimShapes = {
    {"d8", 1, 2, 2, 70, 90, 8, true, DType::bf16},
    {"d72", 1, 2, 2, 70, 90, 72, false, DType::f16},  // a partial block of 64 head_dim columns
    {"d256", 1, 2, 1, 70, 90, 256, true, DType::f32}, // 173 KB of shared memory with block_n = 64
};
INSTANTIATE_TEST_SUITE_P(HeadDims, Fa1Shapes, ::testing::ValuesIn(kHeadDimShapes),
                         fb::test::shape_name);

TEST(Fa1KvOuter, RepeatedLaunchesGiveTheSameResult) {
  // The running O/l/m state lives in the workspace; a second launch must not depend on what the
  // first left.
  FB_SKIP_WITHOUT_GPU();
  Case c(Shape{"rep", 1, 4, 2, 129, 257, 64, true, DType::bf16}.problem());
  for (const Config &cfg : few_configs())
    c.expect_pass(fa1(), cfg, 3);
}

TEST(Fa1KvOuter, UnsupportedHeadDimIsRejectedNotLaunched) {
  AttentionProblem p = Shape{"d100", 1, 1, 1, 16, 16, 100, false, DType::bf16}.problem();
  const Support s = fa1().supports(p, fa1().space().default_config(), nominal_device());
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("head_dim 100"), std::string::npos) << s.reason;
}

} // namespace
