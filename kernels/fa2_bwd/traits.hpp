// FA2 backward (column-block parallel, tensor cores): the config space, the tile geometry that the kernels,
// supports(), the workspace and the traffic model share, and which tile shapes are compiled at all. Host-only code
// may include this file; everything here is constexpr or inline so that the kernel files see the same numbers.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/device.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"
#include "kernels/common/bwd.hpp"
#include "kernels/common/host_device.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fb::fa2_bwd {

// The MMA tile is 16 rows by 8 columns, 16 deep; ldmatrix.x4 loads 16 rows (or 16 columns) at a time, so every
// per-warp slice of every product is a multiple of 16 in both directions.
constexpr int kMma = 16;
constexpr int kMaxStages = 2;

struct Params {
  int block_m = 64;  // query rows per row block (the inner loop's step)
  int block_n = 128; // keys per CTA (its column block: K, V, dK, dV stay on chip)
  int warps = 8;     // warps per CTA
  int stages = 2;    // Q/dO row blocks in shared memory (2: the next one loads during this one)
  int warp_m = 2; // warp_layout: warps along the query rows in S = QKᵀ, dP = dO·Vᵀ and dQ = dS·K
  int deterministic =
      0; // 1: the column blocks add their dQ partials in a fixed order (bit-identical runs)
  int frag_prefetch = 0; // 1: every product loads the next k-step's ldmatrix fragments ahead
  int dq_warp_m = 0;     // dq_layout: warps along the query rows of dQ = dS·K (0: warp_m)
  int rotated =
      0; // row_order: 1 starts column block n at row block n·R / C (non-causal; kernels/common/bwd.hpp)
  int order =
      kernels::bwd::kOrderNatural; // launch order of the column blocks (kernels/common/bwd.hpp)
};

// Warps along the rows of dQ: dq_layout, or warp_layout when dq_layout is "same".
constexpr int dq_row_warps(const Params &c) { return c.dq_warp_m ? c.dq_warp_m : c.warp_m; }

// The three warp partitions of one CTA (kernel, smem staging and register estimate share them):
//  - S and dP (block_m x block_n, depth head_dim): warp_m warps along the rows, warps / warp_m along the keys;
//  - dQ (block_m x head_dim, depth block_n): the same rows, warps / warp_m along head_dim;
//  - dK and dV (block_n x head_dim, depth block_m): kv_warps_n() warps along the keys (32 keys each where the
//    tile allows), the rest along head_dim. 32 x head_dim/2 slices need 6 ldmatrix per 16 MMAs at d128 where
//    16 x head_dim slices need 9.
constexpr int kv_warps_n(int block_n, int warps) { return std::min(warps, block_n / 32); }

// Structural limits, independent of the problem.
inline std::optional<std::string> config_problem(const Params &c) {
  if (c.block_m % kMma || c.block_m < kMma)
    return "block_m must be a multiple of 16";
  if (c.block_n != 64 && c.block_n != 128)
    return "block_n must be 64 or 128 (the P and dS tiles are swizzled in rows of 8 or 16 chunks)";
  if (c.warps != 4 && c.warps != 8)
    return "warps must be 4 or 8";
  if (c.stages < 1 || c.stages > kMaxStages)
    return "stages must be 1 or 2";
  if (c.deterministic != 0 && c.deterministic != 1)
    return "deterministic must be off or on";
  if (c.frag_prefetch != 0 && c.frag_prefetch != 1)
    return "frag_prefetch must be off or on";
  if (c.warp_m < 1 || c.warps % c.warp_m)
    return "warp_layout: warps must be a multiple of the warps along the rows";
  if (c.block_m % (c.warp_m * kMma))
    return "warp_layout gives each warp " + std::to_string(c.block_m / c.warp_m) +
           " query rows of S; an MMA row tile needs a multiple of 16 (more block_m or fewer row "
           "warps)";
  if (c.dq_warp_m != 0 && c.dq_warp_m != 4)
    return "dq_layout must be same or m4";
  if (c.rotated != 0 && c.rotated != 1)
    return "row_order must be same or rotated";
  if (c.order != kernels::bwd::kOrderNatural && c.order != kernels::bwd::kOrderLpt &&
      c.order != kernels::bwd::kOrderSections)
    return "order must be natural, lpt or sections";
  if (c.deterministic && c.order != kernels::bwd::kOrderNatural)
    return "deterministic fixes the launch order (each head from its last column block, the order "
           "in which the dQ partials are added): use order natural";
  const int wmq = dq_row_warps(c);
  if (c.warps % wmq)
    return "dq_layout: warps must be a multiple of the warps along the rows of dQ";
  if (c.block_m % (wmq * kMma))
    return "dq_layout gives each warp " + std::to_string(c.block_m / wmq) +
           " query rows of dQ; an MMA row tile needs a multiple of 16";
  const int wn = c.warps / c.warp_m;
  if (c.block_n % (wn * kMma))
    return "warp_layout gives each warp " + std::to_string(c.block_n / wn) +
           " keys of S; ldmatrix needs a multiple of 16 (more row warps or fewer warps)";
  return std::nullopt;
}

