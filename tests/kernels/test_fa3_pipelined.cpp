// FA3 (Hopper, sm_90a) against the float64 CPU reference. Skips without a device and on any device
// other than compute capability 9.0.
//  - Fa3SelfCheck: one K/V tile, non-causal, smallest configs first; on a mismatch it prints a
//    diagnosis of where the error sits (S side vs P V side, which 64-column chunk, which rows) so
//    that a wrong WGMMA descriptor, swizzle or fragment layout is named rather than just
//    "incorrect". Run it first on a new build (--gtest_filter='*Fa3SelfCheck*').
//  - Fa3AllConfigs: every valid config on the shared awkward shapes and on longer ones that wrap
//    the TMA ring several times, cross the causal diagonal in several tiles, and mix GQA, bhsd and
//    seqlen_q != seqlen_kv; the same kinds of shapes at head_dim 256 (block_n 64, 1 or 2
//    consumers).
//  - host-only (Fa3Pipelined.*): config space and supports() reasons, d256's tile table included;
//    these run without a device.
#include "gpu_test_util.hpp"
#include "kernels/fa3_pipelined/traits.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <queue>
#include <sstream>
#include <tuple>
#include <vector>

using namespace fb;
using fb::test::Case;
using fb::test::Shape;

namespace {

const Variant &fa3() { return catalog().get("fa3_pipelined"); }

Config cfg(int bm, int bn, int stages, int wgs, int pp, int ov) {
  return fa3().space().make({{"block_m", std::to_string(bm)},
                             {"block_n", std::to_string(bn)},
                             {"stages", std::to_string(stages)},
                             {"consumer_wgs", std::to_string(wgs)},
                             {"pingpong", pp ? "on" : "off"},
                             {"intra_wg_overlap", ov ? "on" : "off"}});
}

// ---- self-check: one tile, with a diagnosis
// ---------------------------------------------------------------
struct Diagnosis {
  bool pass = true;
  std::string text;
};

// Launches `c` on `p` (small, non-causal), recomputes the reference here in float64 and says where
// the errors sit.
Diagnosis self_check(const AttentionProblem &p, const Config &c) {
  Case cs(p);
  const int64_t d = p.head_dim, sq = p.seqlen_q, skv = p.seqlen_kv;
  const auto q = download_as_float(cs.q(), p.dtype, p.q_elems());
  const auto k = download_as_float(cs.k(), p.dtype, p.kv_elems());
  const auto v = download_as_float(cs.v(), p.dtype, p.kv_elems());
  DeviceBuffer o(size_t(p.q_elems() * dtype_bytes(p.dtype))), lse(size_t(p.lse_elems() * 4));
  poison(o.get(), o.bytes(), nullptr);
  poison(lse.get(), lse.bytes(), nullptr);
  LaunchArgs args;
  args.q = cs.q(), args.k = cs.k(), args.v = cs.v(), args.o = o.get(), args.lse = lse.as<float>();
  // The default scheduler (dynamic) counts claimed tiles in zeroed semaphores.
  DeviceBuffer sem(std::max<size_t>(1, fa3().semaphore_bytes(p, c)));
  FB_CUDA_CHECK(cudaMemset(sem.get(), 0, sem.bytes()));
  args.semaphores = sem.get(), args.semaphore_bytes = fa3().semaphore_bytes(p, c);
  Diagnosis dg;
  try {
    fa3().launch(p, c, args, nullptr);
    FB_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception &e) {
    dg.pass = false;
    dg.text = std::string("launch failed: ") + e.what() +
              " -> a fault here is the TMA map (cuTensorMapEncodeTiled), an mbarrier/expect_tx "
              "byte count, or "
              "the shared-memory size";
    return dg;
  }
  const auto og = download_as_float(o.get(), p.dtype, p.q_elems());
  const auto lg = download_as_float(lse.get(), DType::f32, p.lse_elems());
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  const double scale = p.softmax_scale();
  const Tolerance tol = tolerance_for(p.dtype);
  // Errors per (row % 16 / 8 = accumulator half, 64-column chunk) and LSE errors; NaN counted
  // apart.
  int64_t bad_lse = 0, nan_o = 0, bad_o = 0, bad_half[2] = {0, 0}, bad_chunk[4] = {0, 0, 0, 0};
  int64_t first_bad_row = -1, first_bad_col = -1;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / p.group_size();
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> s(static_cast<size_t>(skv));
        double mx = -INFINITY;
        for (int64_t j = 0; j < skv; ++j) {
          double acc = 0;
          for (int64_t x = 0; x < d; ++x)
            acc += double(q[size_t(b * qs.batch + h * qs.head + i * qs.seq + x)]) *
                   double(k[size_t(b * ks.batch + hk * ks.head + j * ks.seq + x)]);
          s[size_t(j)] = acc * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0;
        for (auto &x : s)
          sum += (x = std::exp(x - mx));
        const double lse_ref = mx + std::log(sum);
        const float lse_got = lg[size_t((b * p.heads_q + h) * sq + i)];
        if (!std::isfinite(lse_got) || std::abs(lse_got - lse_ref) > tol.lse_atol)
          ++bad_lse;
        for (int64_t x = 0; x < d; ++x) {
          double ref = 0;
          for (int64_t j = 0; j < skv; ++j)
            ref += s[size_t(j)] * double(v[size_t(b * ks.batch + hk * ks.head + j * ks.seq + x)]);
          ref /= sum;
          const float got = og[size_t(b * qs.batch + h * qs.head + i * qs.seq + x)];
          if (!std::isfinite(got))
            ++nan_o;
          if (!std::isfinite(got) || std::abs(got - ref) > tol.atol + tol.rtol * std::abs(ref)) {
            ++bad_o, ++bad_half[(i % 16) / 8], ++bad_chunk[x / 64];
            if (first_bad_row < 0)
              first_bad_row = i, first_bad_col = x;
          }
        }
      }
    }
  std::ostringstream os;
  os << "O mismatches " << bad_o << "/" << p.q_elems() << " (non-finite " << nan_o
     << "), LSE mismatches " << bad_lse << "/" << p.lse_elems();
  if (bad_o == 0 && bad_lse == 0) {
    dg.text = os.str() + ": layout OK";
    return dg;
  }
  dg.pass = false;
  os << "; first bad O at row " << first_bad_row << " col " << first_bad_col
     << "; by row half (row%16<8, >=8): " << bad_half[0] << ", " << bad_half[1]
     << "; by 64-col chunk:";
  for (int64_t x = 0; x < d / 64; ++x)
    os << " " << bad_chunk[x];
  os << "\n  diagnosis: ";
  if (nan_o == p.q_elems())
    os << "O never written (still the NaN poison): the consumers did not reach the epilogue or "
          "wrote elsewhere "
          "(O strides / row index)";
  else if (bad_lse > 0)
    os << "LSE is wrong, so S = Q K^T (or the softmax) is wrong: check the K-major descriptors "
          "(start >> 4, SBO = "
          "1024, swizzle bits 62-63 = 1), the +32-byte k-step advance inside the 128-byte row, the "
          "TMA box (64 "
          "columns x rows, SWIZZLE_128B) and the 1024-byte alignment of the tiles; if only one row "
          "half is bad, "
          "the accumulator row mapping (row g vs g+8)";
  else if (d >= 128 && bad_chunk[0] == 0)
    os << "S and LSE right, only columns 64 and up of O wrong: the V descriptor's LBO (MN-major: "
          "stride between "
          "64-column chunks = block_n x 128 bytes) or a later V TMA box";
  else if (bad_half[0] > 0 && bad_half[1] == 0)
    os << "S right, O wrong only in rows g (not g+8): the P register fragment order (a0..a3) of "
          "the RS WGMMA";
  else
    os << "S and LSE right, O wrong: P V side: the MN-major V descriptor (SBO = 1024 between 8-key "
          "groups, LBO "
          "between 64-column chunks, tnspB = 1), the P fragment packing (low half = lower key) or "
          "the O "
          "accumulator column mapping (8i + 2c + e%2)";
  dg.text = os.str();
  return dg;
}

