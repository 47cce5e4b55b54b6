// fa2_bwd's host logic on the CPU: which row blocks a column block visits (against the causal rule pair by pair),
// the workspace and semaphore sizes, the traffic model's parts, and the reasons supports() gives.
#include "kernels/fa2_bwd/traffic.hpp"
#include "kernels/fa2_bwd/traits.hpp"

#include "flashbench/variant.hpp"
#include "kernels/common/mask.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

using namespace fb;

namespace {

AttentionProblem bwd_problem(int64_t sq, int64_t skv, int64_t d, bool causal, int64_t hq = 4,
                             int64_t hkv = 4) {
  AttentionProblem p;
  p.batch = 2, p.heads_q = hq, p.heads_kv = hkv, p.seqlen_q = sq, p.seqlen_kv = skv;
  p.head_dim = d, p.causal = causal, p.pass = Pass::bwd;
  return p;
}

// support_for as a gtest assertion: its reason is the failure message.
::testing::AssertionResult runs(const Variant &v, const AttentionProblem &p, const Config &c,
                                const DeviceInfo &dev) {
  const Support s = support_for(v, p, c, dev);
  return s.ok ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << s.reason;
}

// Does some row of row block m see some key of column block n (brute force over the rows)?
bool visits(int64_t m, int64_t n, int64_t bm, int64_t bn, const AttentionProblem &p) {
  for (int64_t r = m * bm; r < std::min((m + 1) * bm, p.seqlen_q); ++r)
    if (kernels::visible_keys(r, p.seqlen_q, p.seqlen_kv, p.causal) > n * bn)
      return true;
  return false;
}

} // namespace

TEST(Fa2BwdTraits, RowAndColumnRangesMatchTheCausalRule) {
  for (bool causal : {false, true})
    for (auto [sq, skv] : {std::pair<int64_t, int64_t>{1, 1},
                           {77, 131},
                           {131, 77},
                           {40, 1},
                           {300, 300},
                           {1, 300},
                           {257, 513}})
      for (auto [bm, bn] : {std::pair<int64_t, int64_t>{64, 128}, {128, 64}, {128, 128}}) {
        const AttentionProblem p = bwd_problem(sq, skv, 64, causal);
        const int64_t rows = (sq + bm - 1) / bm, cols = (skv + bn - 1) / bn;
        for (int64_t n = 0; n < cols; ++n) {
          const fa2_bwd::RowRange r = fa2_bwd::row_blocks_for(n, bm, bn, sq, skv, causal);
          EXPECT_EQ(r.end, rows);
          for (int64_t m = 0; m < rows; ++m) {
            const bool v = visits(m, n, bm, bn, p);
            EXPECT_EQ(v, m >= r.first) << key(p) << " n " << n << " m " << m;
            // The deterministic order counts the visitors of a row block as columns 0 .. col_blocks_for - 1.
            EXPECT_EQ(v, n < fa2_bwd::col_blocks_for(m, bm, bn, sq, skv, causal))
                << key(p) << " n " << n << " m " << m;
          }
        }
      }
}

TEST(Fa2BwdTraits, WorkspaceAndSemaphores) {
  AttentionProblem p = bwd_problem(100, 300, 128, true, 8, 2);
  fa2_bwd::Params c;
  c.block_m = 64;
  const fa2_bwd::Workspace w = fa2_bwd::workspace_layout(p, c);
  const int64_t rows = 2 * 8 * 128; // padded to two row blocks
  EXPECT_EQ(w.dq_acc, 0);
  EXPECT_EQ(w.lse2, 4 * rows * 128);
  EXPECT_EQ(w.delta, w.lse2 + 4 * rows);
  EXPECT_EQ(w.total, w.delta + 4 * rows);
  EXPECT_EQ(w.lse2 % 16, 0); // cp.async reads LSE₂ and D in 16-byte chunks
  EXPECT_EQ(fa2_bwd::semaphore_count(p, c), 0);
  c.deterministic = 1;
  EXPECT_EQ(fa2_bwd::semaphore_count(p, c), 2 * 8 * 2 * c.warps);
}

