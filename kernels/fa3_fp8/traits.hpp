// fa3_fp8: the config space, the shared-memory budget and the traffic model that the kernel, supports() and the
// plan share. Host logic only.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/problem.hpp"
#include "kernels/common/support.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace fb::fa3fp8 {

// Tile geometry: block_m 128 (two consumer warpgroups of 64 rows); head_dim 64 with block_n 128, head_dim 128 with
// block_n 128 or 192, head_dim 256 with block_n 64 or 128 (O's 128 registers a thread beside a 128-key S and P fit
// the consumers' 232 without intra_wg_overlap; its shared memory, 232448 bytes, fits the one-shot grid at stages 2
// only).
//  - block_m = kFp8ScaleBlock: a CTA's Q rows share one Q descale. A K/V tile of 128 keys has one K descale,
//    folded into the softmax's one multiply per score (scale_log2 * q_descale * k_descale); a tile of 192 keys
//    spans two descale blocks (split at key 128 of even tiles and key 64 of odd ones), so its scores take one of
//    two factors by 8-key group, chosen at compile time but for groups 8-15.
//  - head_dim 128 is one 128-byte e4m3 row: one TMA box and one 128B-swizzle atom per row, for Q, K, V and V^T.
//    head_dim 256: two 128-byte column halves, each its own [rows][128 bytes] tile (two boxes a load); V^T is two
//    [128][128-byte] tiles (head_dim 0-127, 128-255) with the 64 keys in the first half of each row.
//  - V^T of a 192-key tile is two 128B-swizzled [128][128-byte] tiles, keys 0-127 and 128-191 (the second half
//    used): a K-major operand's row must fit a swizzle atom.
//  - head_dim 64 is a 64-byte e4m3 row: Q, K and raw V as one TMA box of 64-byte rows under the 64B swizzle
//    (Q K^T through 64B-mode descriptors); V^T is one [64][128-byte] tile under the 128B swizzle, its rows 128 keys
//    as at head_dim 128. Block_n 128 only (one K descale and one V^T tile a tile): 64 and 192 would need the
//    other tiles' descale and V^T handling for 64-byte rows, not built.
constexpr int kBlockM = 128;
constexpr int kHeadDim = 128; // one swizzle atom's row; head_dim 256 is two
constexpr int kTileBytes =
    kBlockM * kHeadDim; // one 128 x 128 e4m3 tile (Q; K, V, V^T at block_n 128)
constexpr int kMaxStages = 4;
constexpr int kThreads = 384;    // producer warpgroup + 2 consumer warpgroups
using kernels::kSmemOptinHopper; // kernels/common/support.hpp
static_assert(kBlockM == kFp8ScaleBlock, "one descale per Q tile");
// Bytes of one Q tile, one K (or raw V) tile and one V^T tile: head_dim rows of 128 bytes (128 keys) per
// ceil(block_n / 128) key tiles, i.e. head_dim / 128 x ceil(block_n / 128) swizzled 128 x 128-byte tiles, and at
// head_dim 64 one [64][128-byte] tile.
constexpr int q_tile_bytes(int head_dim) { return kBlockM * head_dim; }
// Bytes of head_dim in one TMA box row (e4m3: one byte a column), the kernel's shared-memory row and the host's box:
// a 128B-swizzle row, or at head_dim 64 the whole 64-byte row (64B swizzle); head_dim 256 is two such boxes.
constexpr int box_row_bytes(int head_dim) { return head_dim < 128 ? head_dim : 128; }
constexpr int k_tile_bytes(int block_n, int head_dim = kHeadDim) { return block_n * head_dim; }
constexpr int vt_tile_bytes(int block_n, int head_dim = kHeadDim) {
  return head_dim * ((block_n + 127) / 128) * 128;
}
static_assert(vt_tile_bytes(128, 128) == kTileBytes && vt_tile_bytes(192, 128) == 2 * kTileBytes &&
                  vt_tile_bytes(64, 256) == 2 * kTileBytes &&
                  vt_tile_bytes(128, 64) == kTileBytes / 2,
              "V^T: 128-byte rows of keys, one per head_dim index, per 128-key tile");
