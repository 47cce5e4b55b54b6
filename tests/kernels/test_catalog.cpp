// Host logic of every variant (config spaces, supports, traffic models): testable without a GPU.
#include "flashbench/variant.hpp"

#include <gtest/gtest.h>

using namespace fb;

namespace {
AttentionProblem prob(int64_t n, int64_t d, bool causal) {
  AttentionProblem p;
  p.batch = 2;
  p.heads_q = 8;
  p.heads_kv = 8;
  p.seqlen_q = p.seqlen_kv = n;
  p.head_dim = d;
  p.causal = causal;
  return p;
}
} // namespace

TEST(Catalog, HoldsTheFoundationVariants) {
  EXPECT_NE(catalog().find("naive"), nullptr);
  EXPECT_NE(catalog().find("fa1_kv_outer"), nullptr);
}

TEST(Catalog, DefaultConfigsAreValidAndSupportedOnCommonShapes) {
  const DeviceInfo dev = nominal_device();
  for (const auto &v : catalog().all()) {
    EXPECT_FALSE(v->description().empty()) << v->name();
    const Config c = v->space().default_config();
    EXPECT_FALSE(v->space().check(c).has_value()) << v->name();
    for (int64_t d : {64, 128}) {
      AttentionProblem p = prob(1024, d, true);
      p.pass = v->pass();           // each variant on its own pass
      if (v->name() == "fa3_fp8") { // e4m3 inputs, head_dim 128 only
        if (d != 128)
          continue;
        p.dtype = DType::e4m3;
      }
      const Support s = v->supports(p, c, dev);
      EXPECT_TRUE(s.ok) << v->name() << ": " << s.reason;
    }
  }
}

TEST(Catalog, TrafficModelsAreAtLeastTheMinimum) {
  const DeviceInfo dev = nominal_device();
  for (const auto &v : catalog().all())
    for (const auto &e : v->space().expand()) {
      if (e.invalid_reason)
        continue;
      for (bool causal : {false, true}) {
        AttentionProblem p = prob(512, 64, causal);
        p.pass = v->pass(); // a backward variant against the backward's minimum
        if (!v->supports(p, e.config, dev))
          continue;
        EXPECT_GE(v->model_bytes(p, e.config), min_bytes(p) * 0.999)
            << v->name() << " " << v->space().to_string(e.config);
      }
    }
}

TEST(Catalog, QuadraticTrafficIsVisibleInTheModels) {
  // Naive writes S and P; FA1 re-reads Q and round-trips O/l/m once per K/V tile: both grow as N^2.
  for (const char *name : {"naive", "fa1_kv_outer"}) {
    const Variant &v = catalog().get(name);
    const Config c = v.space().default_config();
    const double small = v.model_bytes(prob(4096, 128, false), c);
    const double big = v.model_bytes(prob(8192, 128, false), c);
    EXPECT_GT(big / small, 3.0) << name;
  }
}

TEST(Catalog, NaiveSkipsProblemsWhoseScoresDoNotFit) {
  const Variant &v = catalog().get("naive");
  AttentionProblem p = prob(131072, 128, false);
  p.batch = 8;
  p.heads_q = p.heads_kv = 32;
  const Support s = v.supports(p, v.space().default_config(), nominal_device());
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("GB"), std::string::npos) << s.reason;
}

TEST(Catalog, UnsupportedHeadDimIsSkippedWithAReason) {
  const Variant &v = catalog().get("fa1_kv_outer");
  const Support s = v.supports(prob(128, 100, false), v.space().default_config(), nominal_device());
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("head_dim"), std::string::npos) << s.reason;
}

// ---- flash_decoding's split plan and the decode-only checks of the other variants.
#include "kernels/flash_decoding/traffic.hpp"
#include "kernels/flash_decoding/traits.hpp"

namespace {
AttentionProblem decode(int64_t batch, int64_t hq, int64_t hkv, int64_t len) {
  AttentionProblem p;
  p.batch = batch;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = 1;
  p.seqlen_kv = len;
  p.head_dim = 128;
  return p;
}
} // namespace

