// fa3_bwd's host logic on the CPU: the config space and its defaults, the launch order (a bijection, and the orders
// the deterministic dQ sum and lpt rest on), the shared-memory map, the workspace, semaphore and traffic-model
// sizes, the reasons supports() gives, and the variant's sweep specs.
#include "kernels/catalog.hpp"
#include "kernels/fa3_bwd/traffic.hpp"
#include "kernels/fa3_bwd/traits.hpp"

#include "flashbench/errors.hpp"
#include "flashbench/spec.hpp"
#include "flashbench/variant.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

using namespace fb;

namespace {

const Variant &variant() { return catalog().get("fa3_bwd"); }

AttentionProblem bwd_problem(int64_t sq, int64_t skv, int64_t d, bool causal, int64_t hq = 4,
                             int64_t hkv = 4, DType t = DType::bf16) {
  AttentionProblem p;
  p.batch = 2, p.heads_q = hq, p.heads_kv = hkv, p.seqlen_q = sq, p.seqlen_kv = skv;
  p.head_dim = d, p.causal = causal, p.dtype = t, p.pass = Pass::bwd;
  return p;
}

DeviceInfo h100() {
  DeviceInfo d = nominal_device();
  d.present = true;
  d.name = "NVIDIA H100 80GB HBM3";
  return d;
}

DeviceInfo a100() {
  DeviceInfo d = h100();
  d.name = "NVIDIA A100-SXM4-80GB";
  d.cc_major = 8, d.cc_minor = 0, d.sm_count = 108;
  d.smem_per_block_optin = 163 * 1024;
  return d;
}

bool has(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST(Fa3BwdTraits, ConfigProblemSaysWhy) {
  const fa3_bwd::Params ok;
  EXPECT_FALSE(fa3_bwd::config_problem(ok));
  auto why = [](fa3_bwd::Params c) { return fa3_bwd::config_problem(c).value_or(""); };
  fa3_bwd::Params c = ok;
  c.stages = 3;
  EXPECT_TRUE(has(why(c), "stages must be 1 or 2")) << why(c);
  c = ok, c.stages = 0;
  EXPECT_TRUE(has(why(c), "stages")) << why(c);
  c = ok, c.order = 3;
  EXPECT_TRUE(has(why(c), "order must be natural, lpt or sections")) << why(c);
  c = ok, c.order = fa3_bwd::kOrderSections;
  EXPECT_FALSE(fa3_bwd::config_problem(c));
  c.deterministic = 1;
  EXPECT_TRUE(has(why(c), "use order natural")) << why(c);
  c = ok, c.deterministic = 2;
  EXPECT_TRUE(has(why(c), "deterministic must be off or on")) << why(c);
  c = ok, c.deterministic = 1, c.order = fa3_bwd::kOrderLpt;
  EXPECT_TRUE(has(why(c), "use order natural")) << why(c);
  c.order = fa3_bwd::kOrderNatural;
  EXPECT_FALSE(fa3_bwd::config_problem(c));
  c.dq_add = fa3_bwd::kDqRed; // the counters are waited on by the bulk adder
  EXPECT_TRUE(has(why(c), "use dq_add bulk")) << why(c);
  c = ok, c.dq_add = 2;
  EXPECT_TRUE(has(why(c), "dq_add must be red or bulk")) << why(c);
  c.dq_add = fa3_bwd::kDqRed;
  EXPECT_FALSE(fa3_bwd::config_problem(c));
  c = ok, c.row_tail = 2;
  EXPECT_TRUE(has(why(c), "row_tail must be off or on")) << why(c);
  // row_tail off is a no-op off 80-row blocks: refused, so that a sweep does not time it twice.
  c = ok, c.row_tail = 0;
  EXPECT_TRUE(has(why(c), "block_m 80")) << why(c);
  c.block_m = 80;
  EXPECT_FALSE(fa3_bwd::config_problem(c));
}

TEST(Fa3BwdTraits, TailRowsCoverThePartialLastBlockIn16RowSteps) {
  fa3_bwd::Params c;
  c.block_m = 80;
  const auto rows = [&](int64_t n) {
    return fa3_bwd::tail_rows(bwd_problem(n, 4096, 128, false, 16, 16), c);
  };
  // The power-of-two lengths: 4096 = 51 x 80 + 16, 8192 = 102 x 80 + 32, 2048 = 25 x 80 + 48, 1024 = 12 x 80 + 64.
  EXPECT_EQ(rows(4096), 16);
  EXPECT_EQ(rows(8192), 32);
  EXPECT_EQ(rows(2048), 48);
  EXPECT_EQ(rows(1024), 64);
  EXPECT_EQ(rows(16384), 64);
  EXPECT_EQ(rows(1), 16);   // one row: the whole problem is the tail
  EXPECT_EQ(rows(500), 32); // 20 rows past 6 blocks
  EXPECT_EQ(rows(4000), 0); // a multiple of 80
  EXPECT_EQ(rows(300), 64); // 60 rows
  EXPECT_EQ(rows(75), 0);   // 75 rows round up to the whole block
  c.row_tail = 0;
  EXPECT_EQ(rows(4096), 0);
  c.row_tail = 1, c.block_m = 64; // dQ split by columns: no tail path
  EXPECT_EQ(rows(4000), 0);
  c.block_m = 128;
  EXPECT_EQ(rows(4000), 0);
}

TEST(Fa3BwdTraits, DefaultFollowsTheMask) {
  const ConfigSpace &space = variant().space();
  for (int64_t d : {64, 128})
    for (int64_t n : {1, 1024, 4096, 4097, 16384})
      for (bool causal : {false, true}) {
        const AttentionProblem p = bwd_problem(n, n, d, causal);
        const Config c = space.default_config(p, h100());
        EXPECT_EQ(c.get("stages"), 2);
        EXPECT_EQ(c.get("deterministic"), 0);
        EXPECT_EQ(c.get("dq_add"), fa3_bwd::kDqBulk);
        EXPECT_EQ(c.get("order"), causal ? fa3_bwd::kOrderSections : fa3_bwd::kOrderNatural) << n;
        // 128 rows at head_dim 64; at 128, 80 without a causal mask and 64 with one.
        EXPECT_EQ(c.get("block_m"), d == 64 ? 128 : causal ? 64 : 80) << n;
        EXPECT_TRUE(fa3_bwd::block_m_compiled(d, int(c.get("block_m"))));
        EXPECT_FALSE(space.check(c)) << space.to_string(c);
      }
  // Deterministic fixes the order: natural even under a causal mask.
  Config det = space.default_config();
  det.set("deterministic", 1);
  const Config c = fa3_bwd::default_for(det, bwd_problem(4096, 4096, 128, true), h100());
  EXPECT_EQ(c.get("order"), fa3_bwd::kOrderNatural);
  EXPECT_FALSE(space.check(c)) << space.to_string(c);
}

TEST(Fa3BwdTraits, SmemMapIsAlignedAndFitsAHopper) {
  for (auto [d, bm] : {std::pair<int64_t, int>{64, 64}, {64, 128}, {128, 64}, {128, 80}}) {
    EXPECT_TRUE(fa3_bwd::block_m_compiled(d, bm));
    for (int stages : {1, 2})
      for (int dq_add : {fa3_bwd::kDqRed, fa3_bwd::kDqBulk}) {
        const fa3_bwd::SmemMap m = fa3_bwd::smem_map(d, bm, stages, dq_add);
        SCOPED_TRACE("d" + std::to_string(d) + " block_m " + std::to_string(bm) + " stages " +
                     std::to_string(stages) + " dq_add " + std::to_string(dq_add));
        // Every TMA / WGMMA tile at a 1024-byte boundary (the 128B swizzle's period), in each slot too.
        for (int64_t off : {m.k, m.v, m.slots, m.slot_bytes, m.q, m.dout, m.ds, m.ds_bytes})
          EXPECT_EQ(off % 1024, 0) << off;
        // The mbarriers: 8-byte aligned.
        EXPECT_EQ(m.bars % 8, 0);
        // No overlap: K, V, the slots (Q, dO, LSE₂, D), the two dS buffers, the barriers.
        const int64_t kv = fa3_bwd::kBlockN * d * 2, qt = int64_t(bm) * d * 2;
        EXPECT_GE(m.v, m.k + kv);
        EXPECT_GE(m.slots, m.v + kv);
        EXPECT_GE(m.dout, m.q + qt);
        EXPECT_LE(m.dout + qt, m.slot_bytes);
        EXPECT_GE(m.ds, m.slots + stages * m.slot_bytes);
        EXPECT_EQ(m.ds_bytes, int64_t(bm) * fa3_bwd::kBlockN * 2);
        // The bulk reduce's source: 16-byte aligned, the whole fp32 tile; none with dq_add red.
        EXPECT_GE(m.dq, m.ds + 2 * m.ds_bytes);
        EXPECT_EQ(m.dq % 16, 0);
        EXPECT_EQ(m.dq_bytes, dq_add == fa3_bwd::kDqBulk ? int64_t(bm) * d * 4 : 0);
        // Two dQ buffers wherever they fit with two stages on a Hopper GPU: at head_dim 128's 64-row blocks;
        // head_dim 64's 128-row tiles leave room for one (72 bytes short of two), head_dim 128's 80-row ones too.
        EXPECT_EQ(m.dq_bufs, dq_add == fa3_bwd::kDqBulk ? (bm == 64 ? 2 : 1) : 0);
        EXPECT_GE(m.rows, m.dq + m.dq_bufs * m.dq_bytes);
        EXPECT_EQ(m.rows % 16, 0);
        EXPECT_EQ(m.rows_bytes, 8 * bm); // LSE₂ and D
        EXPECT_GE(m.bars, m.rows + fa3_bwd::kRowsBuffers * m.rows_bytes);
        EXPECT_GE(m.total, m.bars + 8 * fa3_bwd::kBarriers + 1023);
        EXPECT_LE(m.total, 232448); // an H100's 227 KB per block
        fa3_bwd::Params c;
        c.stages = stages;
        c.dq_add = dq_add;
        c.block_m = bm;
        EXPECT_EQ(fa3_bwd::smem_bytes(d, c), m.total);
      }
  }
}

// The accumulator's tile order is a permutation of each block_m x head_dim tile (the convert kernel reads every
// element once), keeps pairs adjacent as the convert kernel reads them (columns; rows where it declares kRowPairs),
// and gives each consumer thread's fragment j the float4 at 128j + t of its piece (the kernel's stores): the piece
// of consumer h is rows [64h, 64h + 64) where dQ is split by rows (128-row blocks), head_dim columns [64h, 64h + 64)
// as the M of dQᵀ where it is transposed (80), columns [h·D/2, (h + 1)·D/2) otherwise.
template <int D, int bm> void check_dq_tile_order() {
  using Order = fa3_bwd::DqTileOrder<bm>;
  constexpr bool by_rows = fa3_bwd::dq_split(bm) == fa3_bwd::DqSplit::rows;
  constexpr bool transposed = fa3_bwd::dq_split(bm) == fa3_bwd::DqSplit::transposed;
  static_assert(Order::kRowPairs == transposed);
  static_assert(kernels::bwd::row_pairs<Order>() == transposed);
  constexpr int n = fa3_bwd::dq_piece_n(D, bm); // a piece's N
  static_assert(n == (by_rows ? D : transposed ? bm : D / 2));
  std::vector<int> seen(2 * bm * D, 0);
  for (int row = 0; row < 2 * bm; ++row)
    for (int col = 0; col < D; ++col) {
      const int64_t o = Order::template offset<D>(row, col);
      ASSERT_GE(o, int64_t(row / bm) * bm * D);
      ASSERT_LT(o, int64_t(row / bm + 1) * bm * D);
      ++seen[size_t(o)];
      if (transposed && row % 2 == 0)
        EXPECT_EQ(Order::template offset<D>(row + 1, col), o + 1);
      if (!transposed && col % 2 == 0)
        EXPECT_EQ(Order::template offset<D>(row, col + 1), o + 1);
    }
  for (int k : seen)
    ASSERT_EQ(k, 1);
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 128; t += 37)
      for (int j = 0; j < n / 8; ++j) {
        const int w = t / 32, l = t % 32;
        const int64_t base = int64_t(h) * 64 * n + (128 * j + t) * 4;
        if (transposed) { // (M, N) = (head_dim column, row): the next N is the next row
          const int c = 64 * h + 16 * w + l / 4, r = 8 * j + 2 * (l % 4);
          EXPECT_EQ(Order::template offset<D>(r, c), base);
          EXPECT_EQ(Order::template offset<D>(r + 1, c + 8), base + 3);
        } else {
          const int r = (by_rows ? 64 * h : 0) + 16 * w + l / 4;
          const int c = (by_rows ? 0 : h * n) + 8 * j + 2 * (l % 4);
          EXPECT_EQ(Order::template offset<D>(r, c), base);
          EXPECT_EQ(Order::template offset<D>(r + 8, c + 1), base + 3);
        }
      }
}
TEST(Fa3BwdTraits, DqTileOrderIsAPermutationOfFragments) {
  check_dq_tile_order<64, 64>();
  check_dq_tile_order<64, 128>();
  check_dq_tile_order<128, 64>();
  check_dq_tile_order<128, 80>();
}

TEST(Fa3BwdTraits, WorkspaceAndSemaphores) {
  const AttentionProblem p = bwd_problem(100, 300, 128, true, 8, 2);
  fa3_bwd::Params c; // 64 rows a row block
  const fa3_bwd::Workspace w = fa3_bwd::workspace_layout(p, c);
  const int64_t rows = 2 * 8 * 128; // padded to two row blocks
  EXPECT_EQ(w.dq_acc, 0);
  EXPECT_EQ(w.lse2, 4 * rows * 128);
  EXPECT_EQ(w.delta, w.lse2 + 4 * rows);
  EXPECT_EQ(w.total, w.delta + 4 * rows);
  EXPECT_EQ(w.lse2 % 16, 0); // float2 loads of LSE₂ and D rows
  EXPECT_EQ(w.delta % 16, 0);
  EXPECT_EQ(fa3_bwd::semaphore_count(p, c), 0); // causal: no tail split
  c.deterministic = 1;
  EXPECT_EQ(fa3_bwd::semaphore_count(p, c), 2 * 8 * 2); // (batch, query head, row block)
  EXPECT_EQ(fa3_bwd::num_col_blocks(p), 3);             // 300 keys, 128 a column block

  const Variant &v = variant();
  Config cfg = v.space().default_config(p, h100());
  EXPECT_EQ(v.workspace_bytes(p, cfg), size_t(w.total));
  EXPECT_EQ(v.semaphore_bytes(p, cfg), 0u);
  cfg.set("deterministic", 1);
  cfg.set("order", fa3_bwd::kOrderNatural);
  EXPECT_EQ(v.semaphore_bytes(p, cfg), size_t(4 * 2 * 8 * 2));
}

// The tail split: which column blocks are cut, into how many pieces, and the semaphores that hold their sums.
TEST(Fa3BwdTraits, TailSplit) {
  fa3_bwd::Params c;
  c.block_m = 80;
  // B·N 16384, H·d 2048 at head_dim 128: 2048 column blocks, 15 whole rounds of 132 SMs and 68 left over. At N4096
  // a block is 52 row blocks: 3 pieces take ceil(204 / 132) = 2 rounds of 18 + 3 against 52 + 2 whole.
  AttentionProblem p = bwd_problem(4096, 4096, 128, false, 16, 16);
  p.batch = 4;
  fa3_bwd::TailSplit s = fa3_bwd::tail_split(p, c, 132);
  EXPECT_EQ(s.full, 1980);
  EXPECT_EQ(s.tiles, 68);
  EXPECT_EQ(s.pieces, 3);
  EXPECT_EQ(s.ctas(), 1980 + 3 * 68);
  // At N1024 a block is 13 row blocks: 2 rounds of 5 + 3 = 16 is no better than 13 + 2 + 1, so 2 rounds are
  // weighed against splitting finer; whatever wins, every piece has at least one row block.
  p.batch = 16, p.seqlen_q = p.seqlen_kv = 1024;
  s = fa3_bwd::tail_split(p, c, 132);
  EXPECT_LE(s.pieces, 13);
  EXPECT_EQ(s.full + s.tiles, 2048);
  // Nothing to split: whole rounds, a causal mask (blocks differ), deterministic mode, the axis off, no device.
  EXPECT_EQ(fa3_bwd::tail_split(p, c, 128).pieces, 1); // 2048 = 16 x 128
  AttentionProblem causal = p;
  causal.causal = true;
  EXPECT_EQ(fa3_bwd::tail_split(causal, c, 132).pieces, 1);
  fa3_bwd::Params det = c, off = c;
  det.deterministic = 1, off.split_tail = 0;
  EXPECT_EQ(fa3_bwd::tail_split(p, det, 132).pieces, 1);
  EXPECT_EQ(fa3_bwd::tail_split(p, off, 132).pieces, 1);
  EXPECT_EQ(fa3_bwd::tail_split(p, c, 0).ctas(), 2048);
  // Fewer blocks than SMs: all of them are the tail, each piece at least one row block (of every query head).
  const AttentionProblem small =
      bwd_problem(300, 300, 64, false, 8, 2); // 3 x 2 x 2 = 12 blocks, 3 rows
  fa3_bwd::Params rows128;
  rows128.block_m = 128;
  s = fa3_bwd::tail_split(small, rows128, 132);
  EXPECT_EQ(s.full, 0);
  EXPECT_EQ(s.tiles, 12);
  EXPECT_EQ(s.pieces, 3); // 1 round of 4 x 1 + 3 against 4 x 3 + 2
  // Semaphores: a counter per possible split block (padded to 16 bytes), then its fp32 dK and dV sums.
  const int64_t slots = 12;
  EXPECT_EQ(fa3_bwd::semaphore_count(small, fa3_bwd::Params{}),
            (slots + 3) / 4 * 4 + slots * 2 * 128 * 64);
  EXPECT_EQ(fa3_bwd::semaphore_count(p, c),
            fa3_bwd::kMaxSplitTiles + fa3_bwd::kMaxSplitTiles * 2 * 128 * 128);
  EXPECT_EQ(fa3_bwd::semaphore_count(causal, c), 0);
  EXPECT_EQ(fa3_bwd::semaphore_count(p, off), 0);
}

TEST(Fa3BwdTraits, TrafficModelParts) {
  // Non-causal, whole blocks: every column block visits every row block of every query head.
  const AttentionProblem p = bwd_problem(256, 512, 128, false, 4, 2);
  const fa3_bwd::Params c; // 64 x 128 blocks
  const fa3_bwd::Traffic t = fa3_bwd::traffic(p, c);
  const double e = 2, d = 128, pairs = 2.0 * 4 * (256 / 64) * (512 / 128);
  EXPECT_DOUBLE_EQ(t.kv, 2.0 * 2 * 4 * e * d * 512);
  EXPECT_DOUBLE_EQ(t.q_rows, pairs * (2 * e * d * 64 + 8 * 64));
  EXPECT_DOUBLE_EQ(t.dq_add, pairs * 4 * d * 64);
  EXPECT_DOUBLE_EQ(t.total(), fa3_bwd::traffic_bytes(p, c));
  Config def = variant().space().default_config(p, h100());
  def.set("block_m", 64);
  EXPECT_DOUBLE_EQ(variant().model_bytes(p, def), t.total());
  // Causal visits fewer pairs.
  AttentionProblem pc = p;
  pc.causal = true;
  EXPECT_LT(fa3_bwd::traffic(pc, c).dq_add, t.dq_add);
}

// The compiled tiles are block_m_compiled's: the dispatch finds a kernel list (no GPU needed to build it) for each
// height it names and for none other.
TEST(Fa3BwdVariant, DispatchFollowsTheCompiledHeights) {
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128})
      for (int bm : {64, 80, 128}) {
        fa3_bwd::Params c;
        c.block_m = bm;
        const bool compiled = fa3_bwd::block_m_compiled(d, bm);
        const std::vector<KernelDesc> ks =
            fa3_bwd::kernels(bwd_problem(300, 257, d, true, 6, 2, t), c);
        EXPECT_EQ(!ks.empty(), compiled) << "d" << d << " block_m " << bm;
        if (compiled)
          EXPECT_EQ(ks.size(), 3u); // preprocess, main, convert
      }
}

