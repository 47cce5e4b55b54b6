// What every role of an fa3_pipelined CTA reads: the kernel's arguments, the shared-memory map, the
// work tile as the producer hands it over, and the named-barrier ids.
#pragma once

#include "kernels/common/hopper/sync.cuh"
#include "kernels/common/hopper/tma.cuh"
#include "kernels/common/hopper/warpgroup.cuh"
#include "kernels/common/hopper/wgmma.cuh"
#include "kernels/common/hopper/wgmma_f16.cuh"
#include "kernels/fa3_pipelined/traits.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fb::fa3::detail {

using namespace fb::hopper;

struct KernelArgs {
  CUtensorMap tm_q, tm_k, tm_v; // 64-byte aligned; TMA reads them from the kernel's parameter space
  CUtensorMap tm_o;             // O as Q's map with 64-row boxes: the TMA store epilogue
  void *o;
  float *lse;
  int64_t o_batch, o_seq, o_head; // O's element strides (Q's)
  // Q and K in global memory, read only to recompute the scores of a K/V tile whose optimistic
  // exp2 overflowed (recompute_s; never on the timed path of ordinary inputs).
  const void *q, *k;
  int64_t k_batch, k_seq, k_head; // K's element strides
  int seqlen_q, seqlen_kv;
  int heads_q, group;
  float scale_log2;
  TileDecoder order; // the work order (traits.hpp: tile_coord)
  // heads_q and stages as FastDivs: the producer divides by them for every tile and K/V load, and
  // a `/` by a run-time int queued on the pipe of the consumers' exp2s (~1.4 us a tile at d128
  // N512).
  fb::kernels::FastDiv heads_q_div, stages_div;
  int total_tiles; // num_q_tiles x heads_q x batch
  int *claims;     // dynamic scheduler: [0] tiles claimed past the first wave, [1] CTAs done
  int stages;
  int consumers;
  int pingpong;
  int causal;
  int o_tma; // O through shared memory and TMA stores (o_staged), else 4-byte stores from registers
  int q_bufs; // Q buffers (q_buffers): 2 lets the next work tile's Q load under this one
  // The next three have had one value since their ablations were measured (the kernel's history);
  // they stay run-time arguments because the code ptxas emits for them is the code that was
  // measured, and the all-paths kernel (kModeAny) still honours other values.
  float rescale_slack; // kRescaleSlack: log2 units a row's max may pass its offset before O is
                       // rescaled (softmax_tile; -inf would rescale on every new max)
  int wg_pass;   // 1 (causal): a warpgroup passes over K/V tiles right of its last row's diagonal
  int half_diag; // 1 (causal): no exp2 for the right half of a warpgroup's last tile when no row
                 // sees it
  // scheduler stream_k: the tail shared out by K/V tiles (ctas 0 otherwise), its partials
  // (split_workspace_bytes) and their flags (split_semaphore_bytes).
  TailSplit split;
  float *partials;
  int *split_flags;
};

constexpr float kLn2 = 0.69314718055994531f;
constexpr float kRescaleSlack = 8.f; // log2 units: P stays <= 2^8 between rescales (softmax_tile)
constexpr int kBarTurn0 = 1;         // named barrier ids; 0 is __syncthreads; turns use 1..3
constexpr int kBarEpi0 = 4;          // one per consumer warpgroup (4..6): its O staging buffer