struct SelfCheckCase {
  const char *name;
  int64_t d, sq, skv;
  DType dtype;
  int bm, bn, wgs, pp, ov;
  int stages = 2;
};

class Fa3SelfCheck : public ::testing::TestWithParam<SelfCheckCase> {};

TEST_P(Fa3SelfCheck, OneTile) {
  FB_SKIP_WITHOUT_HOPPER();
  const SelfCheckCase &k = GetParam();
  const AttentionProblem p = Shape{"x", 1, 1, 1, k.sq, k.skv, k.d, false, k.dtype}.problem();
  const Diagnosis dg = self_check(p, cfg(k.bm, k.bn, k.stages, k.wgs, k.pp, k.ov));
  std::cout << "FA3 SELF-CHECK " << k.name << ": " << (dg.pass ? "PASS " : "FAIL ") << dg.text
            << std::endl;
  EXPECT_TRUE(dg.pass) << dg.text;
}

INSTANTIATE_TEST_SUITE_P(
    Layout, Fa3SelfCheck,
    ::testing::Values(
        // Smallest first: one warpgroup, one 64x64 tile, d64 (one column chunk: the V LBO is not
        // exercised).
        SelfCheckCase{"d64_bm64_bn64", 64, 64, 64, DType::bf16, 64, 64, 1, 0, 0},
        SelfCheckCase{"d128_bm64_bn64", 128, 64, 64, DType::bf16, 64, 64, 1, 0, 0},
        SelfCheckCase{"d128_bm64_bn128", 128, 64, 128, DType::bf16, 64, 128, 1, 0, 0},
        SelfCheckCase{"d128_bm128_2wg", 128, 128, 128, DType::bf16, 128, 128, 2, 0, 0},
        SelfCheckCase{"d64_f16_bm128_pp", 64, 128, 128, DType::f16, 128, 128, 2, 1, 0},
        // Two K/V tiles: the online-softmax rescale and the intra-warpgroup overlap path.
        SelfCheckCase{"d128_two_tiles_overlap", 128, 64, 256, DType::bf16, 64, 128, 1, 0, 1},
        // block_n 192 (m64n192 S, 12 P V k-steps, V LBO = 192 x 128 B) with ping-pong and the
        // reordered overlap loop (O rescaled between the two issues), three K/V tiles.
        SelfCheckCase{"d128_bn192_pp_overlap", 128, 128, 576, DType::bf16, 128, 192, 2, 1, 1},
        // Separate K/V release with a 4-deep ring wrapping twice (9 tiles), then 3 consumer
        // warpgroups (block_m 192, 512 threads, 160 registers, 3-way turn ring), ragged rows.
        SelfCheckCase{"d64_bn128_st4_pp_overlap", 64, 128, 1152, DType::bf16, 128, 128, 2, 1, 1, 4},
        SelfCheckCase{"d64_bm192_3wg_pp_overlap", 64, 192, 640, DType::bf16, 192, 128, 3, 1, 1, 4},
        SelfCheckCase{"d64_bm192_3wg_pp_bn64", 64, 200, 300, DType::f16, 192, 64, 3, 1, 0, 3},
        // head_dim 256: m64n256 P V (4 V column chunks, LBO = 64 x 128 B), 16 Q K^T k-steps over 4
        // Q/K chunks; one tile first, then 2 consumers with ping-pong and overlap over 3 tiles.
        SelfCheckCase{"d256_bm64_bn64", 256, 64, 64, DType::bf16, 64, 64, 1, 0, 0},
        SelfCheckCase{"d256_f16_bm128_pp_overlap", 256, 128, 192, DType::f16, 128, 64, 2, 1, 1}),
    [](const ::testing::TestParamInfo<SelfCheckCase> &i) { return std::string(i.param.name); });

// ---- every config on awkward and long shapes
// -----------------------------------------------------------------
// o_store direct where auto falls back to direct anyway is the same kernel run twice: skipped.
bool duplicate_direct(const Config &c, int64_t head_dim) {
  fb::fa3::Params q = fb::fa3::params_of(c);
  if (q.o_store != fb::fa3::kOStoreDirect)
    return false;
  q.o_store = fb::fa3::kOStoreAuto;
  return !fb::fa3::o_staged(head_dim, q);
}

int run_all_configs(Case &c) {
  int ran = 0;
  for (const auto &e : fa3().space().expand()) {
    if (e.invalid_reason || duplicate_direct(e.config, c.problem().head_dim))
      continue;
    const Support s = fa3().supports(c.problem(), e.config, fb::test::test_device());
    if (!s) {
      EXPECT_FALSE(s.reason.empty()) << fa3().space().to_string(e.config);
      continue;
    }
    c.expect_pass(fa3(), e.config);
    ++ran;
  }
  return ran;
}

class Fa3AllConfigs : public ::testing::TestWithParam<Shape> {};

TEST_P(Fa3AllConfigs, MatchCpuReference) {
  FB_SKIP_WITHOUT_HOPPER();
  const AttentionProblem p = GetParam().problem();
  if (p.dtype == DType::f32) {
    const Support s = fa3().supports(p, fa3().space().default_config(), fb::test::test_device());
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.reason.find("fp32"), std::string::npos) << s.reason;
    return;
  }
  Case c(p);
  EXPECT_GT(run_all_configs(c), 0) << "no config of fa3_pipelined supports " << key(p);
}

INSTANTIATE_TEST_SUITE_P(Awkward, Fa3AllConfigs, ::testing::ValuesIn(fb::test::awkward_shapes()),
                         fb::test::shape_name);

const std::vector<Shape> kLongShapes = {
    // Ring wraps several times (9 tiles of 64 > 3 stages), diagonal tiles, ragged ends on both
    // sides.
    {"causal_q300_kv300_d128", 1, 2, 2, 300, 300, 128, true, DType::bf16},
    {"causal_q257_kv513_d64_f16", 1, 2, 1, 257, 513, 64, true, DType::f16},
    {"q333_kv650_d64", 2, 2, 2, 333, 650, 64, false, DType::bf16},
    {"causal_q513_kv200_d128_bhsd", 1, 4, 2, 513, 200, 128, true, DType::f16, {}, 0, Layout::bhsd},
    {"gqa_causal_q1000_kv1000_d128", 1, 8, 2, 1000, 1000, 128, true, DType::bf16},
    {"q1_kv1025_d128", 2, 2, 1, 1, 1025, 128, false, DType::bf16},
};
INSTANTIATE_TEST_SUITE_P(Long, Fa3AllConfigs, ::testing::ValuesIn(kLongShapes),
                         fb::test::shape_name);

