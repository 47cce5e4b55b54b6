// FA2 (Q-outer, tensor cores): the config space, the tile geometry that the kernel, supports() and the traffic
// model share, the shared-memory and register budgets, and which tile shapes are compiled at all. Host-only code
// may include this file; everything here is constexpr or inline so that the kernel files see the same numbers.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"
#include "kernels/common/mask.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

namespace fb::fa2 {

// warp_layout axis values (labels split_q | split_k).
constexpr int kSplitQ = 0;
constexpr int kSplitK = 1;

// The MMA tile is 16 rows (queries) by 8 columns, 16 deep: every per-warp slice must be a multiple of 16 rows or
// 16 keys.
constexpr int kMmaM = 16;
constexpr int kMmaK = 16;
constexpr int kMaxStages = 3;

struct Params {
  int block_m = 128;         // query rows per CTA
  int block_n = 64;          // keys per K/V tile
  int warps = 8;             // warps per CTA (8 x 16 rows: compiles spill-free for every head_dim)
  int stages = 2;            // K/V tiles in flight (cp.async pipeline depth)
  int warp_layout = kSplitQ; // split_q: warps own Q rows; split_k: warps own keys of each K/V tile
};

constexpr bool split_q(const Params &c) { return c.warp_layout == kSplitQ; }

// split_k reduces P·V partials through shared memory in column chunks of this many head_dim columns; the chunk
// bounds the partial accumulator at block_m·chunk/32 registers per thread.
constexpr int splitk_chunk(int block_m, int warps) { return block_m * warps >= 512 ? 16 : 32; }
// Row stride of the fp32 reduction buffer: 8 floats of padding put the 8-byte accumulator stores of the four rows a
// half-warp writes into distinct banks.
constexpr int splitk_red_stride(int block_m, int warps) { return splitk_chunk(block_m, warps) + 8; }

// Structural limits, independent of the problem: a split_q warp needs a whole MMA row tile, a split_k warp a whole
// MMA k-step of keys.
inline std::optional<std::string> config_problem(const Params &c) {
  if (c.warp_layout != kSplitQ && c.warp_layout != kSplitK)
    return "warp_layout must be split_q or split_k";
  if (c.block_m % kMmaM || c.block_n % kMmaK || c.block_m < kMmaM || c.block_n < kMmaK)
    return "block_m and block_n must be multiples of 16";
  if (c.warps < 1 || c.warps > 8)
    return "warps must be 1 to 8";
  if (c.stages < 1 || c.stages > kMaxStages)
    return "stages must be 1 to " + std::to_string(kMaxStages);
  if (split_q(c) && c.block_m / c.warps < kMmaM)
    return "split_q gives each warp " + std::to_string(c.block_m / c.warps) +
           " query rows; an MMA row tile needs 16 (use more block_m or fewer warps)";
  if (split_q(c) && c.block_m % (c.warps * kMmaM))
    return "split_q needs block_m to be a multiple of 16 x warps";
  if (!split_q(c) && c.block_n / c.warps < kMmaK)
    return "split_k gives each warp " + std::to_string(c.block_n / c.warps) +
           " keys of a K/V tile; an MMA k-step needs 16 (use more block_n or fewer warps)";
  if (!split_q(c) && c.block_n % (c.warps * kMmaK))
    return "split_k needs block_n to be a multiple of 16 x warps";
  if (!split_q(c)) {
    const int rows_per_warp = c.block_m / c.warps,
              lanes_per_row = splitk_chunk(c.block_m, c.warps) / 4;
    if (rows_per_warp < 32 / lanes_per_row || rows_per_warp % (32 / lanes_per_row))
      return "split_k reduction needs block_m / warps to be a multiple of " +
             std::to_string(32 / lanes_per_row);
  }
  return std::nullopt;
}

inline Params params_of(const Config &c) {
  const Params d;
  return Params{static_cast<int>(c.get_or("block_m", d.block_m)),
                static_cast<int>(c.get_or("block_n", d.block_n)),
                static_cast<int>(c.get_or("warps", d.warps)),
                static_cast<int>(c.get_or("stages", d.stages)),
                static_cast<int>(c.get_or("warp_layout", d.warp_layout))};
}

Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &dev);