// head_dim-dependent limits of the same kind: the dQ and dK/dV warp slices along head_dim.
inline std::optional<std::string> head_dim_problem(int64_t d, const Params &c) {
  const int64_t wn = c.warps / dq_row_warps(c);
  if (d % (wn * kMma))
    return "warp_layout gives each warp " + std::to_string(d / wn) +
           " head_dim columns of dQ; a multiple of 16 is needed";
  const int64_t wd = c.warps / kv_warps_n(c.block_n, c.warps);
  if (d % (wd * kMma))
    return "the dK/dV warp slice is " + std::to_string(d / wd) +
           " head_dim columns; a multiple of 16 is needed";
  return std::nullopt;
}

inline Params params_of(const Config &c) {
  const Params d;
  return Params{static_cast<int>(c.get_or("block_m", d.block_m)),
                static_cast<int>(c.get_or("block_n", d.block_n)),
                static_cast<int>(c.get_or("warps", d.warps)),
                static_cast<int>(c.get_or("stages", d.stages)),
                static_cast<int>(c.get_or("warp_layout", d.warp_m)),
                static_cast<int>(c.get_or("deterministic", d.deterministic)),
                static_cast<int>(c.get_or("frag_prefetch", d.frag_prefetch)),
                static_cast<int>(c.get_or("dq_layout", d.dq_warp_m)),
                static_cast<int>(c.get_or("row_order", d.rotated)),
                static_cast<int>(c.get_or("order", d.order))};
}

Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &dev);

inline ConfigSpace make_space() {
  const Params d;
  return ConfigSpace(
      {Axis{"block_m", {64, 128}, {}, "query rows per row block (the inner loop's step)"},
       Axis{
           "block_n", {64, 128}, {}, "keys per CTA: its K/V column block, with dK/dV in registers"},
       Axis{"warps", {4, 8}, {}, "warps per CTA"},
       Axis{"stages",
            {1, 2},
            {},
            "Q/dO row blocks in shared memory (2: cp.async loads the next during this one)"},
       Axis{"warp_layout",
            {2, 4},
            {"m2", "m4"},
            "warps along the query rows of S, dP and dQ (m2: 2, m4: 4; the rest split keys or "
            "head_dim)"},
       Axis{"deterministic",
            {0, 1},
            {"off", "on"},
            "on: column blocks add dQ in a fixed order (per-warp counters), bit-identical run to "
            "run"},
       Axis{"frag_prefetch",
            {0, 1},
            {"off", "on"},
            "on: each product loads the ldmatrix fragments of its next k-step (also across its "
            "rolled passes) while the MMAs of this one issue, in two fragment buffers"},
       Axis{"dq_layout",
            {0, 4},
            {"same", "m4"},
            "warps along the query rows of dQ = dS·K (same: warp_layout's; the rest split "
            "head_dim)"},
       Axis{"row_order",
            {0, 1},
            {"same", "rotated"},
            "non-causal: every column block walks the row blocks from the first (same), or column "
            "block n of C from row block n·R/C, wrapping (rotated), so that the dQ adds of a head "
            "spread over its row blocks"},
       Axis{"order",
            {kernels::bwd::kOrderNatural, kernels::bwd::kOrderLpt, kernels::bwd::kOrderSections},
            {"natural", "lpt", "sections"},
            "launch order: natural (each head's column blocks together), lpt (longest column "
            "blocks of every head first; causal) or sections (lpt within sections of heads whose "
            "rows fit half the L2)"}},
      Config({{"block_m", d.block_m},
              {"block_n", d.block_n},
              {"warps", d.warps},
              {"stages", d.stages},
              {"warp_layout", d.warp_m},
              {"deterministic", d.deterministic},
              {"frag_prefetch", d.frag_prefetch},
              {"dq_layout", d.dq_warp_m},
              {"row_order", d.rotated},
              {"order", d.order}}),
      [](const Config &c) { return config_problem(params_of(c)); }, default_for);
}