// head_dim 256 (block_n 64; stages 2, and 3 at block_m 64; 1 or 2 consumers; overlap on and off):
// the awkward kinds again, since the shared awkward list is d64/d128 only.
const std::vector<Shape> kD256Shapes = {
    {"d256_len1", 1, 2, 2, 1, 1, 256, false, DType::bf16},
    {"d256_len1_causal_f16", 1, 2, 2, 1, 1, 256, true, DType::f16},
    // Lengths that are multiples of no tile, on both sides.
    {"d256_q77_kv131", 1, 2, 2, 77, 131, 256, false, DType::bf16},
    {"d256_q131_kv77_f16", 2, 2, 2, 131, 77, 256, false, DType::f16},
    // Causal, seqlen_q > seqlen_kv: the first 54 rows see no key (fully masked rows inside a tile).
    {"d256_causal_q131_kv77_f16", 1, 2, 2, 131, 77, 256, true, DType::f16},
    {"d256_causal_q77_kv131", 1, 2, 2, 77, 131, 256, true, DType::bf16},
    // Causal, the first 260 rows see no key: whole Q tiles skip the K/V loop (zero fill), GQA 2.
    {"d256_causal_q300_kv40_gqa", 1, 4, 2, 300, 40, 256, true, DType::bf16},
    {"d256_gqa_8_2_causal", 2, 8, 2, 100, 100, 256, true, DType::bf16},
    {"d256_mqa_f16", 1, 4, 1, 64, 200, 256, false, DType::f16},
    // Ring wraps (11 tiles of 64 > 3 stages), several diagonal tiles, bhsd.
    {"d256_causal_q300_kv700_bhsd", 1, 4, 2, 300, 700, 256, true, DType::f16, {}, 0, Layout::bhsd},
    {"d256_q1_kv1025", 2, 2, 1, 1, 1025, 256, false, DType::bf16},
};
INSTANTIATE_TEST_SUITE_P(D256, Fa3AllConfigs, ::testing::ValuesIn(kD256Shapes),
                         fb::test::shape_name);

// Keys whose spread grows along the sequence (Case's key_growth: 4 blocks with std 1, g, g^2, g^3).
// Lazy rescale, x3: with unit keys a row's maximum settles in its first K/V tile, so the rescale
// after it never runs; x3 moves every row's offset late in the loop (several times, by far more
// than the slack), with O already accumulated (the optimistic softmax's slow path, P *= alpha).
// x6 (1, 6, 36, 216): later scores land hundreds of log2 units past a row's offset, exp2
// overflows, and the kernel must recompute that tile's S (recompute_s) before the exact softmax.
struct ScoreCase {
  Shape shape;
  float growth = 0.f; // Case's key_growth
  float shift = 0.f;  // Case's score_shift (log2 units)
};
const std::vector<ScoreCase> kGrowthCases = {
    {{"grow_q333_kv1000_d128", 1, 4, 2, 333, 1000, 128, false, DType::bf16}, 3.f},
    {{"grow_causal_q700_kv1000_d64_f16", 1, 4, 4, 700, 1000, 64, true, DType::f16}, 3.f},
    {{"grow_gqa_causal_q1000_kv1000_d128", 1, 8, 2, 1000, 1000, 128, true, DType::bf16}, 3.f},
    {{"grow_q64_kv900_d256", 1, 2, 2, 64, 900, 256, false, DType::bf16}, 3.f},
    {{"jump_q200_kv700_d128", 1, 4, 2, 200, 700, 128, false, DType::bf16}, 6.f},
    {{"jump_causal_q300_kv500_d64_f16", 1, 2, 1, 300, 500, 64, true, DType::f16}, 6.f},
    {{"jump_q64_kv500_d256", 1, 2, 2, 64, 500, 256, false, DType::bf16}, 6.f},
};
// Scores shifted by +-40 and +-196 log2 units (Case's score_shift): every row's maximum lies far
// from 0, the offset a kernel might guess before its first row max (tried at a work tile's first
// K/V tile, with a slow path for +-40 and a recompute for +-196, and dropped), and
// +196 overflows exp2 of any unshifted score. Every config, causal with fully masked rows and
// seqlen_q != seqlen_kv, GQA, fp16 and bf16.
const std::vector<ScoreCase> kShiftCases = {
    {{"up40_q200_kv333_d128", 1, 4, 2, 200, 333, 128, false, DType::bf16}, 0.f, 40.f},
    {{"down40_causal_q333_kv200_d64_f16", 1, 4, 4, 333, 200, 64, true, DType::f16}, 0.f, -40.f},
    {{"up196_causal_q130_kv300_d128_f16", 1, 2, 1, 130, 300, 128, true, DType::f16}, 0.f, 196.f},
    {{"down196_q77_kv200_d64", 1, 4, 2, 77, 200, 64, false, DType::bf16}, 0.f, -196.f},
    {{"down40_q64_kv150_d256", 1, 2, 2, 64, 150, 256, false, DType::bf16}, 0.f, -40.f},
    {{"up196_causal_q150_kv100_d256_f16", 1, 2, 2, 150, 100, 256, true, DType::f16}, 0.f, 196.f},
};
class Fa3ScoreRange : public ::testing::TestWithParam<ScoreCase> {};
TEST_P(Fa3ScoreRange, EveryConfigMatchesCpuReference) {
  FB_SKIP_WITHOUT_HOPPER();
  Case c(GetParam().shape.problem(), std::random_device{}(), GetParam().growth, GetParam().shift);
  EXPECT_GT(run_all_configs(c), 0);
}
std::string score_case_name(const ::testing::TestParamInfo<ScoreCase> &i) {
  return std::string(i.param.shape.name);
}
INSTANTIATE_TEST_SUITE_P(LazyRescale, Fa3ScoreRange, ::testing::ValuesIn(kGrowthCases),
                         score_case_name);
INSTANTIATE_TEST_SUITE_P(FarFromZero, Fa3ScoreRange, ::testing::ValuesIn(kShiftCases),
                         score_case_name);

