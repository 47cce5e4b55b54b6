// FA3-style backward for Hopper (TMA, WGMMA, warp specialization): the config space, the tile geometry and
// shared-memory map that the kernel, supports(), the workspace and the traffic model share, and which shapes are
// compiled. Host-only code may include this file; everything here is constexpr or inline.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/device.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"
#include "kernels/common/bwd.hpp"
#include "kernels/common/support.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fb::fa3_bwd {

// A CTA owns one column block of kBlockN keys: two consumer warpgroups of 64 keys each (one m64 WGMMA row block
// of Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, and of the dK and dV accumulators), plus a producer warpgroup that issues the TMA
// loads. Both consumers hold dK and dV for their keys in registers: 2 · 64 · head_dim fp32 over 128 threads is
// head_dim registers a thread, so head_dim 256 (256 registers for dK and dV alone) does not fit the 240 a
// consumer gets.
constexpr int kKeysPerWarpgroup = 64;
constexpr int kConsumers = 2;
constexpr int kBlockN = kKeysPerWarpgroup * kConsumers;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kMaxStages = 2;
// setmaxnreg budgets: 24 x 128 + 240 x 256 = 64512 of the SM's 65536 registers.
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;

// The launch orders of the column blocks (kernels/common/bwd.hpp, grid_order).
using kernels::bwd::grid_order;
using kernels::bwd::grid_order_in;
using kernels::bwd::GridSlot;
using kernels::bwd::kOrderLpt;
using kernels::bwd::kOrderNatural;
using kernels::bwd::kOrderSections;
using kernels::bwd::section_count;

// How a row block's dQ partial reaches the fp32 accumulator (both in the accumulator's tile order, dq_tile_offset):
//  - red: each consumer thread adds its fragment with red.global.add.v4.f32, between its own WGMMAs;
//  - bulk: the consumers store it to shared memory and one producer-warpgroup thread adds the tile with a bulk
//    reduce-add (cp.reduce.async.bulk), so the consumers go on to the next row block while it drains.
constexpr int kDqRed = 0;
constexpr int kDqBulk = 1;

// Query rows per row block (the inner loop's step, the `block_m` axis), compiled per head_dim:
//  - head_dim 64: 64 rows (each consumer's dQ piece 64 x 32) or 128, the default (12-15% faster), so that each row
//    block's chain of waits and barriers carries as much tensor work as at head_dim 128: Sᵀ and dPᵀ 64 x 128
//    (64 + 64 registers), dK and dV 64 + 64, and dQ split by rows (each consumer 64 rows x 64 columns, 32
//    registers). It fits because dV's product is issued only once dSᵀ is computed and Pᵀ and dSᵀ are packed
//    (fa3_bwd.cuh), so the fp32 Sᵀ and dPᵀ are dead before the packed operands and dQ are live.
//  - head_dim 128: 64 rows (Sᵀ and dPᵀ 64 x 64, 32 + 32 registers; dK and dV 64 x 128, 128 registers; dQ = dS·K
//    split between the consumers by columns, 64 x 64 each) or 80 (Sᵀ and dPᵀ 40 + 40 registers, dV issued late as
//    at 128 rows; 80 rows are not a WGMMA M, so dQ is computed transposed, dQᵀ = Kᵀ·dSᵀ, each consumer 64 head_dim
//    columns x 80 rows, 40 registers). FlashAttention-3's backward takes 80-row blocks at head_dim 128 without a
//    causal mask and 64 with one. 128 rows do not fit the 240 registers.
constexpr bool block_m_compiled(int64_t head_dim, int block_m) {
  return head_dim == 64 ? block_m == 64 || block_m == 128
                        : head_dim == 128 && (block_m == 64 || block_m == 80);
}
// How a row block's dQ is split between the consumers:
//  - cols (64 rows): dQ = dS·K, each consumer every row and head_dim / 2 columns;
//  - rows (128 rows): dQ = dS·K, each consumer 64 rows and every column;
//  - transposed (80 rows): dQᵀ = Kᵀ·dSᵀ, each consumer 64 head_dim columns (the WGMMA's M) and every row.
enum class DqSplit { cols, rows, transposed };
constexpr DqSplit dq_split(int block_m) {
  return block_m == 64 ? DqSplit::cols : block_m == 128 ? DqSplit::rows : DqSplit::transposed;
}
// The N of a consumer's dQ piece as an m64 accumulator.
constexpr int dq_piece_n(int head_dim, int block_m) {
  return dq_split(block_m) == DqSplit::cols   ? head_dim / 2
         : dq_split(block_m) == DqSplit::rows ? head_dim
                                              : block_m;
}