TEST(Fa3BwdVariant, InTheCatalogAsABackward) {
  ASSERT_NE(catalog().find("fa3_bwd"), nullptr);
  EXPECT_EQ(variant().pass(), Pass::bwd);
  EXPECT_FALSE(variant().description().empty());
}
TEST(Fa3BwdVariant, SupportsSaysWhy) {
  const Variant &v = variant();
  const DeviceInfo dev = h100();
  const AttentionProblem p = bwd_problem(1024, 1024, 128, true);
  const Config def = v.space().default_config(p, dev);
  auto reason = [&](const AttentionProblem &q, const Config &c, const DeviceInfo &d) {
    const Support s = v.supports(q, c, d);
    EXPECT_FALSE(s.ok) << key(q) << " " << v.space().to_string(c);
    return s.reason;
  };
  EXPECT_TRUE(v.supports(p, def, dev).ok) << v.supports(p, def, dev).reason;

  AttentionProblem f = p;
  f.pass = Pass::fwd;
  EXPECT_FALSE(support_for(v, f, def, dev).ok);
  EXPECT_TRUE(has(reason(f, def, dev), "forward pass"));

  AttentionProblem d256 = p;
  d256.head_dim = 256;
  const std::string r256 = reason(d256, def, dev);
  EXPECT_TRUE(has(r256, "head_dim 256") && has(r256, "256 registers") && has(r256, "240")) << r256;
  AttentionProblem d96 = p;
  d96.head_dim = 96;
  EXPECT_TRUE(has(reason(d96, def, dev), "compiled for 64 and 128 only"));

  AttentionProblem f32 = p;
  f32.dtype = DType::f32;
  EXPECT_TRUE(has(reason(f32, def, dev), "fp32"));

  const std::string r80 = reason(p, def, a100());
  EXPECT_TRUE(has(r80, "sm_90a") && has(r80, "8.0")) << r80;
  DeviceInfo h200 = h100();
  h200.name = "NVIDIA H200";
  h200.total_mem_bytes = 141LL * 1000 * 1000 * 1000;
  EXPECT_TRUE(v.supports(p, def, h200).ok);
  EXPECT_TRUE(v.supports(p, def, nominal_device()).ok); // planning without a GPU: against an H100

  // Row-block heights: compiled per head_dim, refused with the ones that are.
  EXPECT_THROW(v.space().make({{"block_m", "96"}}), UserError);
  AttentionProblem d64 = p;
  d64.head_dim = 64;
  EXPECT_TRUE(v.supports(d64, v.space().default_config(d64, dev), dev).ok);
  Config bm = def;
  bm.set("block_m", 80);
  EXPECT_TRUE(v.supports(p, bm, dev).ok);
  const std::string rbm = reason(d64, bm, dev);
  EXPECT_TRUE(has(rbm, "block_m 80 is not compiled for head_dim 64") && has(rbm, "64 or 128"))
      << rbm;
  bm.set("block_m", 128);
  EXPECT_TRUE(has(reason(p, bm, dev), "block_m 128 is not compiled for head_dim 128"));

  // Deterministic fixes the launch order.
  const Config det_lpt = v.space().make({{"order", "lpt"}, {"deterministic", "on"}});
  EXPECT_TRUE(has(reason(p, det_lpt, dev), "use order natural"));
  EXPECT_TRUE(v.supports(p, v.space().make({{"deterministic", "on"}}), dev).ok);

  // Shared memory: stages 1 is named where it fits (the default: 231496 bytes at head_dim 128, 198216 with one
  // stage).
  DeviceInfo small = dev;
  small.smem_per_block_optin = 200000;
  EXPECT_TRUE(has(reason(p, def, small), "(use stages 1)")) << reason(p, def, small);
  Config one = def;
  one.set("stages", 1);
  EXPECT_TRUE(v.supports(p, one, small).ok);
  small.smem_per_block_optin = 100000;
  const std::string rs = reason(p, def, small);
  EXPECT_TRUE(has(rs, "shared memory") && !has(rs, "stages 1")) << rs;

  // Sizes past the kernels' 32-bit indices and grid, and past device memory.
  AttentionProblem longer = p;
  longer.seqlen_q = longer.seqlen_kv = (int64_t(1) << 30) + 1;
  longer.batch = 1, longer.heads_q = longer.heads_kv = 1;
  EXPECT_TRUE(has(reason(longer, def, nominal_device()), "2^30"));
  AttentionProblem wide = p;
  wide.batch = 65535, wide.heads_q = wide.heads_kv = 512, wide.seqlen_q = wide.seqlen_kv = 1 << 20;
  EXPECT_TRUE(has(reason(wide, def, nominal_device()), "1-D grid"));
  AttentionProblem heads = p;
  heads.heads_q = heads.heads_kv = 70000;
  EXPECT_TRUE(has(reason(heads, def, nominal_device()), "65535"));
  AttentionProblem big = p;
  big.batch = 64, big.heads_q = big.heads_kv = 64, big.seqlen_q = big.seqlen_kv = 32768;
  EXPECT_TRUE(has(reason(big, def, dev), "device memory"));

  // Variable-length and paged caches are the decode variants'.
  AttentionProblem paged = p;
  paged.page_size = 256;
  EXPECT_TRUE(has(reason(paged, def, dev), "decode variant"));
}