// More work tiles than an H100/H200 has SMs, so that persistent CTAs walk several tiles each
// (the K/V ring, the Q buffer and the turn ring run on across tiles, causal tiles of different
// lengths, and tiles whose rows see no key in between). Every persistent and dynamic config runs
// on them, twice in a row: the dynamic scheduler's counters must come back zero for the second.
const std::vector<Shape> kManyTileShapes = {
    {"gqa_causal_b3_h48_q300_kv400_d64", 3, 48, 12, 300, 400, 64, true, DType::bf16},
    {"gqa_causal_b2_h40_q700_kv150_d128", 2, 40, 8, 700, 150, 128, true, DType::f16},
    {"b2_h72_q257_kv333_d128", 2, 72, 72, 257, 333, 128, false, DType::bf16},
    // stream_k: fewer work tiles than SMs, long K/V, so that each tile is cut into several
    // parts (a fold of many partials), rows past seqlen_q in a split tile (block_m 192), GQA.
    {"split_b1_h3_q200_kv1500_d64", 1, 3, 3, 200, 1500, 64, false, DType::bf16},
    {"split_gqa_b1_h2_q70_kv1000_d128", 1, 2, 1, 70, 1000, 128, false, DType::f16},
};
class Fa3Persistent : public ::testing::TestWithParam<Shape> {};
TEST_P(Fa3Persistent, EveryPersistentConfigMatchesCpuReference) {
  FB_SKIP_WITHOUT_HOPPER();
  Case c(GetParam().problem());
  int ran = 0;
  for (const auto &e : fa3().space().expand()) {
    if (e.invalid_reason || e.config.get_or("scheduler", 0) == fb::fa3::kSchedOneShot ||
        duplicate_direct(e.config, c.problem().head_dim))
      continue;
    if (!fa3().supports(c.problem(), e.config, fb::test::test_device()))
      continue;
    c.expect_pass(fa3(), e.config, /*launches=*/2);
    ++ran;
  }
  EXPECT_GT(ran, 0);
}
INSTANTIATE_TEST_SUITE_P(ManyTiles, Fa3Persistent, ::testing::ValuesIn(kManyTileShapes),
                         fb::test::shape_name);

// ---- host-only
// ---------------------------------------------------------------------------------------------
TEST(Fa3Pipelined, ConfigSpaceSaysWhy) {
  const auto &sp = fa3().space();
  EXPECT_FALSE(sp.check(cfg(128, 128, 2, 2, 1, 1)).has_value());
  EXPECT_FALSE(sp.check(cfg(64, 128, 3, 1, 0, 1)).has_value());
  ASSERT_TRUE(sp.check(cfg(128, 128, 2, 1, 0, 0)).has_value());
  EXPECT_NE(sp.check(cfg(128, 128, 2, 1, 0, 0))->find("64 x consumer_wgs"), std::string::npos);
  ASSERT_TRUE(sp.check(cfg(64, 64, 2, 1, 1, 0)).has_value());
  EXPECT_NE(sp.check(cfg(64, 64, 2, 1, 1, 0))->find("pingpong"), std::string::npos);
  EXPECT_FALSE(sp.check(cfg(192, 128, 4, 3, 1, 1)).has_value());
  ASSERT_TRUE(sp.check(cfg(192, 192, 2, 3, 1, 1)).has_value());
  EXPECT_NE(sp.check(cfg(192, 192, 2, 3, 1, 1))->find("160 registers"), std::string::npos);
  EXPECT_FALSE(sp.check(sp.make({{"scheduler", "persistent"}})).has_value());
  EXPECT_FALSE(sp.check(sp.make({{"scheduler", "dynamic"}})).has_value());
  // Only the dynamic scheduler counts on semaphores (its claim counter and done count).
  const AttentionProblem p = Shape{"x", 1, 2, 2, 64, 64, 64, false, DType::bf16}.problem();
  EXPECT_EQ(fa3().semaphore_bytes(p, sp.make({{"scheduler", "dynamic"}})),
            fb::fa3::kDynamicSemaphoreBytes);
  EXPECT_EQ(fa3().semaphore_bytes(p, sp.make({{"scheduler", "persistent"}})), 0u);
  EXPECT_EQ(fa3().semaphore_bytes(p, sp.make({{"scheduler", "one_shot"}})), 0u);
}

TEST(Fa3Pipelined, OStagedWhereItFits) {
  using namespace fb::fa3;
  auto params = [](int bm, int bn, int st, int wgs, int o_store) {
    Params q;
    q.block_m = bm, q.block_n = bn, q.stages = st, q.consumers = wgs, q.o_store = o_store;
    q.scheduler = kSchedOneShot;
    return q;
  };
  // d128 block_n 128, 2 stages: 162.8 KB ring + 32 KB staging fits 227 KB.
  EXPECT_TRUE(o_staged(128, params(128, 128, 2, 2, kOStoreAuto)));
  EXPECT_EQ(launch_smem_bytes(128, params(128, 128, 2, 2, kOStoreAuto)),
            smem_bytes(128, params(128, 128, 2, 2, kOStoreAuto)) + 128 * 128 * 2);
  // The ring alone nearly fills it: block_n 192 at 2 stages, block_n 128 at 3, d256 block_m 128.
  EXPECT_FALSE(o_staged(128, params(128, 192, 2, 2, kOStoreAuto)));
  EXPECT_FALSE(o_staged(128, params(128, 128, 3, 2, kOStoreAuto)));
  EXPECT_FALSE(o_staged(256, params(128, 64, 2, 2, kOStoreAuto)));
  EXPECT_TRUE(o_staged(256, params(64, 64, 2, 1, kOStoreAuto)));
  EXPECT_TRUE(o_staged(64, params(192, 128, 4, 3, kOStoreAuto)));
  // direct never stages, and then the launch asks for the ring only.
  EXPECT_FALSE(o_staged(128, params(128, 128, 2, 2, kOStoreDirect)));
  EXPECT_EQ(launch_smem_bytes(128, params(128, 128, 2, 2, kOStoreDirect)),
            smem_bytes(128, params(128, 128, 2, 2, kOStoreDirect)));
  // A second Q buffer only for persistent CTAs, and only where it fits after the staging: d128
  // block_n 128 at 2 stages takes both (232192 of 232448 bytes).
  Params pers = params(128, 128, 2, 2, kOStoreAuto);
  EXPECT_EQ(q_buffers(128, pers), 1); // one_shot
  pers.scheduler = kSchedPersistent;
  EXPECT_EQ(q_buffers(128, pers), 2);
  EXPECT_EQ(launch_smem_bytes(128, pers), smem_bytes(128, pers) + 2 * 128 * 128 * 2);
  pers.block_n = 192;
  EXPECT_EQ(q_buffers(128, pers), 1);
  for (int64_t d : {64, 128, 256})
    for (int bn : {64, 128, 192})
      for (int st : {2, 3, 4})
        for (int wgs : {1, 2, 3})
          for (int sched : {kSchedOneShot, kSchedPersistent, kSchedDynamic}) {
            Params q = params(64 * wgs, bn, st, wgs, kOStoreAuto);
            q.scheduler = sched;
            if (smem_bytes(d, q) <= kSmemOptinHopper)
              EXPECT_LE(launch_smem_bytes(d, q), kSmemOptinHopper);
          }
}