// Shared-memory map of one CTA (byte addresses in the shared window, tiles 1024-aligned).
template <int D, int BN> struct Smem {
  static constexpr int kChunks = D / 64;           // 64-column (128-byte) TMA boxes per row
  static constexpr uint32_t kKvBytes = BN * D * 2; // one K or one V tile
  static constexpr uint32_t kKvChunk = BN * 128;   // one column chunk of a K/V tile
  uint32_t q, k, v, o, bars;
  int block_m, stages, q_bufs;
  // q: q_bufs (1 or 2) Q tiles; with 2, the next work tile's Q loads while this one's is in
  // use. o: the O staging buffer (block_m x D in Q's layout: 64-column chunks of 128-byte swizzled
  // rows), present only when O leaves through TMA stores.
  __device__ __forceinline__ Smem(uint32_t base, int bm, int st, bool o_tma, int qb)
      : block_m(bm), stages(st), q_bufs(qb) {
    q = base;
    k = q + uint32_t(qb) * uint32_t(bm) * D * 2;
    v = k + uint32_t(st) * kKvBytes;
    o = v + uint32_t(st) * kKvBytes;
    bars = o + (o_tma ? uint32_t(bm) * D * 2 : 0u);
  }
  __device__ __forceinline__ uint32_t q_chunk_bytes() const { return uint32_t(block_m) * 128; }
  __device__ __forceinline__ uint32_t q_tile(int slot) const {
    return q + uint32_t(slot) * uint32_t(block_m) * D * 2;
  }
  __device__ __forceinline__ uint32_t k_tile(int s) const { return k + uint32_t(s) * kKvBytes; }
  __device__ __forceinline__ uint32_t v_tile(int s) const { return v + uint32_t(s) * kKvBytes; }
  // Q slot 0's barriers come first; slot 1's follow the ring's. Arithmetic rather than a select:
  // the select took a register more in the producer thread, whose 24 were all in use there.
  __device__ __forceinline__ uint32_t q_full(int slot) const {
    return bars + uint32_t(slot) * 8 * (2 + 4 * kMaxStages);
  }
  __device__ __forceinline__ uint32_t k_full(int s) const { return bars + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const {
    return bars + 8 * (1 + kMaxStages + s);
  }
  // K and V slots are handed back separately (K right after its Q K^T retired, V after P V).
  __device__ __forceinline__ uint32_t k_empty(int s) const {
    return bars + 8 * (1 + 2 * kMaxStages + s);
  }
  __device__ __forceinline__ uint32_t v_empty(int s) const {
    return bars + 8 * (1 + 3 * kMaxStages + s);
  }
  __device__ __forceinline__ uint32_t q_empty(int slot) const {
    return bars + 8 * (1 + 4 * kMaxStages) + 16 * uint32_t(slot);
  }
  // The work tile the producer hands over with Q slot `slot` (WorkTile: {q0, hb, n_tiles,
  // part}; n_tiles -1: no more work), written before the arrive on q_full(slot), read by the
  // consumers after their wait.
  __device__ __forceinline__ uint32_t tile_info(int slot) const {
    return bars + 192 + 16 * uint32_t(slot);
  }
  // One 4-byte slot per consumer thread (tid 128..511), written and never read: see pin_softmax.
  __device__ __forceinline__ uint32_t pin_slot(int tid) const {
    return bars + 256 + 4 * uint32_t(tid - 128);
  }
};

// One work tile: Q tile qt (rows q0..q0 + block_m - 1) of head h, batch b, and the K/V tiles it
// visits: j0..n_tiles - 1. A stream-K segment of tail chunk `chunk` starts at j0 > 0 (a later
// part of its tile: it leaves a partial in the chunk's slot) or ends before the tile's last K/V
// tile (the first part: it folds in the partials of the `folds` chunks after its own); all three
// packed in `part` (j0 < kMaxSplitIters = 2^14, folds in the 9 bits above, chunk < kMaxSplitCtas in
// the 8 above those; a whole tile is part 0), one register in the producer, whose 24 spilled with
// them apart.
//
// Head and batch are packed too (hb = h | b << 16; both below 2^16, supports()): tile_info holds
// the whole struct in 16 bytes, and a consumer carries one register for both across its K/V loop
// (the one `part` takes there: d128 block_n 192 spilled without it).
struct WorkTile {
  int q0, hb, n_tiles, part = 0;
  __device__ __forceinline__ int h() const { return hb & 0xffff; }
  __device__ __forceinline__ int b() const { return hb >> 16; }
  __device__ __forceinline__ int j0() const { return part & (kMaxSplitIters - 1); }
  __device__ __forceinline__ int folds() const { return (part >> 14) & 511; }
  __device__ __forceinline__ int chunk() const { return part >> 23; }
};
// A Segment of chunk c as WorkTile::part (split -1, a later part, is j0 > 0).
__device__ __forceinline__ int pack_part(int j0, int split, int chunk) {
  return j0 | ((split > 0 ? split : 0) << 14) | (chunk << 23);
}
static_assert(kMaxSplitIters == 1 << 14 && kMaxSplitCtas <= (1 << 8), "WorkTile::part's fields");
// Whether the launch is causal: known at compile time except in the all-paths kernel (kModeAny).
template <int MODE> __device__ __forceinline__ bool causal_of(const KernelArgs &a) {
  if constexpr (MODE == kModeAny)
    return a.causal != 0;
  return MODE == kModeCausal;
}

} // namespace fb::fa3::detail