struct Params {
  int stages = 2;            // Q/dO/LSE/D row blocks in the shared-memory ring
  int order = kOrderNatural; // launch order of the column blocks (see grid_order)
  int deterministic = 0;     // 1: column blocks add their dQ partials in a fixed order
  int dq_add = kDqBulk;      // kDqRed or kDqBulk
  int block_m = 64; // query rows per row block (block_m_compiled; default_for picks by head_dim)
  // 1: the grid's last partial round of column blocks split into pieces (tail_split; it changes nothing under a
  // causal mask or in deterministic mode)
  int split_tail = 1;
  // 1: at 80-row blocks, a partial last row block computed over its rows rounded up to 16 (tail_rows), not 80
  int row_tail = 1;
};

constexpr bool head_dim_ok(int64_t d) { return d == 64 || d == 128; }

inline std::optional<std::string> config_problem(const Params &c) {
  if (c.stages < 1 || c.stages > kMaxStages)
    return "stages must be 1 or 2";
  if (c.order != kOrderNatural && c.order != kOrderLpt && c.order != kOrderSections)
    return "order must be natural, lpt or sections";
  if (c.deterministic != 0 && c.deterministic != 1)
    return "deterministic must be off or on";
  if (c.dq_add != kDqRed && c.dq_add != kDqBulk)
    return "dq_add must be red or bulk";
  if (c.block_m != 64 && c.block_m != 80 && c.block_m != 128)
    return "block_m must be 64, 80 or 128";
  if (c.deterministic && c.dq_add != kDqBulk)
    return "deterministic orders the bulk dQ adds (one thread per CTA waits on the counters): use "
           "dq_add bulk";
  if (c.split_tail != 0 && c.split_tail != 1)
    return "split_tail must be off or on";
  if (c.row_tail != 0 && c.row_tail != 1)
    return "row_tail must be off or on";
  if (!c.row_tail && c.block_m != 80)
    return "row_tail off changes only 80-row blocks (block_m 80): leave it on";
  if (c.deterministic && c.order != kOrderNatural)
    return "deterministic fixes the launch order (each (batch, head) from its last column block, "
           "the "
           "order in which the dQ partials are added): use order natural";
  return std::nullopt;
}

inline Params params_of(const Config &c) {
  const Params d;
  return Params{static_cast<int>(c.get_or("stages", d.stages)),
                static_cast<int>(c.get_or("order", d.order)),
                static_cast<int>(c.get_or("deterministic", d.deterministic)),
                static_cast<int>(c.get_or("dq_add", d.dq_add)),
                static_cast<int>(c.get_or("block_m", d.block_m)),
                static_cast<int>(c.get_or("split_tail", d.split_tail)),
                static_cast<int>(c.get_or("row_tail", d.row_tail))};
}

// The default of a problem: 2 stages; natural where column blocks have equal length (no causal mask) or the order
// is fixed (deterministic); sections under a causal mask. Measured on an H100 and an H200
// (sweeps/ablation/fa3-bwd-order.yaml, HISTORY.md): sections beat lpt by 3-68% at N 1024-4096 and by 0-10% at
// 16384, and lost 5-9% to it at d128 N 8192 only, before sections were cut to whole waves (+3.7% there since).
// block_m: 128 at head_dim 64; at head_dim 128, 80 without a causal mask and 64 with one (HISTORY.md: the A/B of
// 64 and 80 rows).
inline int default_block_m(int64_t head_dim, bool causal) {
  return head_dim == 64 ? 128 : causal ? 64 : 80;
}
inline Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &) {
  const bool det = base.get_or("deterministic", 0) != 0;
  base.set("order", p.causal && !det ? kOrderSections : kOrderNatural);
  base.set("block_m", default_block_m(p.head_dim, p.causal));
  return base;
}