TEST(Fa3Pipelined, PersistentGridAndL2Sections) {
  // Every resident slot, never more CTAs than work tiles.
  EXPECT_EQ(fb::fa3::persistent_grid(5000, 132, 1), 132);
  EXPECT_EQ(fb::fa3::persistent_grid(40, 132, 1), 40);
  EXPECT_EQ(fb::fa3::persistent_grid(5000, 132, 0), 132);
  // d128 bf16, N = 8192, GQA 4: a group's K+V is 4 MiB; half of a 50 MiB L2 holds 6 groups, so the
  // 16 groups (2 batches x 8 KV heads) take 3 sections, of 6, 5 and 5 groups (not 6, 6 and 4).
  AttentionProblem p = Shape{"x", 2, 32, 8, 8192, 8192, 128, true, DType::bf16}.problem();
  fb::fa3::TileOrder o = fb::fa3::tile_order(p, 128, 128, 50ll << 20);
  EXPECT_EQ(o.groups, 16);
  EXPECT_EQ(o.group, 4);
  EXPECT_EQ(o.sections, 3);
  EXPECT_EQ(o.num_q_tiles, 64);
  // Longer than half the L2: one whole GQA group per section.
  p.seqlen_kv = 131072;
  EXPECT_EQ(fb::fa3::tile_order(p, 128, 128, 50ll << 20).sections, 16);
  // Short: the whole problem is one section.
  p.seqlen_kv = 512;
  EXPECT_EQ(fb::fa3::tile_order(p, 128, 128, 50ll << 20).sections, 1);
  // A cap on a section's work tiles. Causal, 132 CTAs: two waves (264 tiles) of 64-tile groups
  // of 4 heads = 1 group a section; non-causal: one group a section whatever the cap.
  p.seqlen_kv = 8192;
  EXPECT_EQ(fb::fa3::section_tile_cap(p, 132), 264);
  EXPECT_EQ(fb::fa3::tile_order(p, 128, 128, 50ll << 20, 264).sections, 16);
  // Acceptance shape d128 N512 causal (32 x 16 heads, 4 Q tiles each): 66 heads a section, 8 sections.
  AttentionProblem s = Shape{"x", 32, 16, 16, 512, 512, 128, true, DType::bf16}.problem();
  fb::fa3::TileOrder so =
      fb::fa3::tile_order(s, 128, 128, 50ll << 20, fb::fa3::section_tile_cap(s, 132));
  EXPECT_EQ(so.sections, 8);
  EXPECT_EQ(fb::fa3::tile_order(s, 128, 128, 50ll << 20).sections, 6); // half-L2 rule alone
  s.causal = false;
  EXPECT_EQ(
      fb::fa3::tile_order(s, 128, 128, 50ll << 20, fb::fa3::section_tile_cap(s, 132)).sections,
      512);
}

// A launch's grid, work order and stream-K tail from the device's SMs, resident CTAs and L2
// (plan_launch, which launch_tile runs before every launch).
TEST(Fa3Pipelined, LaunchPlanGridOrderAndTail) {
  using namespace fb::fa3;
  const int64_t l2 = 50ll << 20;
  // The d128 N2048 acceptance shape: 8 x 16 heads x 16 Q tiles = 2048 work tiles, 15.5 waves of 132.
  const AttentionProblem p = Shape{"x", 8, 16, 16, 2048, 2048, 128, false, DType::bf16}.problem();
  Params c; // bm128 bn128, dynamic
  LaunchPlan plan = plan_launch(p, c, 128, 132, 1, l2);
  EXPECT_EQ(plan.total_tiles, 2048);
  EXPECT_EQ(plan.grid, 132);
  EXPECT_EQ(plan.split.ctas, 0);
  EXPECT_EQ(plan.split.first, 2048);   // every tile whole
  EXPECT_EQ(plan.order.sections, 128); // non-causal: one GQA group a section
  c.scheduler = kSchedOneShot;         // a CTA per work tile
  EXPECT_EQ(plan_launch(p, c, 128, 132, 1, l2).grid, 2048);
  // stream_k: 15 full waves (1980 tiles) whole, the 68 left x 16 K/V tiles shared out over 132
  // chunks, claimed by the same 132 CTAs.
  c.scheduler = kSchedStreamK;
  plan = plan_launch(p, c, 128, 132, 1, l2);
  EXPECT_EQ(plan.grid, 132);
  EXPECT_EQ(plan.split.first, 1980);
  EXPECT_EQ(plan.split.tiles, 68);
  EXPECT_EQ(plan.split.iters, 16);
  EXPECT_EQ(plan.split.ctas, 132);
  // Fewer work tiles than resident slots: the tail may take more CTAs than there are tiles (6 tiles
  // of 12 K/V tiles in chunks of at least kSplitMinIters = 4: 18 CTAs).
  const AttentionProblem few = Shape{"x", 1, 3, 3, 200, 1500, 64, false, DType::bf16}.problem();
  plan = plan_launch(few, c, 64, 132, 1, l2);
  EXPECT_EQ(plan.total_tiles, 6);
  EXPECT_EQ(plan.split.first, 0);
  EXPECT_EQ(plan.split.ctas, 18);
  EXPECT_EQ(plan.grid, 18);
  // Causal problems never split (stream_k is non-causal only); their sections are capped at two
  // waves of the resident CTAs (section_tile_cap).
  AttentionProblem causal = p;
  causal.causal = true;
  plan = plan_launch(causal, c, 128, 132, 1, l2);
  EXPECT_EQ(plan.split.ctas, 0);
  EXPECT_EQ(plan.grid, 132);
  EXPECT_EQ(plan.order.sections,
            tile_order(causal, 128, 128, l2, section_tile_cap(causal, 132)).sections);
}

// The work order visits every (Q tile, head) once, keeps each section to whole GQA groups, and
// goes heaviest Q tile first inside a section.
TEST(Fa3Pipelined, WorkOrderIsAPermutationOfWholeGroupSections) {
  for (const auto &[batch, hq, hkv, n, sections] :
       std::vector<std::tuple<int, int, int, int, int>>{{2, 32, 8, 8192, 3},
                                                        {3, 48, 12, 300, 7},
                                                        {1, 8, 8, 1000, 8},
                                                        {5, 6, 2, 77, 4},
                                                        {2, 4, 1, 64, 1}}) {
    AttentionProblem p = Shape{"x", batch, hq, hkv, n, n, 128, true, DType::bf16}.problem();
    fb::fa3::TileOrder o = fb::fa3::tile_order(p, 128, 128, 50ll << 20);
    o.sections = sections;
    const fb::fa3::TileDecoder dec(
        o); // the kernel's decoder, built once per order as a launch does
    const int nq = o.num_q_tiles, bh_total = batch * hq;
    std::vector<int> seen(size_t(nq) * bh_total, 0);
    // Walk the sections in order: section s holds `size` whole groups, the first groups % sections
    // sections one more than the rest; its tiles come heaviest Q tile first.
    int t = 0, first_group = 0;
    for (int sec = 0; sec < o.sections; ++sec) {
      const int size = o.groups / o.sections + (sec < o.groups % o.sections ? 1 : 0);
      ASSERT_GE(size, 1);
      int prev_qt = nq - 1;
      for (int i = 0; i < size * o.group * nq; ++i, ++t) {
        const fb::fa3::TileCoord c = fb::fa3::tile_coord(dec, t);
        ASSERT_GE(c.qt, 0);
        ASSERT_LE(c.qt, prev_qt) << "t " << t << ": a lighter Q tile came before a heavier one";
        ASSERT_GE(c.bh / o.group, first_group) << "t " << t << " left its section";
        ASSERT_LT(c.bh / o.group, first_group + size) << "t " << t << " left its section";
        ++seen[size_t(c.bh) * nq + c.qt];
        prev_qt = c.qt;
      }
      first_group += size;
    }
    ASSERT_EQ(t, int(o.tiles()));
    for (size_t i = 0; i < seen.size(); ++i)
      ASSERT_EQ(seen[i], 1) << "tile (bh " << i / nq << ", qt " << i % nq << ") of " << batch << "x"
                            << hq << " N " << n;
  }
}