TEST(Fa3BwdVariant, SupportsTheAcceptanceFamily) {
  const Variant &v = variant();
  const DeviceInfo dev = h100();
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true})
        for (const AttentionProblem &p :
             {bwd_problem(1024, 1024, d, causal, 16, 16, t),
              bwd_problem(4096, 4096, d, causal, 32, 8, t), // GQA 4:1
              bwd_problem(2048, 2048, d, causal, 16, 1, t), // MQA
              bwd_problem(100, 333, d, causal, 8, 2, t),    // fewer queries than keys
              bwd_problem(333, 100, d, causal, 8, 2, t),    // rows that see no key under causal
              bwd_problem(1, 1, d, causal, 4, 4, t)}) {
          const Config c = v.space().default_config(p, dev);
          const Support s = v.supports(p, c, dev);
          EXPECT_TRUE(s.ok) << key(p) << ": " << s.reason;
          Config det = c;
          det.set("deterministic", 1), det.set("order", fa3_bwd::kOrderNatural);
          EXPECT_TRUE(v.supports(p, det, dev).ok) << key(p);
        }
}

// The catalog-wide checks (tests/kernels/test_default_configs.cpp, test_catalog.cpp) see only the catalog's
// variants; the same two for fa3_bwd here.
TEST(Fa3BwdVariant, TheDefaultSupportsEveryProblemThatAnyConfigSupports) {
  const Variant &v = variant();
  std::vector<Config> valid;
  for (const auto &e : v.space().expand())
    if (!e.invalid_reason)
      valid.push_back(e.config);
  // (3 row-block heights, and 80 with row_tail off) x 2 stages x (natural, lpt, sections with either dQ add;
  // natural + deterministic with bulk adds) x split_tail off and on; which heights a head_dim compiles is
  // supports()'s.
  EXPECT_EQ(valid.size(), 112u);
  int supported = 0;
  for (const DeviceInfo &dev : {h100(), a100(), nominal_device()})
    for (DType t : {DType::bf16, DType::f16, DType::f32})
      for (int64_t d : {32, 64, 96, 128, 256})
        for (bool causal : {false, true})
          for (auto [sq, skv] : {std::pair<int64_t, int64_t>{1, 1000},
                                 {77, 131},
                                 {512, 512},
                                 {3000, 3000},
                                 {16384, 16384},
                                 {1024, 300}}) {
            const AttentionProblem p = bwd_problem(sq, skv, d, causal, 48, 8, t);
            const Config def = v.space().default_config(p, dev);
            ASSERT_FALSE(v.space().check(def)) << v.space().to_string(def);
            if (support_for(v, p, def, dev).ok) {
              ++supported;
              continue;
            }
            for (const Config &c : valid)
              EXPECT_FALSE(support_for(v, p, c, dev).ok)
                  << key(p) << " (" << dev.name << "): default " << v.space().to_string(def)
                  << " refused but " << v.space().to_string(c) << " is supported";
          }
  // bf16/fp16 x d64/d128 x causal or not x 6 lengths, on the H100 and on no device (planning as an H100).
  EXPECT_EQ(supported, 2 * 2 * 2 * 6 * 2);
}