// block_n 192: the K descale block of 8-key group g (0..23) of K/V tile j, as the kernel's softmax takes it (run 0,
// groups 0-7: block (3j) / 2; run 2, groups 16-23: the next; run 1, groups 8-15: the first on even tiles, the next
// on odd ones). tests/kernels/test_fa3_fp8.cpp checks it against key / kFp8ScaleBlock for every key.
constexpr int descale_block_192(int j, int g) {
  const int b0 = (3 * j) >> 1;
  return g < 8 ? b0 : g >= 16 ? b0 + 1 : b0 + (j & 1);
}
// intra_wg_overlap keeps tile j's S beside tile j−1's P: at head_dim 256 with block_n 128 that spills 48 bytes
// beside O's 128 registers at the consumers' 232 (fa3_fp8.cu, kConsumerRegs), so that tile runs overlap off only.
constexpr bool overlap_compiled(int block_n, int head_dim) {
  return !(head_dim == 256 && block_n == 128);
}
// The block_n a head_dim is compiled for: 128 at head_dim 64, 128 and 192 at head_dim 128, 64 and 128 at 256.
constexpr bool tile_compiled(int head_dim, int block_n) {
  return head_dim == 64    ? block_n == 128
         : head_dim == 128 ? (block_n == 128 || block_n == 192)
                           : head_dim == 256 && (block_n == 64 || block_n == 128);
}
// Why a (head_dim, block_n) is not compiled, naming what is (nullopt where it is, or where the head_dim is not
// compiled at all: supports() says that first).
inline std::optional<std::string> tile_problem(int head_dim, int block_n) {
  if (tile_compiled(head_dim, block_n) || (head_dim != 64 && head_dim != 128 && head_dim != 256))
    return std::nullopt;
  const std::string what = "block_n " + std::to_string(block_n) + " is not compiled for head_dim " +
                           std::to_string(head_dim);
  if (head_dim == 64)
    return what + " (use block_n 128: the 64-byte-row path is built for 128-key tiles, one K "
                  "descale and one "
                  "V^T tile a tile)";
  return what + " (head_dim 64: block_n 128; head_dim 128: block_n 128 or 192; head_dim 256: "
                "block_n 64 or 128)";
}

// Defaults (the space's default config), from an ablation on an H100 (fastest samples): with O through TMA,
// intra_wg_overlap with Q in registers is best or within 1% from N = 2048 (up to 6% over overlap off), 0-3% behind
// it at N = 512-1024; stages 3; the persistent grid 4-20% faster up to N = 2048 (the one-shot grid is 0.6-4% faster
// at N = 8192-16384); O through TMA 4-10% faster than from registers up to N = 2048, within +-4% above.
struct Params {
  int block_n = 128; // keys per K/V tile
  int stages = 3;    // K and V^T tiles in flight
  bool overlap =
      true; // intra_wg_overlap: the next Q K^T issued with this P V, the softmax under it
  bool pingpong =
      false; // the two consumer warpgroups issue their GEMMs in turn (slower at every N)
  bool q_in_regs = true; // Q K^T takes Q from registers (RS), not shared memory
  bool persistent =
      true; // one CTA an SM over several work items, the next item's loads under this one's
  bool o_tma = true; // O through shared memory and TMA stores, not 4-byte stores from registers
};

// Combinations that cannot run, by construction.
inline std::optional<std::string> config_problem(const Params &p) {
  if (p.block_n != 64 && p.block_n != 128 && p.block_n != 192)
    return "block_n must be 64, 128 or 192";
  if (p.stages < 2 || p.stages > kMaxStages)
    return "stages must be 2..4";
  if (p.block_n == 192 && p.stages != 2)
    return "block_n 192 fits Hopper's shared memory at stages 2 only";
  // ptxas (CUDA 13.0) gave Q's fragment registers to P's packing after the first K/V tile in the loop without
  // overlap (its SASS reads P where the PTX reads Q; every shape with 2+ K/V tiles failed verification), and kept
  // them apart in the overlapped loop, which passes. Not instantiated until that compiles correctly.
  if (p.q_in_regs && !p.overlap)
    return "q_in_regs needs intra_wg_overlap on (ptxas reuses Q's registers without it)";
  // S (96 registers), O (64) and the P in flight (24) leave no room for Q's 16 fragment registers
  // in the consumers' 216: ptxas 13.0 spilled 104 bytes.
  if (p.q_in_regs && p.block_n == 192)
    return "q_in_regs does not fit the registers at block_n 192 (use q_in_regs off)";
  return std::nullopt;
}