inline ConfigSpace make_space() {
  const Params d;
  return ConfigSpace(
      {Axis{"stages",
            {1, 2},
            {},
            "Q/dO/LSE/D row blocks in the TMA ring (2: the next loads during this one)"},
       Axis{"order",
            {kOrderNatural, kOrderLpt, kOrderSections},
            {"natural", "lpt", "sections"},
            "launch order: natural (each head's column blocks together), lpt (longest column "
            "blocks of every head first; causal) or sections (lpt within sections of heads whose "
            "rows fit half the L2)"},
       Axis{"deterministic",
            {0, 1},
            {"off", "on"},
            "on: column blocks add dQ in a fixed order (per-row-block counters), bit-identical run "
            "to run"},
       Axis{"dq_add",
            {kDqRed, kDqBulk},
            {"red", "bulk"},
            "dQ partials: red (consumer threads' red.global.add) or bulk (shared memory, then one "
            "thread's bulk reduce-add)"},
       Axis{"block_m",
            {64, 80, 128},
            {},
            "query rows per row block (head_dim 64: 64 or 128; head_dim 128: 64 or 80)"},
       Axis{"split_tail",
            {0, 1},
            {"off", "on"},
            "on: the column blocks of the grid's last partial wave split into pieces whose dK/dV "
            "sums meet in fp32 (no effect under a causal mask or in deterministic mode)"},
       Axis{"row_tail",
            {0, 1},
            {"off", "on"},
            "on: at 80-row blocks, a partial last row block runs over its rows rounded up to 16 "
            "(N 16-64 products), not all 80"}},
      Config({{"stages", d.stages},
              {"order", d.order},
              {"deterministic", d.deterministic},
              {"dq_add", d.dq_add},
              {"block_m", d.block_m},
              {"split_tail", d.split_tail},
              {"row_tail", d.row_tail}}),
      [](const Config &c) { return config_problem(params_of(c)); }, default_for);
}

inline int64_t num_row_blocks(const AttentionProblem &p, const Params &c) {
  return (p.seqlen_q + c.block_m - 1) / c.block_m;
}
inline int64_t num_col_blocks(const AttentionProblem &p) {
  return (p.seqlen_kv + kBlockN - 1) / kBlockN;
}
// row_tail: the rows that the last row block's products cover where seqlen_q is not a multiple of 80, its valid
// rows rounded up to 16 (a WGMMA N, and whole k-steps of dV's and dK's products); 0 where every row block runs
// whole (off, 64- and 128-row blocks, or a remainder over 64). Only 80-row blocks, whose dQ is transposed: a
// consumer's dQᵀ piece of R rows is then the first R/8 fragments of the 80-row piece (DqTileOrder), so the tail
// writes the tile's layout as a whole block does. With power-of-two lengths 80-row blocks leave 16 (N 4096), 32
// (8192), 48 (2048) or 64 (1024, 16384) rows, and the whole last block costs 1.5% of the work at N 1024-4096.
inline int tail_rows(const AttentionProblem &p, const Params &c) {
  if (!c.row_tail || dq_split(c.block_m) != DqSplit::transposed)
    return 0;
  const int64_t rem = p.seqlen_q % c.block_m;
  const int64_t rows = (rem + 15) / 16 * 16;
  return rem == 0 || rows >= c.block_m ? 0 : static_cast<int>(rows);
}

