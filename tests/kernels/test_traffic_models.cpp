// The catalog's traffic models on a device (kernels/traffic.cpp, each variant's traffic.hpp): host arithmetic,
// checked on the nominal H100 (132 SMs, 50 MiB of L2) against what each kernel's schedule implies.
#include "flashbench/traffic.hpp"
#include "flashbench/variant.hpp"

#include <gtest/gtest.h>

using namespace fb;

namespace {

AttentionProblem shape(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                       bool causal, DType t = DType::bf16) {
  AttentionProblem p;
  p.batch = b;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = sq;
  p.seqlen_kv = skv;
  p.head_dim = d;
  p.causal = causal;
  p.dtype = t;
  return p;
}

TrafficModel model(const char *variant, const AttentionProblem &p, const DeviceInfo &dev,
                   std::map<std::string, std::string> config = {}) {
  const Variant &v = catalog().get(variant);
  return traffic_model(v, p, v.space().make(config), dev);
}

double kv_ratio(const TrafficModel &m) { // "K/V 8.00x from DRAM"
  const size_t at = m.reason.find("K/V ");
  return at == std::string::npos ? -1 : std::stod(m.reason.substr(at + 4));
}

TEST(TrafficModels, QOuterKernelsReadKvOncePerKvHeadWhereTheirWavesFitTheL2) {
  const DeviceInfo dev = nominal_device();
  for (const char *v : {"fa2_q_outer", "fa3_pipelined"})
    for (bool causal : {false, true})
      for (const AttentionProblem &p :
           {shape(16, 16, 16, 1024, 1024, 128, causal), shape(4, 32, 32, 4096, 4096, 64, causal),
            shape(1, 32, 8, 1, 32768, 128, false)}) {
        const TrafficModel m = model(v, p, dev);
        EXPECT_DOUBLE_EQ(kv_ratio(m), 1.0) << v << " " << key(p) << ": " << m.reason;
        // Q, K, V read once, O and LSE written once, less what is still in L2 at the end (at most the usable L2).
        EXPECT_LE(m.bytes, min_bytes(p) * 1.0001) << v << " " << key(p);
        EXPECT_GT(m.bytes, min_bytes(p) - 0.5 * double(dev.l2_bytes)) << v << " " << key(p);
        EXPECT_FALSE(m.has_range());
        // Without a device: every CTA's K/V from DRAM, nothing left in L2 (the no-reuse bound).
        const Variant &var = catalog().get(v);
        EXPECT_GT(var.model_bytes(p, var.space().default_config()), m.bytes * 1.5)
            << v << " " << key(p);
      }
}

TEST(TrafficModels, ASmallProblemLeavesEverythingItWroteInL2) {
  const DeviceInfo dev = nominal_device();
  const AttentionProblem p =
      shape(2, 16, 4, 1000, 1537, 128, false); // Q + K + V + O = 22.8 MB < 26.2 MB
  const double inputs =
      min_bytes(p) - 2.0 * double(p.q_elems()) - 4.0 * double(p.lse_elems()); // Q, K, V
  for (const char *v : {"fa2_q_outer", "fa3_pipelined"}) {
    const TrafficModel m = model(v, p, dev);
    EXPECT_NEAR(m.bytes, inputs, 1.0) << v;
    EXPECT_NE(m.reason.find("still in L2 when the counters stop"), std::string::npos) << m.reason;
  }
}

TEST(TrafficModels, Fa3Fp8RankMajorOrderRereadsKvWhenTheHeadsInFlightExceedTheL2) {
  DeviceInfo dev = nominal_device();
  const AttentionProblem p = shape(16, 16, 16, 1024, 1024, 128, false, DType::e4m3);
  // 132 items a wave, each of another head: 132 x 256 KB = 34 MB of K/V > 26 MB, so each of the 8 Q tile ranks
  // reads K/V again.
  EXPECT_NEAR(kv_ratio(model("fa3_fp8", p, dev)), 8.0, 0.05);
  EXPECT_GT(model("fa3_fp8", p, dev).bytes, 3.0 * min_bytes(p));
  // A head comes back after all 256 heads' first tiles, two waves later: only an L2 whose usable half holds those
  // two waves' K/V (69 MB) keeps it.
  dev.l2_bytes = 100 << 20; // 52 MB usable: still every rank
  EXPECT_GT(kv_ratio(model("fa3_fp8", p, dev)), 7.0);
  dev.l2_bytes = 160 << 20; // 84 MB usable: K/V once
  EXPECT_NEAR(kv_ratio(model("fa3_fp8", p, dev)), 1.0, 0.01);
}

TEST(TrafficModels, FlashDecodingRowBlocksShareTheirSplitsKv) {
  const DeviceInfo dev = nominal_device();
  const AttentionProblem p = shape(2, 16, 4, 1000, 1537, 128, false); // 250 row blocks a KV head
  const TrafficModel m = model("flash_decoding", p, dev);
  EXPECT_DOUBLE_EQ(kv_ratio(m), 1.0) << m.reason;
  EXPECT_LT(m.bytes, 2.0 * min_bytes(p)); // the partials mostly still in L2 at the end
  const Variant &v = catalog().get("flash_decoding");
  EXPECT_GT(v.model_bytes(p, v.space().default_config()), 30.0 * min_bytes(p)); // no-reuse bound
  // Decode: one row block a KV head, K/V streamed once.
  const AttentionProblem d = shape(1, 32, 8, 1, 131072, 128, false);
  EXPECT_NEAR(model("flash_decoding", d, dev).bytes / min_bytes(d), 1.0, 0.01);
}

TEST(TrafficModels, Fa1GivesARangeWhereItsPerStepSetIsNearTheUsableL2) {
  const DeviceInfo dev = nominal_device();
  const AttentionProblem p = shape(32, 32, 32, 512, 512, 64, false);
  // 16-row tiles, one a CTA: a per-step set far below the L2, every re-read hits.
  const TrafficModel small =
      model("fa1_kv_outer", p, dev, {{"block_m", "16"}, {"q_tiles_per_cta", "1"}});
  EXPECT_FALSE(small.has_range()) << small.reason;
  EXPECT_NE(small.reason.find("re-reads 0% from DRAM"), std::string::npos) << small.reason;
  // 4 x 64-row tiles a CTA: 264 CTAs x 256 rows x (128 + 264) B = 26.5 MB, about the usable L2.
  const TrafficModel big =
      model("fa1_kv_outer", p, dev, {{"block_m", "64"}, {"q_tiles_per_cta", "4"}});
  ASSERT_TRUE(big.has_range()) << big.reason;
  EXPECT_LE(big.low, big.bytes);
  EXPECT_LE(big.bytes, big.high);
  EXPECT_GT(big.high, 5.0 * big.low); // the round trips of O/l/m decide it
  EXPECT_NE(big.reason.find("replacement policy"), std::string::npos) << big.reason;
  EXPECT_LE(big.low, min_bytes(p)); // all hits and everything written still in L2
}

TEST(TrafficModels, NaiveGivesARangeWhereAGqaGroupsKeyOutgrowsTheL2) {
  const DeviceInfo dev = nominal_device();
  const AttentionProblem shortp = shape(1, 32, 8, 1, 32768, 128, false); // K of a KV head: 8.4 MB
  EXPECT_FALSE(model("naive", shortp, dev).has_range());
  const AttentionProblem longp = shape(1, 32, 8, 1, 131072, 128, false); // 33.5 MB > 26.2 MB
  const TrafficModel m = model("naive", longp, dev);
  ASSERT_TRUE(m.has_range()) << m.reason;
  const Variant &v = catalog().get("naive");
  EXPECT_DOUBLE_EQ(m.low, v.model_bytes(longp, v.space().default_config()));
  EXPECT_DOUBLE_EQ(m.high - m.low,
                   3.0 * 2.0 * 2.0 * 131072 * 128 * 8); // 3 more reads of K and V per KV head
}

} // namespace