TEST(Fa2BwdTraits, TrafficModelParts) {
  // Non-causal, whole blocks: every column block visits every row block of every query head.
  const AttentionProblem p = bwd_problem(256, 512, 64, false, 4, 2);
  fa2_bwd::Params c; // 64 x 128
  const fa2_bwd::Traffic t = fa2_bwd::traffic(p, c);
  const double e = 2, d = 64, pairs = 2.0 * 4 * (256 / 64) * (512 / 128);
  EXPECT_DOUBLE_EQ(t.kv, 2.0 * 2 * 4 * e * d * 512);
  EXPECT_DOUBLE_EQ(t.q_rows, pairs * (2 * e * d * 64 + 8 * 64));
  EXPECT_DOUBLE_EQ(t.dq_add, pairs * 4 * d * 64);
  EXPECT_DOUBLE_EQ(t.total(), fa2_bwd::traffic_bytes(p, c));
  // Causal visits fewer pairs.
  AttentionProblem pc = p;
  pc.causal = true;
  EXPECT_LT(fa2_bwd::traffic(pc, c).dq_add, t.dq_add);
}

TEST(Fa2BwdVariant, SupportsSaysWhy) {
  const Variant &v = catalog().get("fa2_bwd");
  EXPECT_EQ(v.pass(), Pass::bwd);
  const DeviceInfo h100 = nominal_device();
  AttentionProblem p = bwd_problem(1024, 1024, 128, true);
  const Config def = v.space().default_config(p, h100);
  EXPECT_TRUE(runs(v, p, def, h100));

  AttentionProblem f = p;
  f.pass = Pass::fwd;
  EXPECT_FALSE(support_for(v, f, def, h100).ok);

  AttentionProblem d96 = p;
  d96.head_dim = 96;
  EXPECT_NE(v.supports(d96, def, h100).reason.find("head_dim 96"), std::string::npos);

  AttentionProblem f32 = p;
  f32.dtype = DType::f32;
  EXPECT_NE(v.supports(f32, def, h100).reason.find("fp32"), std::string::npos);

  // d128 128 x 128 is not compiled (256 accumulator registers a thread).
  Config big = def;
  big.set("block_m", 128);
  big.set("block_n", 128);
  EXPECT_NE(v.supports(p, big, h100).reason.find("not compiled"), std::string::npos);

  // The tile axes below with the natural order (lpt and sections are compiled for the default tiles only).
  Config nat = def;
  nat.set("order", 0);
  // frag_prefetch on is compiled for d64's default tile only.
  Config pf = nat;
  pf.set("frag_prefetch", 1);
  EXPECT_NE(v.supports(p, pf, h100).reason.find("frag_prefetch on is not compiled"),
            std::string::npos)
      << v.supports(p, pf, h100).reason;

  // dQ with 4 row warps under warp_layout m2 is compiled for the d64 default tile only.
  Config dq = nat;
  dq.set("dq_layout", 4);
  EXPECT_NE(v.supports(p, dq, h100).reason.find("dq_layout m4 is not compiled"), std::string::npos)
      << v.supports(p, dq, h100).reason;
  AttentionProblem d64 = p;
  d64.head_dim = 64;
  Config dq64 = v.space().default_config(d64, h100);
  EXPECT_TRUE(runs(v, d64, dq64, h100));
  dq64.set("order", 0);
  dq64.set("dq_layout", 4);
  EXPECT_TRUE(runs(v, d64, dq64, h100));
  dq64.set("frag_prefetch", 1);
  EXPECT_TRUE(runs(v, d64, dq64, h100));

  // d256 at two stages needs 209 KB: more than an A100 allows; its default takes one stage.
  DeviceInfo a100 = h100;
  a100.present = true;
  a100.cc_major = 8;
  a100.smem_per_block_optin = 163 * 1024;
  AttentionProblem d256 = p;
  d256.head_dim = 256;
  Config two = v.space().default_config(d256, h100);
  EXPECT_EQ(two.get("stages"), 2);
  EXPECT_NE(v.supports(d256, two, a100).reason.find("shared memory"), std::string::npos);
  const Config one = v.space().default_config(d256, a100);
  EXPECT_EQ(one.get("stages"), 1);
  EXPECT_TRUE(v.supports(d256, one, a100).ok) << v.supports(d256, one, a100).reason;
}