// What the dynamic scheduler is for. Each work tile costs its K/V tiles plus one (a
// tile's start and O); 132 CTAs. Claiming tiles in the work order as CTAs free up (the dynamic
// scheduler) stays within 3% of an even share on the causal acceptance shapes; the fixed round robin
// (persistent) is measured next to it.
TEST(Fa3Pipelined, DynamicClaimsBalanceCausalWork) {
  const int ctas = 132;
  for (const auto &[n, d, bm, bn] :
       std::vector<std::tuple<int, int, int, int>>{{1024, 128, 128, 128},
                                                   {2048, 128, 128, 192},
                                                   {4096, 128, 128, 128},
                                                   {8192, 128, 128, 128},
                                                   {16384, 128, 128, 128},
                                                   {2048, 64, 128, 128},
                                                   {8192, 64, 192, 128},
                                                   {512, 128, 128, 128},
                                                   {512, 64, 128, 128}}) {
    const int heads = 2048 / d, batch = 16384 / n;
    const AttentionProblem p =
        Shape{"x", batch, heads, heads, n, n, d, true, DType::bf16}.problem();
    const fb::fa3::TileOrder o =
        fb::fa3::tile_order(p, bm, d, 50ll << 20, fb::fa3::section_tile_cap(p, ctas));
    const fb::fa3::TileDecoder dec(o);
    std::vector<double> cost;
    for (int t = 0; t < int(o.tiles()); ++t)
      cost.push_back(
          1.0 + double(fb::fa3::kv_tiles_for(fb::fa3::tile_coord(dec, t).qt, bm, bn, n, n, true)));
    double total = 0;
    for (double c : cost)
      total += c;
    std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
    for (int i = 0; i < ctas; ++i)
      free_at.push(0.0);
    std::vector<double> fixed(ctas, 0.0);
    for (size_t t = 0; t < cost.size(); ++t) {
      const double at = free_at.top();
      free_at.pop();
      free_at.push(at + cost[t]);
      fixed[t % ctas] += cost[t];
    }
    double dyn_end = 0;
    while (!free_at.empty())
      dyn_end = free_at.top(), free_at.pop();
    const double even = total / ctas, fixed_end = *std::max_element(fixed.begin(), fixed.end());
    std::printf("d%d N%d bm%d bn%d causal: even share / makespan: dynamic %.3f, round robin %.3f\n",
                d, n, bm, bn, even / dyn_end, even / fixed_end);
    EXPECT_GE(even / dyn_end, 0.97) << "d" << d << " N" << n;
  }
}

// stream_k: every chunk of the tail cut into segments covers each K/V tile of the tail exactly
// once; only a chunk's first segment may be a later part of a tile (one workspace slot a chunk);
// each split tile has one first part, in the chunk just before its later parts, which folds in
// exactly those; chunk_of finds every K/V tile's chunk (the producer walks the tail by it); and a
// chunk's K/V tiles plus its tile starts stay within the even share plus two.
TEST(Fa3Pipelined, StreamKTailCoversEveryKvTileOnce) {
  using fb::fa3::Segment;
  using fb::fa3::TailSplit;
  // The acceptance shapes at d128 (2048 work tiles on 132 SMs: 15 full waves and 68 tiles).
  const TailSplit a = fb::fa3::tail_split(2048, 132, 16);
  EXPECT_EQ(a.first, 1980);
  EXPECT_EQ(a.tiles, 68);
  EXPECT_EQ(a.ctas, 132);
  // No tail, or a tail whose shares would be shorter than min_iters for more CTAs than tiles.
  EXPECT_EQ(fb::fa3::tail_split(264, 132, 16).ctas, 0);
  EXPECT_EQ(fb::fa3::tail_split(264, 132, 16).first, 264);
  EXPECT_EQ(fb::fa3::tail_split(200, 132, 1).ctas, 0);
  EXPECT_EQ(fb::fa3::tail_split(200, 132, 0).ctas, 0);
  for (const auto &[total, grid, iters, min_iters] :
       std::vector<std::tuple<int, int, int, int>>{{2048, 132, 16, 2},
                                                   {2048, 132, 128, 2},
                                                   {2048, 132, 4, 2},
                                                   {6, 132, 12, 2},
                                                   {4, 132, 8, 2},
                                                   {432, 132, 3, 2},
                                                   {2730, 132, 32, 4},
                                                   {7, 3, 5, 1},
                                                   {1, 132, 1000, 2}}) {
    const TailSplit s = fb::fa3::tail_split(total, grid, iters, min_iters);
    ASSERT_GT(s.ctas, s.tiles) << total << " tiles of " << iters << " on " << grid;
    ASSERT_LE(s.ctas, grid);
    EXPECT_EQ(s.first + s.tiles, total);
    EXPECT_EQ(s.first % grid, 0);
    std::vector<int> seen(size_t(s.tiles) * s.iters, 0);
    std::vector<int> first_part_of(s.tiles, -1), later_parts(s.tiles, 0), folds(s.tiles, -1);
    std::vector<std::vector<int>> part_ctas(s.tiles);
    int64_t longest = 0;
    for (int c = 0; c < s.ctas; ++c) {
      int n_seg = 0, starts = 0;
      for (int g = s.lo(c), hi = s.lo(c + 1); g < hi; ++n_seg) {
        ASSERT_EQ(s.chunk_of(g), c) << "K/V tile " << g << " of the tail";
        const Segment seg = fb::fa3::segment_at(s, c, g);
        ASSERT_LT(seg.j0, seg.j1);
        for (int j = seg.j0; j < seg.j1; ++j)
          ++seen[size_t(seg.tile) * s.iters + j];
        if (seg.split < 0) {
          EXPECT_EQ(n_seg, 0) << "chunk " << c << ": a later part that is not its first segment";
          ++later_parts[seg.tile];
          part_ctas[seg.tile].push_back(c);
        } else {
          EXPECT_EQ(seg.j0, 0);
          ++starts;
          EXPECT_EQ(first_part_of[seg.tile], -1);
          first_part_of[seg.tile] = c;
          folds[seg.tile] = seg.split;
          EXPECT_EQ(seg.split == 0, seg.j1 == s.iters);
        }
        g += seg.j1 - seg.j0;
      }
      longest = std::max<int64_t>(longest, s.lo(c + 1) - s.lo(c) + starts);
    }
    for (size_t i = 0; i < seen.size(); ++i)
      ASSERT_EQ(seen[i], 1) << "K/V tile " << i % s.iters << " of tail tile " << i / s.iters;
    for (int t = 0; t < s.tiles; ++t) {
      ASSERT_GE(first_part_of[t], 0);
      EXPECT_EQ(folds[t], later_parts[t]) << "tail tile " << t;
      for (int k = 0; k < later_parts[t]; ++k)
        EXPECT_EQ(part_ctas[t][k], first_part_of[t] + 1 + k);
    }
    // Makespan of the tail in K/V tiles plus one per tile start, against whole tiles round robin.
    const int64_t whole = int64_t(s.iters) + 1;
    const int64_t even = (int64_t(s.tiles) * s.iters + s.ctas - 1) / s.ctas;
    EXPECT_LE(longest, even + 2) << total << " tiles of " << iters;
    std::printf(
        "%d tiles x %d K/V tiles on %d CTAs: tail of %d tiles in %d chunks, longest chunk %lld "
        "(whole tiles: %lld)\n",
        total, iters, grid, s.tiles, s.ctas, (long long)longest, (long long)whole);
  }
}

