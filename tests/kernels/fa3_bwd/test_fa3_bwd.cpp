// fa3_bwd (Hopper backward) against the harness's float64 backward reference: every config on awkward shapes
// (length 1, odd lengths, causal with seqlen_q != seqlen_kv and rows that see no key, GQA and MQA, head_dim 64 and
// 128, several row and column blocks crossing the diagonal, a ragged last column block), shapes with more column
// blocks than SMs (whole and split blocks in one grid), deterministic mode
// bit-identical from run to run with the semaphores back at zero, and every input left untouched.
#include "../bwd_case.hpp"

#include "kernels/catalog.hpp"

using namespace fb;
using fb::test::BwdCase;
using fb::test::Shape;

namespace {

const Variant &bwd() { return catalog().get("fa3_bwd"); }

class Fa3BwdAllConfigs : public ::testing::TestWithParam<Shape> {};

TEST_P(Fa3BwdAllConfigs, MatchCpuReference) {
  FB_SKIP_WITHOUT_HOPPER();
  BwdCase c(GetParam().problem());
  EXPECT_GT(fb::test::run_all_configs(bwd(), c), 0)
      << "no config of fa3_bwd supports " << key(c.problem());
}

INSTANTIATE_TEST_SUITE_P(Awkward, Fa3BwdAllConfigs,
                         ::testing::ValuesIn(fb::test::backward_shapes(128)), fb::test::shape_name);

// More column blocks than SMs without a causal mask: on a 132-SM part, 144 blocks are 12 whole ones past a full
// round, so split_tail cuts those 12 into pieces while the first 132 run whole (traits.hpp, tail_split), and the
// pieces' dK/dV sums must meet exactly once (the semaphores come back zero).
INSTANTIATE_TEST_SUITE_P(
    ManyTiles, Fa3BwdAllConfigs,
    ::testing::Values(Shape{"tiles144_d64_gqa", 2, 16, 8, 300, 1152, 64, false, DType::bf16},
                      Shape{"tiles144_d128_gqa", 2, 16, 8, 500, 1152, 128, false, DType::f16}),
    fb::test::shape_name);

// Partial last row blocks at head_dim 128 under every config, row_tail's 16-row steps among them (80-row blocks,
// traits.hpp tail_rows): 1 row (16), 170 = 2 x 80 + 10 (16, GQA), 1000 = 12 x 80 + 40 (48), causal 700 = 8 x 80 + 60
// (64) with seqlen_kv > seqlen_q.
INSTANTIATE_TEST_SUITE_P(
    RowTail, Fa3BwdAllConfigs,
    ::testing::Values(Shape{"tail_q1_d128", 1, 2, 2, 1, 300, 128, false, DType::bf16},
                      Shape{"tail_q170_d128_gqa", 2, 4, 2, 170, 333, 128, false, DType::bf16},
                      Shape{"tail_q1000_d128", 1, 2, 2, 1000, 256, 128, false, DType::f16},
                      Shape{"tail_q700_kv900_d128_causal", 1, 2, 1, 700, 900, 128, true,
                            DType::bf16}),
    fb::test::shape_name);

TEST(Fa3Bwd, DeterministicIsBitIdentical) {
  FB_SKIP_WITHOUT_HOPPER();
  fb::test::check_deterministic(bwd(), [](Config &c) {
    c.set("deterministic", 1);
    c.set("order", 0); // natural: the order the counters follow
  });
}

} // namespace