// The grid's tail. One CTA runs per SM, and without a causal mask every column block takes the same time, so T
// column blocks on S SMs take ceil(T / S) rounds while the last round keeps only T mod S SMs busy: 2048 blocks
// (every B·N 16384, H·d 2048 shape at head_dim 128) are 15.5 rounds of 132 SMs, and 64 SMs idle for the 16th, 3% of
// the call. split_tail cuts each of the last r = T mod S column blocks into `pieces` CTAs, each over a contiguous
// share of the block's row blocks (for every query head of the group); each piece adds its dK and dV into fp32
// sums (in the semaphores), and the last piece of a block to finish reads the sums back, clears them and writes dK
// and dV as an unsplit block does. The pieces are chosen by the makespan of the last rounds: ceil(r·pieces / S)
// rounds of a piece's row blocks plus kPieceFixed (its K/V load, pipeline fill and drain, and the sums' round
// trip), against one round of the whole block plus its own fill and drain. Not under a causal mask (column blocks
// differ in length, and the sections order already puts the short ones last) nor in deterministic mode.
// kMaxSplitTiles is at least any Hopper part's SM count (the semaphores are sized for this many split blocks).
constexpr int kMaxSplitTiles = 160;
constexpr int kMaxPieces = 16;
constexpr double kBlockFixed = 2.0; // a CTA's fill and drain, in row blocks
constexpr double kPieceFixed = 3.0; // a piece's: the same plus the sums' round trip
struct TailSplit {
  int64_t full = 0; // column blocks (in launch order) that run whole; the rest are split
  int pieces = 1;
  int64_t tiles = 0; // split column blocks
  int64_t ctas() const { return full + tiles * pieces; }
};
inline int64_t grid_tiles(const AttentionProblem &p) {
  return num_col_blocks(p) * p.heads_kv * p.batch;
}
inline TailSplit tail_split(const AttentionProblem &p, const Params &c, int64_t sms) {
  const int64_t t = grid_tiles(p);
  TailSplit s{t, 1, 0};
  if (!c.split_tail || c.deterministic || p.causal || sms <= 0)
    return s;
  const int64_t r = t % sms, rows = num_row_blocks(p, c), group = p.group_size();
  if (r == 0 || r > kMaxSplitTiles)
    return s;
  double best = double(group * rows) + kBlockFixed;
  for (int64_t k = 2; k <= std::min<int64_t>(rows, kMaxPieces); ++k) {
    const double rounds = double((r * k + sms - 1) / sms);
    const double span = rounds * (double(group * ((rows + k - 1) / k)) + kPieceFixed);
    if (span < best)
      best = span, s = {t - r, int(k), r};
  }
  return s;
}
// Semaphores. Deterministic: one int per (batch, query head, row block), the number of column blocks that have added
// their dQ partial to it so far. split_tail: one int per split column block (its pieces that have added their sums),
// padded to 16 bytes, then its fp32 dK and dV sums (2 x kBlockN x head_dim, in the consumers' fragment order), for
// as many split blocks as any launch can have. All zero between launches: the last piece clears what it read.
inline int64_t split_slots(const AttentionProblem &p) {
  return std::min<int64_t>(grid_tiles(p), kMaxSplitTiles);
}
inline int64_t split_counter_ints(const AttentionProblem &p) {
  return (split_slots(p) + 3) / 4 * 4;
}
inline int64_t semaphore_count(const AttentionProblem &p, const Params &c) {
  if (c.deterministic)
    return p.batch * p.heads_q * num_row_blocks(p, c);
  if (c.split_tail && !p.causal)
    return split_counter_ints(p) + split_slots(p) * 2 * kBlockN * p.head_dim;
  return 0;
}

// Shared memory, every tile 1024-byte aligned (the 128B swizzle): K and V of the column block; `stages` slots of
// Q and dO (TMA, 128B-swizzled column chunks of 64); two dS buffers (bf16/fp16, [block_m][128 keys] in two 64-key
// chunks: the A operand of dQ = dS·K, or the B operand of dQᵀ = Kᵀ·dSᵀ, written by both consumers); with dq_add
// bulk, one or two buffers (two where they fit) of the row block's fp32 dQ partial, in the accumulator's tile
// order (DqTileOrder); two buffers of a row block's LSE₂ and D (block_m floats each), outside the 1024-byte-aligned
// slots so that two dQ buffers fit at head_dim 128; the mbarriers (kv_full; full and empty per stage; dq_full and
// dq_empty per dQ buffer and consumer). LSE₂ and D are copied by a producer warp with ordinary loads and stores
// (fa3_bwd.cuh, row_loader) rather than a bulk copy: compute-sanitizer's racecheck reports an ordinary read of what
// a bulk copy wrote as a hazard whatever the mbarriers order.
struct SmemMap {
  int64_t k = 0, v = 0, slots = 0, slot_bytes = 0, q = 0, dout = 0, ds = 0, ds_bytes = 0, dq = 0,
          dq_bytes = 0, dq_bufs = 0, rows = 0, rows_bytes = 0, bars = 0, total = 0;
};
constexpr int kMaxDqBuffers = 2;
constexpr int kRowsBuffers = 2; // LSE₂ and D of the row block and the next, whatever the stages
// kv_full; full and empty per stage; dq_full and dq_empty per dQ buffer and consumer (each hands on its own piece).
constexpr int kBarriers = 1 + 2 * kMaxStages + 2 * kMaxDqBuffers * kConsumers;
constexpr int64_t align1k(int64_t x) { return (x + 1023) / 1024 * 1024; }
constexpr SmemMap smem_map(int64_t head_dim, int block_m, int stages, int dq_add,
                           int64_t limit = kernels::kSmemOptinHopper) {
  const int64_t kRowsBytes = 2 * 4 * block_m; // LSE₂ and D of a row block
  const int64_t kTail = kRowsBuffers * kRowsBytes + 8 * kBarriers + 1024; // + the alignment slack
  SmemMap m;
  const int64_t kv = int64_t(kBlockN) * head_dim * 2, qt = int64_t(block_m) * head_dim * 2;
  m.k = 0;
  m.v = kv;
  m.slots = 2 * kv;
  m.q = 0; // offsets inside a slot
  m.dout = qt;
  m.slot_bytes = align1k(2 * qt);
  m.ds = m.slots + stages * m.slot_bytes;
  m.ds_bytes = int64_t(block_m) * kBlockN * 2;
  m.dq = m.ds + 2 * m.ds_bytes;
  m.dq_bytes = dq_add == kDqBulk ? int64_t(block_m) * head_dim * 4 : 0;
  // Two where they fit with the most stages (so the count is the tile's alone: the kernel's constant).
  const int64_t dq_at_max = m.slots + kMaxStages * m.slot_bytes + 2 * m.ds_bytes;
  m.dq_bufs = dq_add != kDqBulk ? 0 : dq_at_max + 2 * m.dq_bytes + kTail <= limit ? 2 : 1;
  m.rows = m.dq + m.dq_bufs * m.dq_bytes;
  m.rows_bytes = kRowsBytes;
  m.bars = m.rows + kRowsBuffers * kRowsBytes;
  m.total = m.bars + 8 * kBarriers + 1024;
  return m;
}
constexpr int dq_buffers(int64_t head_dim, int block_m) {
  return int(smem_map(head_dim, block_m, kMaxStages, kDqBulk).dq_bufs);
}
inline int64_t smem_bytes(int64_t head_dim, const Params &c) {
  return smem_map(head_dim, c.block_m, c.stages, c.dq_add).total;
}