TEST(Fa3Pipelined, UnsupportedCombinationsSayWhy) {
  DeviceInfo dev = nominal_device();
  AttentionProblem p = Shape{"x", 1, 16, 16, 4096, 4096, 128, true, DType::bf16}.problem();
  const Config def = fa3().space().default_config();
  EXPECT_TRUE(fa3().supports(p, def, dev).ok) << fa3().supports(p, def, dev).reason;
  // The deepest ring at d128 x block_n 128 still fits an H100's 227 KB.
  EXPECT_TRUE(fa3().supports(p, cfg(128, 128, 3, 2, 1, 1), dev).ok)
      << fa3().supports(p, cfg(128, 128, 3, 2, 1, 1), dev).reason;
  // block_n 192 at d128: 2 stages fit (225.3 KB), 3 do not.
  EXPECT_TRUE(fa3().supports(p, cfg(128, 192, 2, 2, 1, 1), dev).ok)
      << fa3().supports(p, cfg(128, 192, 2, 2, 1, 1), dev).reason;
  EXPECT_NE(fa3().supports(p, cfg(128, 192, 3, 2, 1, 1), dev).reason.find("shared memory"),
            std::string::npos);
  // 3 consumer warpgroups are compiled for head_dim 64 only; stages 4 fit at d64, not d128.
  EXPECT_NE(fa3().supports(p, cfg(192, 128, 2, 3, 1, 1), dev).reason.find("head_dim 64"),
            std::string::npos);
  EXPECT_NE(fa3().supports(p, cfg(128, 128, 4, 2, 1, 1), dev).reason.find("shared memory"),
            std::string::npos);
  {
    AttentionProblem p64 = p;
    p64.head_dim = 64;
    EXPECT_TRUE(fa3().supports(p64, cfg(192, 128, 4, 3, 1, 1), dev).ok)
        << fa3().supports(p64, cfg(192, 128, 4, 3, 1, 1), dev).reason;
    EXPECT_TRUE(fa3().supports(p64, cfg(128, 192, 4, 2, 1, 1), dev).ok)
        << fa3().supports(p64, cfg(128, 192, 4, 2, 1, 1), dev).reason;
  }
  DeviceInfo ampere = dev;
  ampere.present = true, ampere.cc_major = 8, ampere.cc_minor = 0;
  EXPECT_NE(fa3().supports(p, def, ampere).reason.find("needs sm_90a"), std::string::npos);
  DeviceInfo blackwell = dev;
  blackwell.present = true, blackwell.cc_major = 10, blackwell.cc_minor = 0;
  EXPECT_NE(fa3().supports(p, def, blackwell).reason.find("needs sm_90a"), std::string::npos);
  p.head_dim = 96;
  EXPECT_NE(fa3().supports(p, def, dev).reason.find("head_dim 96"), std::string::npos);
  p.head_dim = 128;
  p.dtype = DType::f32;
  EXPECT_NE(fa3().supports(p, def, dev).reason.find("fp32"), std::string::npos);
}

// A problem runs the kernel of its kind (traits.hpp kernel_mode): non-causal, causal or stream-K's
// split, each compiled without the others' paths; d128 block_n 192 has the all-paths kernel only.
// The occupancy report (kernels()) names the same instantiation the launch runs.
TEST(Fa3Pipelined, EachProblemKindRunsItsOwnKernel) {
  using fa3::kernel_mode;
  auto shape = [](bool causal, int64_t sq, int64_t skv) {
    return Shape{"x", 2, 16, 16, sq, skv, 128, causal, DType::bf16}.problem();
  };
  const AttentionProblem plain_p = shape(false, 1024, 1024), causal_p = shape(true, 1024, 1024);
  EXPECT_EQ(kernel_mode(128, 128, plain_p, fa3::kSchedDynamic), fa3::kModePlain);
  EXPECT_EQ(kernel_mode(128, 128, causal_p, fa3::kSchedDynamic), fa3::kModeCausal);
  EXPECT_EQ(kernel_mode(64, 64, plain_p, fa3::kSchedStreamK), fa3::kModeSplit);
  EXPECT_EQ(kernel_mode(256, 64, plain_p, fa3::kSchedStreamK), fa3::kModePlain); // no split at 256
  EXPECT_EQ(kernel_mode(128, 192, causal_p, fa3::kSchedDynamic), fa3::kModeAny);
  // The causal kernel's loop is settled after key 0. Fewer queries than keys: every row sees
  // key 0; more: the first rows see no key, and the all-paths kernel runs them.
  EXPECT_EQ(kernel_mode(128, 128, shape(true, 200, 333), fa3::kSchedDynamic), fa3::kModeCausal);
  EXPECT_EQ(kernel_mode(128, 128, shape(true, 333, 200), fa3::kSchedDynamic), fa3::kModeAny);
  EXPECT_EQ(kernel_mode(128, 128, shape(false, 333, 200), fa3::kSchedDynamic), fa3::kModePlain);
  EXPECT_TRUE(fa3::mode_has_split(128, fa3::kModeSplit) && fa3::mode_has_split(64, fa3::kModeAny));
  EXPECT_FALSE(fa3::mode_has_split(256, fa3::kModeAny) ||
               fa3::mode_has_split(128, fa3::kModePlain));

  auto func = [&](bool causal, int bn, const char *sched, int64_t sq = 1024) {
    const AttentionProblem p = shape(causal, sq, 1024);
    const Config c = fa3().space().make({{"block_n", std::to_string(bn)}, {"scheduler", sched}});
    const auto ks = fa3().kernels(p, c);
    return ks.size() == 1 ? ks[0].func : nullptr;
  };
  const void *plain = func(false, 128, "dynamic"), *causal = func(true, 128, "dynamic"),
             *split = func(false, 128, "stream_k");
  ASSERT_TRUE(plain && causal && split);
  EXPECT_NE(plain, causal);
  EXPECT_NE(plain, split);
  EXPECT_NE(causal, split);
  EXPECT_EQ(plain, func(false, 128, "persistent"));
  EXPECT_EQ(causal, func(true, 128, "one_shot"));
  const void *any128 = func(true, 128, "dynamic", 1500); // rows that see no key: all paths
  ASSERT_NE(any128, nullptr);
  EXPECT_NE(any128, causal);
  EXPECT_NE(any128, plain);
  // block_n 192 at d128: one kernel for every kind.
  const void *any = func(false, 192, "dynamic");
  ASSERT_NE(any, nullptr);
  EXPECT_EQ(any, func(true, 192, "dynamic"));
  EXPECT_EQ(any, func(false, 192, "stream_k"));
}