// row_order rotated: non-causal only; with deterministic on, a head's column blocks must fit the SMs at once.
TEST(Fa2BwdVariant, RotatedRowOrderSaysWhereItRuns) {
  const Variant &v = catalog().get("fa2_bwd");
  DeviceInfo h100 = nominal_device();
  h100.present = true;
  h100.sm_count = 132;
  AttentionProblem p = bwd_problem(4096, 4096, 128, false);
  Config c = v.space().default_config(p, h100);
  c.set("row_order", 1);
  EXPECT_TRUE(runs(v, p, c, h100));
  c.set("deterministic", 1);
  EXPECT_TRUE(runs(v, p, c, h100));
  AttentionProblem causal = p;
  causal.causal = true;
  EXPECT_NE(v.supports(causal, c, h100).reason.find("non-causal"), std::string::npos);
  AttentionProblem longkv = p;
  longkv.seqlen_kv = 32768; // 256 column blocks of 128 keys
  EXPECT_NE(v.supports(longkv, c, h100).reason.find("256 column blocks resident"),
            std::string::npos)
      << v.supports(longkv, c, h100).reason;
  c.set("deterministic", 0); // no waits without the order
  EXPECT_TRUE(runs(v, longkv, c, h100));
}

TEST(Fa2BwdVariant, DefaultsAreFa2Tiles) {
  const Variant &v = catalog().get("fa2_bwd");
  const DeviceInfo h100 = nominal_device();
  // head_dim -> block_m, block_n, frag_prefetch, dq_layout of the default; 8 warps, deterministic off everywhere.
  const std::map<int64_t, std::array<int64_t, 4>> want = {
      {64, {128, 128, 0, 4}}, {128, {64, 128, 0, 0}}, {256, {64, 64, 0, 0}}};
  for (const auto &[d, w] : want) {
    const AttentionProblem p = bwd_problem(4096, 4096, d, false, 32, 32);
    const Config c = v.space().default_config(p, h100);
    EXPECT_EQ(c.get("block_m"), w[0]) << d;
    EXPECT_EQ(c.get("block_n"), w[1]) << d;
    EXPECT_EQ(c.get("frag_prefetch"), w[2]) << d;
    EXPECT_EQ(c.get("dq_layout"), w[3]) << d;
    EXPECT_EQ(c.get("warps"), 8) << d;
    EXPECT_EQ(c.get("deterministic"), 0) << d;
    EXPECT_TRUE(support_for(v, p, c, h100).ok) << d << ": " << support_for(v, p, c, h100).reason;
  }
}