inline Params params_of(const Config &c);

// The default config of a problem: the base (head_dim 64 and 128) or, at head_dim 256, block_n 128 without
// intra_wg_overlap (with it the tile spills), Q K^T from shared memory (Q's 32 fragment registers do not fit beside
// O's 128), O from registers (through shared memory it would need 64 KB of staging), stages 2 on the one-shot grid
// (232448 bytes of shared memory: the persistent grid's second Q buffer does not fit). On an H200 it was 4-11%
// faster than block_n 64 with overlap on the persistent grid at N 1024-16384, causal and not (HISTORY row 17).
inline Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &) {
  if (p.head_dim == 256) {
    base.set("block_n", 128);
    base.set("stages", 2);
    base.set("intra_wg_overlap", 0);
    base.set("q_in_regs", 0);
    base.set("o_store", 0);
    base.set("scheduler", 0);
  }
  return base;
}

inline ConfigSpace make_space() {
  return ConfigSpace(
      {Axis{"block_n",
            {64, 128, 192},
            {},
            "keys per K/V tile (64: head_dim 256; 192: fewer per-tile steps a key at head_dim 128, "
            "two K descales a tile, stages 2; head_dim 64: 128 only)"},
       Axis{"stages", {2, 3, 4}, {}, "K and V^T tiles in flight (the raw V ring is 2 deep)"},
       Axis{"intra_wg_overlap",
            {0, 1},
            {"off", "on"},
            "issue tile j's Q K^T with tile j-1's P V and run tile j's softmax under it"},
       Axis{"pingpong",
            {0, 1},
            {"off", "on"},
            "the two consumer warpgroups take turns to issue their GEMMs (named barriers)"},
       Axis{"q_in_regs",
            {0, 1},
            {"off", "on"},
            "Q K^T reads Q's A fragments from registers (loaded once) instead of shared memory"},
       Axis{
           "scheduler",
           {0, 1},
           {"oneshot", "persistent"},
           "one CTA a work item, or one CTA an SM looping over items (longest causal items first)"},
       Axis{"o_store",
            {0, 1},
            {"regs", "tma"},
            "O by 4-byte stores from registers, or through shared memory and TMA stores"}},
      Config({{"block_n", 128},
              {"stages", 3},
              {"intra_wg_overlap", 1},
              {"pingpong", 0},
              {"q_in_regs", 1},
              {"scheduler", 1},
              {"o_store", 1}}),
      [](const Config &c) { return config_problem(params_of(c)); }, default_for);
}

inline Params params_of(const Config &c) {
  return Params{static_cast<int>(c.get("block_n")),
                static_cast<int>(c.get("stages")),
                c.get("intra_wg_overlap") != 0,
                c.get("pingpong") != 0,
                c.get("q_in_regs") != 0,
                c.get("scheduler") != 0,
                c.get("o_store") != 0};
}

// The persistent grid's CTAs load the next work item's Q into a second buffer; a one-shot CTA has one item.
inline int q_buffers(const Params &p) { return p.persistent ? 2 : 1; }
// The Q buffers, the K ring, two raw V tiles, the V^T ring, O's staging (o_store=tma: 64 rows x 128 bf16 columns
// a consumer warpgroup), 2 KB of mbarriers and pin slots, and 1 KB of alignment slack. At stages 4 on the persistent
// grid with O through TMA that is 232448 bytes, exactly Hopper's opt-in limit; so is block_n 192 at stages 2.
inline int64_t smem_bytes(const Params &p, int head_dim = kHeadDim) {
  return int64_t(q_tile_bytes(head_dim)) * q_buffers(p) + (p.o_tma ? 2 * int64_t(kTileBytes) : 0) +
         int64_t(p.stages) *
             (k_tile_bytes(p.block_n, head_dim) + vt_tile_bytes(p.block_n, head_dim)) +
         2 * int64_t(k_tile_bytes(p.block_n, head_dim)) + 3072;
}

inline int64_t num_q_tiles(const AttentionProblem &p) {
  return (p.seqlen_q + kBlockM - 1) / kBlockM;
}
// Work items: one per (Q tile, head, batch).
inline int64_t num_work_items(const AttentionProblem &p) {
  return num_q_tiles(p) * p.heads_q * p.batch;
}

} // namespace fb::fa3fp8