constexpr bool head_dim_ok(int64_t d) { return d == 64 || d == 128 || d == 256; }

// The tile shapes compiled, per head_dim: each builds with zero register spills for sm_80 and sm_90 (the build
// fails on a spill: kernels/fa2_bwd/CMakeLists.txt), checked with ptxas 13.0 for bf16 and fp16. The dK and dV
// accumulators alone are 2·block_n·head_dim / (32·warps) registers a thread and S and dP another
// 2·block_m·block_n / (32·warps), so the shapes are those whose sum stays near 192. Left out because they spill:
// d64 128x128x8 m4 (24 B, bf16 on sm_90); d128 128x128 and d256 with block_m or block_n 128 (256 or more
// accumulator registers). HISTORY.md lists the ptxas register counts. frag_prefetch (pf) on doubles the live
// fragments of each product, so it is compiled only for d64's default tile, which the acceptance sweep compares
// with it off; at d128 64x128 it was 0.6-1.0% slower (HISTORY.md row 24) and spills 8 B since the CTA's
// coordinates are decoded from the grid (row 26).
//
// Each tile is compiled as three kernels (`mode`): plain (non-deterministic, natural launch order), remap
// (non-deterministic, lpt or sections, whose grid needs a decode of the CTA's coordinates) and det (deterministic:
// the ordered dQ adds). Kept apart, the plain kernel carries neither the decode nor the deterministic code, which
// cost it 1.5% each at d128 (HISTORY.md row 26). remap and det are compiled for each head_dim's default tile only.
constexpr int kModePlain = 0, kModeRemap = 1, kModeDet = 2;
constexpr int mode_of(int deterministic, int order) {
  return deterministic ? kModeDet : order != kernels::bwd::kOrderNatural ? kModeRemap : kModePlain;
}
// The default tile of head_dim d (default_for sets it; the remap and det kernels are compiled for it):
// FlashAttention-2's sm80 tiles, 8 warps, 2 along the rows, with dQ's 4 row warps (dq_layout m4) at d64.
struct TileShape {
  int bm = 0, bn = 0, w = 0, wm = 0, wmq = 0; // wmq: dQ's row warps (dq_row_warps)
};
constexpr TileShape default_tile_of(int64_t d) {
  return d == 64    ? TileShape{128, 128, 8, 2, 4}
         : d == 128 ? TileShape{64, 128, 8, 2, 2}
         : d == 256 ? TileShape{64, 64, 8, 2, 2}
                    : TileShape{};
}
constexpr bool default_tile(int d, int bm, int bn, int w, int wm, bool pf, int wmq) {
  const TileShape t = default_tile_of(d);
  return !pf && t.bm == bm && t.bn == bn && t.w == w && t.wm == wm && t.wmq == (wmq ? wmq : wm);
}
constexpr bool tile_compiled(int d, int bm, int bn, int w, int wm, bool pf = false, int wmq = 0,
                             int mode = kModePlain) {
  if (mode != kModePlain)
    return default_tile(d, bm, bn, w, wm, pf, wmq);
  // dQ with its own row warps: 4 under S's 2 at d64 128x128 (32 x 32 dQ slices, 4 ldmatrix per 8 MMAs where
  // 64 x 16 slices take 5), with frag_prefetch off and on.
  if (wmq != 0 && wmq != wm)
    return d == 64 && bm == 128 && bn == 128 && w == 8 && wm == 2 && wmq == 4;
  if (pf)
    return d == 64 && bm == 128 && bn == 128 && w == 8 && wm == 2;
  if (d == 64)
    return (bm == 128 && bn == 128 && w == 8 && wm == 2) ||
           (bm == 64 && bn == 128 && w == 8 && (wm == 2 || wm == 4)) ||
           (bm == 64 && bn == 64 && w == 4 && wm == 2);
  if (d == 128)
    return (bm == 64 && bn == 128 && w == 8 && (wm == 2 || wm == 4)) ||
           (bm == 128 && bn == 64 && w == 8 && (wm == 2 || wm == 4)) ||
           (bm == 64 && bn == 64 && w == 4 && wm == 2);
  if (d == 256)
    return bm == 64 && bn == 64 && w == 8 && (wm == 2 || wm == 4);
  return false;
}