// The launch order: sections under a causal mask (column blocks of unequal length), natural otherwise and whenever
// deterministic fixes it; deterministic with another order says why.
TEST(Fa2BwdVariant, LaunchOrderFollowsTheMaskAndDeterminism) {
  const Variant &v = catalog().get("fa2_bwd");
  const DeviceInfo h100 = nominal_device();
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true}) {
      const AttentionProblem p = bwd_problem(2048, 3000, d, causal);
      const Config c = v.space().default_config(p, h100);
      EXPECT_EQ(c.get("order"),
                causal ? fb::kernels::bwd::kOrderSections : fb::kernels::bwd::kOrderNatural)
          << d;
      EXPECT_TRUE(support_for(v, p, c, h100).ok) << support_for(v, p, c, h100).reason;
      Config lpt = c;
      lpt.set("order", fb::kernels::bwd::kOrderLpt);
      EXPECT_TRUE(support_for(v, p, lpt, h100).ok) << support_for(v, p, lpt, h100).reason;
    }
  const AttentionProblem causal = bwd_problem(4096, 4096, 128, true);
  Config det = v.space().default_config();
  det.set("deterministic", 1);
  const Config c = fa2_bwd::default_for(det, causal, h100);
  EXPECT_EQ(c.get("order"), fb::kernels::bwd::kOrderNatural);
  EXPECT_TRUE(support_for(v, causal, c, h100).ok) << support_for(v, causal, c, h100).reason;
  Config bad = c;
  bad.set("order", fb::kernels::bwd::kOrderSections);
  const std::string why = support_for(v, causal, bad, h100).reason;
  EXPECT_NE(why.find("use order natural"), std::string::npos) << why;
}

// The grid of each order, decoded as the kernel does (natural: column block x, reversed when deterministic, kv head
// y, batch z; lpt and sections: column block y, pair z · per + x, pairs past the last exiting): every (column
// block, pair) once, and in launch order (x fastest, then y, then z) natural runs each pair's column blocks
// together (rightmost first when deterministic), lpt every pair's first column block before any second, and
// sections lpt within runs of per pairs.
TEST(Fa2BwdTraits, LaunchGridCoversEveryColumnBlockOnceInItsOrder) {
  using namespace fb::kernels::bwd;
  for (auto [b, hkv, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 64},
                           {3, 5, 1000},
                           {16, 16, 1024},
                           {2, 16, 8192},
                           {1, 16, 16384}})
    for (int order : {kOrderNatural, kOrderLpt, kOrderSections})
      for (int det : {0, 1}) {
        if (det && order != kOrderNatural)
          continue;
        AttentionProblem p = bwd_problem(n, n, 128, true, hkv, hkv);
        p.batch = b;
        fa2_bwd::Params c;
        c.order = order, c.deterministic = det;
        const fa2_bwd::LaunchGrid g = fa2_bwd::launch_grid(p, c, 132, int64_t(50) << 20);
        const int64_t cols = fa2_bwd::num_col_blocks(p, c), pairs = b * hkv;
        const bool natural = order == kOrderNatural;
        EXPECT_EQ(natural ? g.x : g.y, cols);
        if (!natural) {
          ASSERT_GE(g.x * g.z, pairs);
          ASSERT_LT((g.z - 1) * g.per, pairs); // no section wholly past the last pair
        }
        std::vector<int> seen(size_t(cols * pairs), 0);
        std::vector<std::pair<int64_t, int64_t>> launched; // (column block, pair) in launch order
        for (int64_t z = 0; z < g.z; ++z)
          for (int64_t y = 0; y < g.y; ++y)
            for (int64_t x = 0; x < g.x; ++x) {
              const int64_t pair = natural ? z * hkv + y : z * g.per + x;
              const int64_t col = natural ? (det ? cols - 1 - x : x) : y;
              if (pair >= pairs)
                continue;
              ASSERT_TRUE(col >= 0 && col < cols);
              ++seen[size_t(pair * cols + col)];
              launched.push_back({col, pair});
            }
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int k) { return k == 1; }));
        if (natural)
          for (size_t i = 0; i < launched.size(); ++i) {
            const int64_t pos = int64_t(i) % cols;
            EXPECT_EQ(launched[i].second, int64_t(i) / cols);
            EXPECT_EQ(launched[i].first, det ? cols - 1 - pos : pos);
          }
        if (order == kOrderLpt)
          for (size_t i = 0; i < launched.size(); ++i)
            EXPECT_EQ(launched[i].first, int64_t(i) / pairs);
        if (order == kOrderSections)
          for (size_t i = 1; i < launched.size(); ++i) {
            // Within a section the column block never decreases; a new section starts at column block 0.
            const bool same_section = launched[i].second / g.per == launched[i - 1].second / g.per;
            if (same_section)
              EXPECT_GE(launched[i].first, launched[i - 1].first);
            else
              EXPECT_EQ(launched[i].first, 0);
          }
      }
}