// The fp32 dQ accumulator of a (batch, query head) holds each row block's block_m x head_dim tile contiguously, as
// the row-major layout does, but in the order of the consumers' WGMMA fragments, so that a warp's 16-byte pieces
// are consecutive. Consumer h's piece of the tile is an m64 accumulator of n columns: split by rows (128-row
// blocks), rows [64h, 64h + 64) by every column; by columns (64), every row by columns [h·d/2, (h + 1)·d/2);
// transposed (80), dQᵀ's head_dim columns [64h, 64h + 64) as its M by the block's rows as its N. The piece is a run
// of 64 · n floats in which float4 number 128j + t is thread t's fragment j: (M, N) = (r, 8j + 2(t%4)) and the
// next N, then the same at M + 8; r = 16(t/32) + (t%32)/4. So (row, col) and (row, col + 1) are adjacent where
// the piece's N runs along the columns, and (row, row + 1) of a column where it runs along the rows (kRowPairs,
// at 80). The convert kernel (kernels/common/bwd_rows.cuh) reads it through offset().
template <int BM> struct DqTileOrder {
  static_assert(BM == 64 || BM == 80 || BM == 128, "the compiled row blocks");
  static constexpr bool kRowMajor = false;
  static constexpr bool kRowPairs = dq_split(BM) == DqSplit::transposed;
  template <int D> FB_HOST_DEVICE static int64_t offset(int row, int col) {
    constexpr int bm = BM;
    constexpr bool by_rows = dq_split(BM) == DqSplit::rows;
    constexpr int n = dq_piece_n(D, BM); // a piece's N
    const int m = row % bm;
    // The piece, and the element's (M, N) in it.
    const int h = kRowPairs ? col / 64 : by_rows ? m / 64 : col / n;
    const int mm = kRowPairs ? col % 64 : m % 64, cc = kRowPairs ? m : col % n, rr = mm % 16;
    const int t = 32 * (mm / 16) + 4 * (rr % 8) + (cc % 8) / 2, e = 2 * (rr / 8) + cc % 2;
    return int64_t(row - m) * D + int64_t(h) * 64 * n + (int64_t(cc / 8) * 128 + t) * 4 + e;
  }
};

using kernels::bwd::col_blocks_for;
using kernels::bwd::padded_rows;
using kernels::bwd::row_blocks_for;
using kernels::bwd::RowRange;
using kernels::bwd::Workspace;
inline Workspace workspace_layout(const AttentionProblem &p, const Params &c) {
  return kernels::bwd::workspace_layout(p, c.block_m);
}

using Instance = kernels::bwd::Instance<Params>;

// Enqueues the preprocess, main and convert kernels on `stream`; the caller has checked supports(). A shape that
// was not compiled throws std::invalid_argument.
void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream);
std::vector<KernelDesc> kernels(const AttentionProblem &p, const Params &c);

} // namespace fb::fa3_bwd