// frag_prefetch on: every product loads its ldmatrix fragments one k-step ahead (the kPf bits name them).
constexpr int kPfS = 1, kPfKV = 2, kPfDQ = 4, kPfDP = 8;
constexpr int kPfAll = kPfS | kPfKV | kPfDQ | kPfDP;

// Whether every product's passes are unrolled (fa2_bwd.cuh, k_loop): at d128 the straight-line body drops loop
// control and per-pass address updates; at d64 it lost. H100, A/B of the defaults at B·N 16384 N 4096
// (HISTORY.md row 15): d128 +2.9% (causal +3.8%), d64 -4.5% (causal -2.8%). d256 keeps the measured rolled loop,
// and so do d128's 4-warp tiles, whose larger warp slices spill 20 B unrolled on sm_80.
constexpr bool unrolled_passes(int d, int w) { return d == 128 && w == 8; }

// The padded row buffers of the workspace (dQ accumulator, base-2 LSE, D) and the row/column block ranges are
// the backward kernels' common ones (kernels/common/bwd.hpp), with block_m rows a block.
using kernels::bwd::padded_rows;
using kernels::bwd::Workspace;
inline Workspace workspace_layout(const AttentionProblem &p, const Params &c) {
  return kernels::bwd::workspace_layout(p, c.block_m);
}

// Semaphores (deterministic only): one int per (batch, query head, row block, warp), the number of column blocks
// that have added their dQ partial to that warp's slice of the row block so far (zero between launches).
inline int64_t num_row_blocks(const AttentionProblem &p, const Params &c) {
  return (p.seqlen_q + c.block_m - 1) / c.block_m;
}
inline int64_t num_col_blocks(const AttentionProblem &p, const Params &c) {
  return (p.seqlen_kv + c.block_n - 1) / c.block_n;
}
// The main kernel's grid (fa2_bwd.cuh reads a CTA's column block, kv head and batch entry from its indices):
//  - natural (plain and det kernels): (C, kv heads, batch), each head's column blocks together (CTAs launch x
//    fastest), leftmost first, or rightmost first when deterministic (the kernel reverses x);
//  - lpt and sections (remap kernel): (per, C, sections): the (batch, kv head) pairs of a section (pair = batch ·
//    kv heads + kv head = section · per + x), then its column blocks, then the sections, so that a section
//    launches its pairs' first column blocks, then their second, ... (lpt within it). lpt is one section of every
//    pair; sections are section_count's (kernels/common/bwd.hpp), each of per = ceil(pairs / sections) pairs but
//    the last, whose missing pairs' CTAs exit at once (fa3_bwd's grid_order sizes them to differ by at most one),
//    and at least ceil(pairs / 65535) pairs, so that they fit the grid's z.
struct LaunchGrid {
  int64_t per, x, y, z;
};
inline LaunchGrid launch_grid(const AttentionProblem &p, const Params &c, int64_t sms,
                              int64_t l2_bytes) {
  const int64_t cols = num_col_blocks(p, c), pairs = p.batch * p.heads_kv;
  if (c.order == kernels::bwd::kOrderNatural)
    return {0, cols, p.heads_kv, p.batch};
  const int64_t sections = c.order == kernels::bwd::kOrderLpt
                               ? 1
                               : kernels::bwd::section_count(p, c.block_m, cols, sms, l2_bytes);
  const int64_t per = std::max((pairs + sections - 1) / sections, (pairs + 65534) / 65535);
  return {per, per, cols, (pairs + per - 1) / per};
}