// deterministic and the lpt and sections orders are compiled for each head_dim's default tile only.
TEST(Fa2BwdVariant, DeterministicAndRemappedOrdersRunOnTheDefaultTiles) {
  const Variant &v = catalog().get("fa2_bwd");
  const DeviceInfo h100 = nominal_device();
  for (int64_t d : {64, 128, 256}) {
    const AttentionProblem p = bwd_problem(1000, 1000, d, true);
    const Config def = v.space().default_config(p, h100);
    for (auto [det, order] : {std::pair<int, int>{1, kernels::bwd::kOrderNatural},
                              {0, kernels::bwd::kOrderLpt},
                              {0, kernels::bwd::kOrderSections}}) {
      Config c = def;
      c.set("deterministic", det);
      c.set("order", order);
      EXPECT_TRUE(support_for(v, p, c, h100).ok) << d << ": " << support_for(v, p, c, h100).reason;
      c.set("block_m", d == 64 ? 64 : 128);
      c.set("block_n", d == 256 ? 64 : 128);
      c.set("dq_layout", 0);
      if (d == 128)
        c.set("block_n", 64);
      const std::string why = support_for(v, p, c, h100).reason;
      EXPECT_NE(why.find("compiled for the default tiles"), std::string::npos) << d << ": " << why;
    }
  }
}

// The dQ accumulator's fragment order is a permutation of each row block's block_m x head_dim floats (the convert
// kernel reads every element once and the main kernel adds a row block at its row-major base), keeps column pairs
// adjacent (the convert's float2 loads), and puts lane l's m16n8 accumulator fragment (rows r, r + 8; columns 2c,
// 2c + 1) as the float4 at 4l of its tile's 128 floats (the kernel's 16-byte reductions).
template <int D> void check_frag_order(int block_m) {
  using Order = fa2_bwd::FragOrder;
  std::vector<int> seen(size_t(2 * block_m * D), 0);
  for (int row = 0; row < 2 * block_m; ++row)
    for (int col = 0; col < D; ++col) {
      const int64_t o = Order::offset<D>(row, col);
      ASSERT_GE(o, int64_t(row / block_m) * block_m * D);
      ASSERT_LT(o, int64_t(row / block_m + 1) * block_m * D);
      ++seen[size_t(o)];
      if (col % 2 == 0)
        EXPECT_EQ(Order::offset<D>(row, col + 1), o + 1);
    }
  for (int k : seen)
    ASSERT_EQ(k, 1);
  for (int r16 = 0; r16 < 2 * block_m; r16 += 16)
    for (int c8 = 0; c8 < D; c8 += 8)
      for (int l = 0; l < 32; ++l) {
        const int64_t base = (int64_t(r16 / 16) * (D / 8) + c8 / 8) * 128 + 4 * l;
        const int r = r16 + l / 4, c = c8 + 2 * (l % 4);
        EXPECT_EQ(Order::offset<D>(r, c), base);
        EXPECT_EQ(Order::offset<D>(r, c + 1), base + 1);
        EXPECT_EQ(Order::offset<D>(r + 8, c), base + 2);
        EXPECT_EQ(Order::offset<D>(r + 8, c + 1), base + 3);
      }
}
TEST(Fa2BwdTraits, FragOrderIsAPermutationOfFragments) {
  check_frag_order<64>(64);
  check_frag_order<64>(128);
  check_frag_order<128>(64);
  check_frag_order<128>(128);
  check_frag_order<256>(64);
}
