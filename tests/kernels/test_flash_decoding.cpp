// Flash-decoding against the float64 CPU reference: every config on decode shapes that are awkward
// on purpose (KV lengths 1 and 257, lengths that are multiples of no page, tile or split size, mixed
// lengths and empty entries in one batch, paged and contiguous caches, seqlen_q 1..16 causal, GQA,
// MQA, MHA, head_dim 64/128/256, bf16 and fp16).
#include "gpu_test_util.hpp"

#include "kernels/flash_decoding/traits.hpp"

using namespace fb;
using fb::test::Case;

namespace {

const Variant &fdv() { return catalog().get("flash_decoding"); }

using DecodeShape = fb::test::Shape;

const std::vector<DecodeShape> kShapes = {
    {"len1_gqa", 1, 32, 8, 1, 1, 128, true, DType::bf16},
    {"len257_gqa_f16", 1, 32, 8, 1, 257, 128, true, DType::f16},
    // Mixed lengths in one batch, one of them empty (O = 0, LSE = -inf), none a multiple of 64.
    {"mixed_with_empty", 4, 32, 8, 1, 1000, 128, false, DType::bf16, {1, 257, 0, 1000}},
    {"paged16_mixed", 4, 32, 8, 1, 513, 128, true, DType::bf16, {77, 0, 300, 513}, 16},
    {"paged256_mha_d64_f16", 2, 8, 8, 1, 1100, 64, false, DType::f16, {1000, 3}, 256},
    // Speculative decoding: 16 tokens, causal bottom-right against each entry's own length (the
    // entry of 5 keys has rows that see none).
    {"sq16_causal_paged32", 2, 32, 8, 16, 300, 128, true, DType::bf16, {300, 5}, 32},
    {"sq4_causal_mqa_d256_f16", 1, 16, 1, 4, 200, 256, true, DType::f16},
    {"sq7_causal_mha_d64", 1, 4, 4, 7, 131, 64, true, DType::bf16},
    {"d256_gqa_lens", 2, 8, 2, 1, 2049, 256, false, DType::bf16, {2049, 1500}},
    {"bhsd_sq3_causal_f16", 2, 8, 2, 3, 100, 64, true, DType::f16, {}, 0, Layout::bhsd},
    {"long_8191_gqa", 1, 32, 8, 1, 8191, 128, false, DType::bf16},
    {"mqa32_sq16_paged64", 1, 32, 1, 16, 700, 128, true, DType::bf16, {}, 64},
};

class FlashDecodingAllConfigs : public ::testing::TestWithParam<DecodeShape> {};

TEST_P(FlashDecodingAllConfigs, MatchCpuReference) {
  FB_SKIP_WITHOUT_GPU();
  Case c(GetParam().problem());
  const Config def = fdv().space().default_config();
  ASSERT_TRUE(fdv().supports(c.problem(), def, fb::test::test_device()).ok);
  int ran = 0;
  for (const auto &e : fdv().space().expand()) {
    // block_n 64 with 8 warps (8 keys a warp) is invalid by construction, with its reason.
    if (e.invalid_reason) {
      EXPECT_NE(e.invalid_reason->find("16 or 32 keys a warp"), std::string::npos)
          << *e.invalid_reason;
      continue;
    }
    // block_n 128 x 4 stages x head_dim 256 needs more shared memory than a block may have; head_dim
    // 256 takes 16 keys a warp and 4 warps only (registers).
    if (!fdv().supports(c.problem(), e.config, fb::test::test_device()))
      continue;
    c.expect_pass(fdv(), e.config);
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

INSTANTIATE_TEST_SUITE_P(Decode, FlashDecodingAllConfigs, ::testing::ValuesIn(kShapes),
                         fb::test::shape_name);

TEST(FlashDecoding, RepeatedLaunchesShareTheWorkspace) {
  // The fused path's arrival counters live in the semaphores: each launch must leave them zero for the
  // next (Case::run checks), and no launch may depend on what an earlier one (or the poison) left in the
  // workspace.
  FB_SKIP_WITHOUT_GPU();
  Case c(DecodeShape{"rep", 3, 32, 8, 2, 3000, 128, true, DType::bf16, {3000, 17, 2500}, 16}
             .problem());
  for (const char *splits : {"0", "8", "64"})
    for (const char *fused : {"0", "1"})
      c.expect_pass(fdv(), fdv().space().make({{"num_splits", splits}, {"fused", fused}}), 3);
  // 8 warps, each with its own ring, and the 128-split combine (more splits than one warp's lanes).
  c.expect_pass(fdv(),
                fdv().space().make({{"block_n", "128"}, {"warps", "8"}, {"num_splits", "32"}}), 3);
}

TEST(FlashDecoding, ManySplitsCombineInParallel) {
  // 128 splits of one 64-key step each, GQA (4 rows) and MHA (1 row): the combine's per-row LSE pass
  // reads 4 per lane and its weighted sum spreads the splits over P threads per item.
  FB_SKIP_WITHOUT_GPU();
  for (const DecodeShape &s : {DecodeShape{"gqa", 1, 32, 8, 1, 8192, 128, false, DType::bf16},
                               DecodeShape{"mha_d64", 2, 4, 4, 1, 8000, 64, false, DType::f16}}) {
    Case c(s.problem());
    for (const char *fused : {"0", "1"}) {
      Config cfg = fdv().space().make({{"fused", fused}, {"stages", "2"}});
      cfg.set("num_splits",
              fdec::kMaxSplits); // off the axis (not swept), within config_problem's range
      c.expect_pass(fdv(), cfg);
    }
  }
}

TEST(FlashDecoding, ConfigSpaceTurnsDownWhatCannotRun) {
  const AttentionProblem p =
      DecodeShape{"d256", 1, 8, 2, 1, 100, 256, false, DType::bf16}.problem();
  // 8 keys a warp: invalid by construction.
  EXPECT_TRUE(
      fdv().space().check(fdv().space().make({{"block_n", "64"}, {"warps", "8"}})).has_value());
  // head_dim 256: 16 keys a warp and 4 warps only.
  for (const auto &kv :
       std::vector<std::pair<const char *, const char *>>{{"128", "4"}, {"128", "8"}}) {
    const Support s = fdv().supports(
        p, fdv().space().make({{"block_n", kv.first}, {"warps", kv.second}}), nominal_device());
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.reason.find("head_dim 256"), std::string::npos) << s.reason;
  }
  EXPECT_TRUE(fdv().supports(p, fdv().space().default_config(), nominal_device()).ok);
}

TEST(FlashDecoding, Fp32AndOddHeadDimsAreRejected) {
  AttentionProblem p = DecodeShape{"f32", 1, 8, 8, 1, 100, 128, false, DType::f32}.problem();
  EXPECT_FALSE(fdv().supports(p, fdv().space().default_config(), nominal_device()).ok);
  p.dtype = DType::bf16;
  p.head_dim = 96;
  const Support s = fdv().supports(p, fdv().space().default_config(), nominal_device());
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("head_dim 96"), std::string::npos) << s.reason;
}

} // namespace