// Why the grid of p with c exceeds CUDA's limits, or nothing (launch_grid keeps z within them).
inline std::optional<std::string> grid_problem(const AttentionProblem &p, const Params &c,
                                               const DeviceInfo &dev) {
  const LaunchGrid g = launch_grid(p, c, std::max(1, dev.sm_count), dev.l2_bytes);
  if (c.order == kernels::bwd::kOrderNatural && (g.y > 65535 || g.z > 65535))
    return std::to_string(p.heads_kv) + " kv heads or " + std::to_string(p.batch) +
           " batch entries pass the grid's 65535 (split the batch)";
  if (g.y > 65535)
    return std::to_string(g.y) + " column blocks pass the grid's 65535 along y (use order natural)";
  return std::nullopt;
}

inline int64_t semaphore_count(const AttentionProblem &p, const Params &c) {
  return c.deterministic ? p.batch * p.heads_q * num_row_blocks(p, c) * c.warps : 0;
}

// Dynamic shared memory: K and V of the column block, `stages` slots of (Q, dO, base-2 LSE, D) for one row block,
// and P and dS of the current row block (all in the input type but LSE and D).
constexpr int64_t smem_bytes(int64_t head_dim, const Params &c) {
  const int64_t e = 2;
  return 2 * e * c.block_n * head_dim +
         int64_t(c.stages) * (2 * e * c.block_m * head_dim + 2 * 4 * c.block_m) +
         2 * e * c.block_m * c.block_n;
}

using kernels::bwd::col_blocks_for;
using kernels::bwd::rotated_rank;
using kernels::bwd::rotated_start;
using kernels::bwd::row_blocks_for;
using kernels::bwd::RowRange;

// Why row_order rotated cannot run p with c (c.rotated aside) on dev, or nothing: supports() and default_for's rule.
inline std::optional<std::string> rotated_problem(const AttentionProblem &p, const Params &c,
                                                  const DeviceInfo &dev) {
  if (p.causal)
    return "row_order rotated is for non-causal problems (a causal column block starts at its "
           "diagonal); use "
           "row_order same";
  const int64_t rows = num_row_blocks(p, c), cols = num_col_blocks(p, c);
  if (rows * cols >= (int64_t(1) << 31))
    return "row_order rotated: " + std::to_string(rows) + " row blocks x " + std::to_string(cols) +
           " column blocks overflow its 32-bit order arithmetic; use row_order same";
  // A column block may wait on one to its left, which starts after it: all of a head's column blocks must be
  // resident at once, one CTA an SM at least.
  if (c.deterministic && dev.present && cols > dev.sm_count)
    return "row_order rotated with deterministic on needs a head's " + std::to_string(cols) +
           " column blocks resident at once; the device has " + std::to_string(dev.sm_count) +
           " SMs (use row_order same, or a larger block_n)";
  return std::nullopt;
}