TEST(Fa3BwdVariant, TrafficModelIsAtLeastTheMinimum) {
  const Variant &v = variant();
  for (const auto &e : v.space().expand()) {
    if (e.invalid_reason)
      continue;
    for (int64_t d : {64, 128})
      for (bool causal : {false, true})
        for (auto [sq, skv] : {std::pair<int64_t, int64_t>{512, 512}, {77, 1000}, {1000, 77}}) {
          const AttentionProblem p = bwd_problem(sq, skv, d, causal, 8, 2);
          if (!v.supports(p, e.config, nominal_device()))
            continue;
          EXPECT_GE(v.model_bytes(p, e.config), min_bytes(p) * 0.999)
              << key(p) << " " << v.space().to_string(e.config);
        }
  }
}

// The acceptance and ablation specs run every problem on at least one config, and include each problem's default
// config (the acceptance compares what a user gets).
TEST(Fa3BwdSpecs, RunEveryProblemWithItsDefault) {
  const std::string dir = std::string(FLASHBENCH_SOURCE_DIR) + "/sweeps/";
  const DeviceInfo dev = h100();
  for (const char *f : {"accept/fa3-bwd.yaml", "ablation/fa3-bwd.yaml"}) {
    SCOPED_TRACE(f);
    try {
      const SweepSpec s = load_spec(dir + f);
      ASSERT_FALSE(s.problems.empty());
      const std::vector<PlannedPoint> pts = plan(s, catalog(), dev);
      for (const AttentionProblem &p : s.problems) {
        EXPECT_EQ(p.pass, Pass::bwd) << key(p);
        const Config def = variant().space().default_config(p, dev);
        bool runs = false, has_default = false;
        for (const PlannedPoint &pt : pts) {
          if (!(pt.problem == p))
            continue;
          runs = runs || !pt.skip_reason;
          has_default = has_default || (pt.config == def && !pt.skip_reason);
        }
        EXPECT_TRUE(runs) << key(p);
        EXPECT_TRUE(has_default) << key(p) << ": " << variant().space().to_string(def);
      }
    } catch (const UserError &e) {
      ADD_FAILURE() << e.what();
    }
  }
}