inline ConfigSpace make_space() {
  const Params d;
  return ConfigSpace(
      {Axis{"block_m", {64, 128}, {}, "query rows per CTA (one CTA per Q tile)"},
       Axis{"block_n", {32, 64, 128}, {}, "keys per K/V tile (the inner loop's step)"},
       Axis{"warps", {4, 8}, {}, "warps per CTA"},
       Axis{"stages",
            {1, 2, 3},
            {},
            "K/V tiles in flight in the cp.async pipeline (1 = no overlap)"},
       Axis{"warp_layout",
            {kSplitQ, kSplitK},
            {"split_q", "split_k"},
            "split_q: each warp owns Q rows (FA2); split_k: warps split each K/V tile, reduce "
            "through smem (FA1)"}},
      Config({{"block_m", d.block_m},
              {"block_n", d.block_n},
              {"warps", d.warps},
              {"stages", d.stages},
              {"warp_layout", d.warp_layout}}),
      [](const Config &c) { return config_problem(params_of(c)); }, default_for);
}

constexpr bool head_dim_ok(int64_t d) { return d == 64 || d == 128 || d == 256; }

// A register-pressure score per thread. split_q (version 2): the O accumulators (live across the whole loop) plus
// three quarters of the fp32 scores (S turns into packed P at half the size before P·V); the K/V copy costs a
// constant few registers since its addresses are walked, not hoisted. split_k: the fp32 accumulators and scores,
// the cp.async chunks each thread issues per K/V tile (their addresses stay live across the unrolled copy), and
// the P·V partial of one column chunk, with split_k's O share counted twice (it is live across the whole chunk
// loop next to the partial). Not a register count: a score calibrated against ptxas 13.0 -Xptxas -v for sm_90
// (HISTORY.md lists every shape): every shape at or under kRegisterBudget compiled with zero spills, every shape
// over it spilled. Shapes over it are skipped with this reason instead of compiled.
constexpr int kRegisterAllowance = 40;
constexpr int kRegisterBudget = 212;
constexpr int register_estimate(int head_dim, int block_m, int block_n, int warps, bool sq) {
  if (sq) {
    const int rows = block_m / warps;
    return rows * head_dim / 32 + 3 * (rows * block_n / 32) / 4 + kRegisterAllowance;
  }
  const int o_own = block_m * head_dim / (32 * warps);
  const int scores = block_m * (block_n / warps) / 32;
  const int chunk = block_m * splitk_chunk(block_m, warps) / 32;
  return 2 * o_own + scores + chunk + kRegisterAllowance;
}
// Shapes that compile spill-free for sm_90 but spill for sm_80 (ptxas 13.0): their sm_80 build is a stub that traps,
// and supports() turns them down on devices below compute capability 9.0.
// Version 4: d128 128x64x4 (lean_loop below, 255 registers on sm_90) spills 20 B on sm_80.
constexpr bool sm90_only(int head_dim, int block_m, int block_n, int warps, bool sq) {
  return sq && ((head_dim == 64 && block_m == 128 && block_n == 128 && warps == 4) ||
                (head_dim == 128 && block_m == 128 && block_n == 64 && warps == 4));
}
// split_q shapes compiled with version 4's register diet (fa2_q_outer.cuh, kLean): the per-lane row sums l in
// shared memory (2·MT floats per thread, one load and one store per K/V tile), the mask in tile-local int
// coordinates recomputed from the kernel parameters inside its branch, and the thread coordinates re-read after
// the loop, so that nothing but O, m and the loop's own addresses is live across it. Only d128 128x64x4 (FA2's
// d128 shape) uses it: d64 128x128x4 spills 40-120 B with it (ptxas 13.0), every other shape keeps version 3's
// code unchanged.
constexpr bool lean_loop(int head_dim, int block_m, int block_n, int warps) {
  return head_dim == 128 && block_m == 128 && block_n == 64 && warps == 4;
}
// The register score of a lean_loop shape (216 at d128 128x64x4) overstates it by the row sums and the mask
// bounds that the diet takes out of the loop; it compiles spill-free on sm_90 (HISTORY.md, version 4).
constexpr bool tile_instantiated(int head_dim, int block_m, int block_n, int warps, bool sq) {
  return register_estimate(head_dim, block_m, block_n, warps, sq) <= kRegisterBudget ||
         (sq && lean_loop(head_dim, block_m, block_n, warps));
}