TEST(FlashDecodingPlan, HeuristicFillsTheGpuWithoutAPartialWave) {
  const fdec::DeviceFacts h200{132, 228 * 1024};
  fdec::Params c; // block_n 64, 4 stages: 128 KB, one CTA per SM
  c.stages = 4;
  // B=1, GQA 32/8: 8 groups -> about one split per SM.
  const fdec::SplitPlan p8k = fdec::split_plan(decode(1, 32, 8, 8192), c, h200);
  EXPECT_GE(p8k.splits * 8, 120);
  EXPECT_LE(p8k.splits * 8, 132);
  // The target is one CTA per SM even where two fit (the default tile, 3 stages): B=1 GQA 16
  // splits, B=8 2, MHA B=1 4 (not 32, 4 and 8: one CTA per SM is the target).
  const fdec::Params dflt;
  EXPECT_EQ(fdec::split_plan(decode(1, 32, 8, 131072), dflt, h200).ctas_per_sm, 2);
  EXPECT_EQ(fdec::split_plan(decode(1, 32, 8, 131072), dflt, h200).splits, 16);
  EXPECT_EQ(fdec::split_plan(decode(8, 32, 8, 32768), dflt, h200).splits, 2);
  EXPECT_EQ(fdec::split_plan(decode(1, 32, 32, 32768), dflt, h200).splits, 4);
  // Enough groups to fill the SMs: no split.
  EXPECT_EQ(fdec::split_plan(decode(64, 32, 32, 4096), c, h200).splits, 1);
  // The split ranges cover the longest entry in whole tiles.
  const fdec::SplitPlan p = fdec::split_plan(decode(1, 32, 8, 131072), c, h200);
  EXPECT_EQ(p.keys_per_split % c.block_n, 0);
  EXPECT_GE(p.keys_per_split * p.splits, 131072);
  EXPECT_LT(p.keys_per_split * (p.splits - 1), 131072);
  // An explicit num_splits is taken (capped by the tiles there are).
  fdec::Params four = c;
  four.num_splits = 4;
  EXPECT_EQ(fdec::split_plan(decode(1, 32, 8, 8192), four, h200).splits, 4);
  four.num_splits = 64;
  EXPECT_EQ(fdec::split_plan(decode(1, 32, 8, 100), four, h200).splits, 2); // 2 tiles of 64 keys
}

TEST(FlashDecodingPlan, WorkspaceOnlyWhenSplitAndTrafficCountsEachEntrysKeys) {
  const fdec::DeviceFacts h200{132, 228 * 1024};
  const fdec::Params c;
  AttentionProblem p = decode(3, 32, 8, 4096);
  p.kv_lens = {4096, 0, 100};
  const fdec::SplitPlan plan = fdec::split_plan(p, c, h200);
  EXPECT_GT(fdec::workspace_layout(p, plan).total, 0u);
  fdec::SplitPlan one = plan;
  one.splits = 1;
  EXPECT_EQ(fdec::workspace_layout(p, one).total, 0u);
  EXPECT_GE(fdec::traffic_bytes(p, c, plan), min_bytes(p) * 0.999);
  EXPECT_LT(fdec::traffic_bytes(p, c, plan), min_bytes(p) * 1.1);
}

TEST(Catalog, OnlyDecodeVariantsTakeKvLensOrPagedCaches) {
  AttentionProblem p = decode(2, 8, 2, 1024);
  p.kv_lens = {1024, 7};
  AttentionProblem paged = decode(2, 8, 2, 1024);
  paged.page_size = 16;
  for (const auto &v : catalog().all()) {
    if (v->pass() != Pass::fwd)
      continue; // a backward of a ragged or paged cache is refused by validate(): none is ever offered
    const Config c = v->space().default_config();
    const bool decode_variant = v->name() == "flash_decoding";
    for (AttentionProblem q : {p, paged}) {
      if (v->name() == "fa3_fp8")
        q.dtype = DType::e4m3; // its own dtype, so that the decode reason is the one left
      const Support s = v->supports(q, c, nominal_device());
      EXPECT_EQ(s.ok, decode_variant) << v->name() << " on " << key(q) << ": " << s.reason;
      if (!decode_variant)
        EXPECT_NE(s.reason.find("decode variant"), std::string::npos) << s.reason;
    }
  }
}

TEST(Catalog, Fa1ModelCountsWhatStaysInL2OnADevice) {
  // With a device, FA1's model drops the per-step re-reads that stay in L2 (see kernels/fa1_kv_outer/traits.hpp);
  // without one it is the no-reuse upper bound. A small per-CTA state (16-row tiles) fits L2 entirely, so the
  // model comes down to about Q, K, V, O once plus the fp32 accumulator written back once.
  const Variant &v = catalog().get("fa1_kv_outer");
  const DeviceInfo dev = nominal_device();
  AttentionProblem p = prob(4096, 128, false);
  const Config small =
      v.space().make({{"block_m", "16"}, {"block_n", "64"}, {"q_tiles_per_cta", "1"}});
  const double with_dev = v.model_bytes(p, small, dev), bound = v.model_bytes(p, small);
  EXPECT_LT(with_dev, bound / 10);
  EXPECT_GE(with_dev, min_bytes(p));
  EXPECT_LT(with_dev, min_bytes(p) + 4.0 * p.q_elems() + 1e6); // + the fp32 O written back once
  // A large per-CTA state does not fit: the O/l/m round trips stay in the model.
  const Config big =
      v.space().make({{"block_m", "64"}, {"block_n", "64"}, {"q_tiles_per_cta", "0"}});
  EXPECT_GT(v.model_bytes(p, big, dev), 0.5 * v.model_bytes(p, big));
}