// head_dim 256: block_n 64 only (tile_compiled, the table the slices instantiate from), 2 stages
// at block_m 128 (199424 B of shared memory; 3 stages 264960 B > 232448), 1 or 2 consumers.
TEST(Fa3Pipelined, HeadDim256TilesSayWhy) {
  EXPECT_TRUE(fa3::tile_compiled(256, 64, false));
  EXPECT_FALSE(fa3::tile_compiled(256, 128, false));
  EXPECT_FALSE(fa3::tile_compiled(256, 192, false));
  EXPECT_FALSE(fa3::tile_compiled(256, 64, true));
  EXPECT_TRUE(fa3::head_dim_ok(256));

  const DeviceInfo dev = nominal_device();
  for (DType t : {DType::bf16, DType::f16}) {
    const AttentionProblem p = Shape{"x", 1, 16, 16, 4096, 4096, 256, true, t}.problem();
    for (int ov : {0, 1}) {
      for (int pp : {0, 1}) {
        const Config c = cfg(128, 64, 2, 2, pp, ov);
        const Support s = fa3().supports(p, c, dev);
        EXPECT_TRUE(s.ok) << fa3().space().to_string(c) << ": " << s.reason;
        // The slice has the kernel (the occupancy report gets it): one CTA of 3 warpgroups.
        const auto ks = fa3().kernels(p, c);
        ASSERT_EQ(ks.size(), 1u) << fa3().space().to_string(c);
        EXPECT_NE(ks[0].func, nullptr);
        EXPECT_EQ(ks[0].block_threads, 384);
        EXPECT_LE(ks[0].dynamic_smem, size_t(232448));
      }
      // One consumer (block_m 64): stages 2 and 3 fit (232192 B of 232448), 4 do not.
      for (int st : {2, 3}) {
        const Config c = cfg(64, 64, st, 1, 0, ov);
        EXPECT_TRUE(fa3().supports(p, c, dev).ok) << fa3().supports(p, c, dev).reason;
        EXPECT_EQ(fa3().kernels(p, c).size(), 1u);
      }
      const std::string st4 = fa3().supports(p, cfg(64, 64, 4, 1, 0, ov), dev).reason;
      EXPECT_NE(st4.find("shared memory"), std::string::npos) << st4;
      EXPECT_NE(st4.find("stages 3 or fewer fits"), std::string::npos) << st4;
    }
    // block_n 128 and 192: not compiled at d256, with the reason and what to use instead.
    for (int bn : {128, 192}) {
      const Support s = fa3().supports(p, cfg(128, bn, 2, 2, 1, 1), dev);
      EXPECT_FALSE(s.ok);
      const std::string why = "block_n " + std::to_string(bn) + " is not compiled for head_dim 256";
      EXPECT_NE(s.reason.find(why), std::string::npos) << s.reason;
      EXPECT_NE(s.reason.find("block_n 64 only"), std::string::npos) << s.reason;
      EXPECT_TRUE(fa3().kernels(p, cfg(128, bn, 2, 2, 1, 1)).empty());
    }
    EXPECT_FALSE(fa3().supports(p, cfg(64, 128, 2, 1, 0, 0), dev).ok);
    // stages 3 at block_m 128: the shared-memory reason, saying that 2 stages fit.
    const Support st3 = fa3().supports(p, cfg(128, 64, 3, 2, 1, 1), dev);
    EXPECT_FALSE(st3.ok);
    EXPECT_NE(st3.reason.find("shared memory"), std::string::npos) << st3.reason;
    EXPECT_NE(st3.reason.find("stages 2 fits at block_m 128, block_n 64"), std::string::npos)
        << st3.reason;
    // 3 consumers (160 registers each): head_dim 64 only.
    const Support wide = fa3().supports(p, cfg(192, 64, 2, 3, 1, 1), dev);
    EXPECT_NE(wide.reason.find("head_dim 64"), std::string::npos) << wide.reason;
    // The default config (block_n 128) is not one d256 runs: the reason names block_n.
    EXPECT_NE(fa3().supports(p, fa3().space().default_config(), dev).reason.find("block_n 64"),
              std::string::npos);
  }
}

TEST(Fa3Pipelined, TrafficModelIsOneKvPassPerQTile) {
  AttentionProblem p = Shape{"x", 1, 1, 1, 1024, 1024, 128, false, DType::bf16}.problem();
  const Config c = fa3().space().default_config(); // block_m 128
  const double want = 2.0 * 2 * 1024 * 128 + 4.0 * 1024 + 8 * 2.0 * 2 * 1024 * 128;
  EXPECT_DOUBLE_EQ(fa3().model_bytes(p, c), want);
  p.causal = true;
  EXPECT_LT(fa3().model_bytes(p, c), 0.65 * want);
}

// A causal warpgroup computes K/V tiles up to its own last row's last visible key
// (kv_tiles_to_row, as make_ctx does on the device) and passes over the rest of its work tile's.
// The counts the design's predictions came from: block_m 192, block_n 128, 3 consumers.
TEST(Fa3Pipelined, WarpgroupsPassOverTilesRightOfTheirDiagonal) {
  struct Count {
    int computed = 0, passed = 0;
  };
  auto count = [](int seqlen_q, int seqlen_kv, int block_m, int block_n) {
    Count n;
    for (int q0 = 0; q0 < seqlen_q; q0 += block_m) {
      const int tiles = fa3::kv_tiles_to_row(std::min(q0 + block_m, seqlen_q) - 1, block_n,
                                             seqlen_q, seqlen_kv, true);
      for (int r0 = q0; r0 < q0 + block_m && r0 < seqlen_q; r0 += 64) {
        const int own = std::max(1, fa3::kv_tiles_to_row(std::min(r0 + 64, seqlen_q) - 1, block_n,
                                                         seqlen_q, seqlen_kv, true));
        EXPECT_LE(own, tiles);
        n.computed += own;
        n.passed += tiles - own;
      }
    }
    return n;
  };
  const Count n512 = count(512, 512, 192, 128), n1024 = count(1024, 1024, 192, 128);
  EXPECT_EQ(n512.computed + n512.passed, 23);
  EXPECT_EQ(n512.passed, 3);
  EXPECT_EQ(n1024.computed + n1024.passed, 80);
  EXPECT_EQ(n1024.passed, 8);
  // block_m = block_n = 128 on multiples of 128: nothing to pass over.
  EXPECT_EQ(count(512, 512, 128, 128).passed, 0);
  // Bottom-right alignment moves the diagonal: 130 queries on 200 keys, block_n 64 (sanitize.txt's
  // shape): the first warpgroup sees keys up to 133 (3 tiles), the work tile up to 197 (4).
  EXPECT_EQ(count(130, 200, 128, 64).passed, 1);
}

} // namespace
