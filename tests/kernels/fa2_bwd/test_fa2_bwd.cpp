// fa2_bwd (FA2 backward, tensor cores) against the harness's float64 backward reference: every compiled config on
// awkward shapes (length 1, odd lengths, causal with seqlen_q != seqlen_kv and rows that see no key, GQA and MQA,
// head_dim 64/128/256, several row and column blocks crossing the diagonal), deterministic mode bit-identical
// from run to run, the semaphores left zero after back-to-back launches, and every input left untouched.
#include "../bwd_case.hpp"

#include <cstring>

using namespace fb;
using fb::test::BwdCase;
using fb::test::Shape;

namespace {

const Variant &bwd() { return catalog().get("fa2_bwd"); }

class Fa2BwdAllConfigs : public ::testing::TestWithParam<Shape> {};

TEST_P(Fa2BwdAllConfigs, MatchCpuReference) {
  FB_SKIP_WITHOUT_GPU();
  BwdCase c(GetParam().problem());
  EXPECT_GT(fb::test::run_all_configs(bwd(), c), 0)
      << "no config of fa2_bwd supports " << key(c.problem());
}

INSTANTIATE_TEST_SUITE_P(Awkward, Fa2BwdAllConfigs,
                         ::testing::ValuesIn(fb::test::backward_shapes(256)), fb::test::shape_name);

TEST(Fa2Bwd, DeterministicIsBitIdentical) {
  FB_SKIP_WITHOUT_GPU();
  fb::test::check_deterministic(bwd(), [](Config &c) {
    c.set("deterministic", 1);
    c.set("order", 0); // natural: the order the counters follow
  });
}

// row_order rotated with deterministic on: bit-identical, and right where a head has more column blocks than row
// blocks (several share a start) and with a GQA group (each query head of it in turn).
TEST(Fa2Bwd, RotatedDeterministicIsBitIdentical) {
  FB_SKIP_WITHOUT_GPU();
  for (const Shape &sh : {Shape{"rot", 2, 4, 2, 1024, 1024, 128, false, DType::bf16},
                          Shape{"rot_wide", 1, 2, 2, 100, 1500, 64, false, DType::bf16},
                          Shape{"rot_gqa", 1, 8, 2, 700, 900, 128, false, DType::f16}}) {
    BwdCase c(sh.problem());
    Config cfg = bwd().space().default_config(c.problem(), fb::test::test_device());
    cfg.set("deterministic", 1);
    cfg.set("row_order", 1);
    ASSERT_TRUE(support_for(bwd(), c.problem(), cfg, fb::test::test_device()).ok)
        << c.what(bwd(), cfg);
    const BwdCase::Run a = c.run(bwd(), cfg, 2);
    const BwdCase::Run b = c.run(bwd(), cfg, 1);
    EXPECT_TRUE(a.verdict.pass) << c.what(bwd(), cfg) << ": " << a.verdict.summary();
    EXPECT_TRUE(b.verdict.pass) << c.what(bwd(), cfg) << ": " << b.verdict.summary();
    EXPECT_TRUE(a.dq == b.dq && a.dk == b.dk && a.dv == b.dv)
        << c.what(bwd(), cfg) << ": a gradient differs between runs";
  }
}

// Host-only: the acceptance head_dims have a compiled config on the nominal H100, both warp layouts at d128.
TEST(Fa2Bwd, AcceptanceHeadDimsAreCompiled) {
  const DeviceInfo dev = nominal_device();
  for (int64_t d : {64, 128}) {
    AttentionProblem p = Shape{"x", 1, 16, 16, 4096, 4096, d, true, DType::bf16}.problem();
    p.pass = Pass::bwd;
    int supported = 0;
    for (const auto &e : bwd().space().expand())
      if (!e.invalid_reason && support_for(bwd(), p, e.config, dev))
        ++supported;
    EXPECT_GT(supported, 0) << "head_dim " << d;
  }
}

} // namespace