// Dynamic shared memory: the Q tile, `stages` K/V tile pairs (all in the input type), for lean_loop shapes the row
// sums, and for split_k the fp32 reduction buffer plus the per-warp row max and row sum exchange.
constexpr int64_t smem_bytes(int64_t head_dim, const Params &c) {
  const int64_t e = 2;
  int64_t bytes = e * c.block_m * head_dim + int64_t(c.stages) * 2 * e * c.block_n * head_dim;
  if (split_q(c) && lean_loop(static_cast<int>(head_dim), c.block_m, c.block_n, c.warps))
    bytes += 4 * 4 *
             int64_t(c.block_m); // lean_loop's row sums: 2·MT floats per thread = 4 floats per row
  if (!split_q(c))
    bytes += 4 * int64_t(c.warps) * c.block_m * splitk_red_stride(c.block_m, c.warps) +
             2 * 4 * int64_t(c.warps) * c.block_m;
  return bytes;
}

// The default config of a problem (ConfigSpace::default_config(p, dev)). The base default (Params{}: 128 x 64,
// 8 warps, 2 stages, split_q) compiles spill-free at every head_dim on 8.x and 9.0. From it:
//  - compute capability 9.0 (or no device: planning assumes an H100), head_dim 64 and 128: 4 warps (32 query rows
//    a warp), the winner at all six shapes of tuning/nvidia-h200.json. On 8.x d128 128 x 64 x 4 spills (sm90_only).
//  - where the device allows less shared memory per block than the tiles need (d256 on an A100: 192 KB at 2
//    stages, 163 KB allowed): block_n 32, then 1 stage.
// dtype, causality and length keep the base.
inline Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &dev) {
  const bool sm90 = !dev.present || dev.cc() >= 90;
  const int d = static_cast<int>(p.head_dim);
  if (sm90 && (d == 64 || d == 128)) {
    Params q = params_of(base);
    q.warps = 4;
    if (!config_problem(q) && tile_instantiated(d, q.block_m, q.block_n, q.warps, split_q(q)))
      base.set("warps", q.warps);
  }
  if (dev.smem_per_block_optin > 0 && head_dim_ok(p.head_dim)) {
    if (smem_bytes(p.head_dim, params_of(base)) > dev.smem_per_block_optin)
      base.set("block_n", 32);
    if (smem_bytes(p.head_dim, params_of(base)) > dev.smem_per_block_optin)
      base.set("stages", 1);
  }
  return base;
}

inline int64_t num_q_tiles(const AttentionProblem &p, const Params &c) {
  return (p.seqlen_q + c.block_m - 1) / c.block_m;
}

// K/V tiles that Q tile i visits: up to its last row's last visible key (0 when no row sees a key).
FB_HOST_DEVICE int64_t kv_tiles_for(int64_t i, int64_t block_m, int64_t block_n, int64_t seqlen_q,
                                    int64_t seqlen_kv, bool causal) {
  int64_t last_row = (i + 1) * block_m - 1;
  if (last_row > seqlen_q - 1)
    last_row = seqlen_q - 1;
  const int64_t visible = fb::kernels::visible_keys(last_row, seqlen_q, seqlen_kv, causal);
  return (visible + block_n - 1) / block_n;
}

using LaunchFn = void (*)(const AttentionProblem &, const Params &, const LaunchArgs &,
                          cudaStream_t);

// Enqueues the kernel on `stream` (dispatch.cpp picks the compiled instantiation). The caller has checked
// supports(); a shape that was not compiled throws std::invalid_argument.
void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream);

} // namespace fb::fa2