// The default config of a problem (ConfigSpace::default_config(p, dev)), FlashAttention-2's own sm80 backward
// tiles: d64 128 x 128 (8 warps; 2 along the rows, as FA2's 4 spills here), d128 64 x 128 (8 warps, 2 along the
// rows: the base), d256 64 x 64 (8 warps, 2 along the rows). Where the device allows less shared memory per block
// than 2 stages need (d256 on an A100: 209 KB at 2 stages, 163 KB allowed), 1 stage. deterministic keeps the base
// (off). On those tiles, d64 takes dq_layout m4, the faster side of its A/B at every acceptance shape on an H200
// (fastest samples +2.8-3.3%; HISTORY.md, version 3). frag_prefetch stays off: at d128 it was +0.8-1.6% (version 2)
// until dP's product moved beside the exponents (versions 22-23), and -0.6-1% since (version 24).
inline Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &dev) {
  if (const TileShape t = default_tile_of(p.head_dim); t.bm > 0) {
    base.set("block_m", t.bm), base.set("block_n", t.bn), base.set("warps", t.w);
    base.set("warp_layout", t.wm);
    if (t.wmq != t.wm)
      base.set("dq_layout", t.wmq);
  }
  if (dev.smem_per_block_optin > 0 && head_dim_ok(p.head_dim) &&
      smem_bytes(p.head_dim, params_of(base)) > dev.smem_per_block_optin)
    base.set("stages", 1);
  // Deterministic and non-causal: row_order rotated wherever it is supported (a head's column blocks resident at
  // once), so that the ordered dQ adds of a row block do not all wait on the same column at the same time. H100,
  // deterministic / non-deterministic at B·N 16384, d64 and d128, N 1024-8192 (HISTORY.md row 16): same order
  // 0.776-0.851, rotated 0.823-0.849 (non-deterministic rotated is 0.989-1.005 of same, so it keeps same).
  // Without a device the SM count is unknown, so it keeps same.
  const Params c = params_of(base);
  base.set("row_order", c.deterministic && dev.present && !rotated_problem(p, c, dev) ? 1 : 0);
  // Causal and not deterministic: sections (fa3_bwd's measured rule, kernels/common/bwd.hpp). The column blocks
  // of a head shrink from the left, so the natural order ends the grid on a mix of long and short CTAs.
  base.set("order", p.causal && !c.deterministic ? kernels::bwd::kOrderSections
                                                 : kernels::bwd::kOrderNatural);
  return base;
}

// The fp32 dQ accumulator of a (batch, query head) in the order of the m16n8 accumulator fragments: 16 x 8 tiles of
// 128 floats, tile (row / 16, col / 8) at ((row / 16) · head_dim / 8 + col / 8) · 128 (a row block's tiles are its
// block_m · head_dim floats, where the row-major layout has them), and lane l's four floats of a tile (rows r and
// r + 8, columns 2c and 2c + 1; r = l / 4, c = l % 4) at 4l in it. So a warp adds a whole fragment with one 16-byte
// reduction a lane, 512 consecutive bytes (four whole 128-byte lines), where in row-major rows each 8-byte
// reduction's lanes fell on eight lines and the dQ adds stalled on the LSU queue (ncu, HISTORY.md). The convert
// kernel (kernels/common/bwd_rows.cuh) reads it through offset(); a column pair stays adjacent, as it requires.
struct FragOrder {
  static constexpr bool kRowMajor = false;
  template <int D> FB_HOST_DEVICE static int64_t offset(int row, int col) {
    const int lane = 4 * (row % 8) + (col % 8) / 2, e = 2 * ((row % 16) / 8) + col % 2;
    return (int64_t(row / 16) * (D / 8) + col / 8) * 128 + 4 * lane + e;
  }
};

using Instance = kernels::bwd::Instance<Params>;

// Enqueues preprocess, main and convert kernels on `stream` (register.cpp picks the compiled instantiation). The
// caller has checked supports(); a shape that was not compiled throws std::invalid_argument.
void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream);
// The kernels of one launch (empty for a shape that was not compiled).
std::vector<KernelDesc> kernels(const AttentionProblem &p, const Params &c);

} // namespace fb::fa2_bwd
