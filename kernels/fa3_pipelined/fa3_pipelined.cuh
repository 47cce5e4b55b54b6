// FlashAttention-3-style forward for Hopper (sm_90a): TMA loads into a multi-stage shared-memory
// ring completed on mbarriers, both GEMMs on asynchronous WGMMA, a producer warpgroup and one or
// two consumer warpgroups.
//
// What it changes relative to FA2 (fa2_q_outer) and why:
//  - Loads: one thread of a producer warpgroup issues TMA box copies (cp.async.bulk.tensor) of Q
//  once and of K/V
//    tiles into a `stages`-deep ring; completion is tracked by mbarrier transaction counts
//    (k_full/v_full), and the consumers hand K and V slots back separately (k_empty/v_empty). No thread computes an
//    address or a bounds check for a load: rows past the sequence end arrive as zeros (TMA
//    out-of-bounds fill) and are masked in S.
//  - GEMMs: S = Q K^T is WGMMA with both operands in shared memory (SS, m64 x block_n x 16 per
//  k-step); O += P V is
//    WGMMA with P from registers (RS, m64 x head_dim x 16): the fp32 S accumulators become
//    bf16/fp16 A fragments in place, as in FA2, but the instruction is warpgroup-wide and
//    asynchronous.
//  - Warp specialization: the producer gives registers back (setmaxnreg.dec to 24), consumers take
//  them
//    (setmaxnreg.inc to 240), so O (64 x head_dim), S (64 x block_n) and P fit in registers at
//    head_dim 128.
//  - pingpong (2 consumers): the consumers take turns to issue Q K^T (named barriers turn0/turn1),
//  so one's
//    softmax runs while the other's GEMMs occupy the tensor cores.
//  - One kernel per problem kind (v37, traits.hpp kernel_mode): non-causal, causal and stream-K
//  kernels each compile only their own paths, so a short work tile's once-per-tile code does not
//    jump over the others' (instruction-cache misses; NOTES.md, v37).
//  - intra_wg_overlap: tile j+1's Q K^T and tile j's P V are issued back to back; the softmax of
//  j+1 runs while
//    P V of j is still in flight (FA3's two-stage pipelining inside a warpgroup). Costs one more
//    S-sized register set (P of tile j stays live).
//
// Register layouts (per consumer warpgroup of 128 threads; warp w = 0..3 of the warpgroup, lane =
// g*4 + c):
//  - WGMMA accumulator m64nN (S: N = block_n, O: N = head_dim), acc[N/2] fp32 per thread:
//      acc[4i + e] = element (row 16w + g + 8*(e/2), column 8i + 2c + e%2), i = 0..N/8-1.
//    Rows g and g+8 of each warp are "half" 0 and 1; a row's values are spread over the 4 lanes of
//    a quad.
//  - RS A fragment for k-step kt (keys 16kt..16kt+15), 4 x 32-bit (two 16-bit values, low half =
//  lower key):
//      a[0] = (row g, keys 16kt+2c, +1)    = S acc[4(2kt)+0], acc[4(2kt)+1]
//      a[1] = (row g+8, keys 16kt+2c, +1)  = S acc[4(2kt)+2], acc[4(2kt)+3]
//      a[2] = (row g, keys 16kt+8+2c, +1)  = S acc[4(2kt+1)+0], +1
//      a[3] = (row g+8, keys 16kt+8+2c,+1) = S acc[4(2kt+1)+2], +3
//  Shared-memory layouts and descriptors: kernels/common/hopper/tma.cuh and wgmma.cuh.
//
// Barriers (mbarriers in shared memory; parity of use n is n & 1):
//   q_full[q]       count 1 (producer's arrive.expect_tx) + Q bytes, once per work tile that uses Q slot q;
//                   (v7) a plain arrive for an empty tile or the end, which load nothing. Either way the
//                   arrive publishes the tile in tile_info(q).
//   k_full[s]       count 1 + K tile bytes; use n of slot s is K/V tile j = n*stages + s.
//   v_full[s]       count 1 + V tile bytes.
//   k_empty[s], v_empty[s] (v3: separate; v2 had one kv_empty after P V)
//                   count 4 * consumers: lane 0 of every consumer warp, after its warpgroup's
//   wgmma.wait_group
//                   retired the last GEMM reading slot s. The producer waits on use n-1 before
//                   refilling.
// Named barriers (bar.sync / bar.arrive, 256 threads = both consumers): id 1 = turn of consumer 0,
// id 2 = turn of consumer 1. Consumer 1 opens consumer 0's first turn; each consumer, after issuing
// its Q K^T, opens the other's turn, except consumer 1 after its last tile (consumer 0 has no turn
// left), so every barrier ends with as many arrivals as syncs.
//
//   q_empty[q]      (v4) count 4 * consumers: lane 0 of every consumer warp after its warpgroup's last
//                   Q K^T of a work tile retired (v13: the last tile it computes; it may pass over the
//                   rest), or after writing an empty or idle tile; the producer waits on it before
//                   reusing the slot (tile_info and Q).
//
// Work tiles (v4, v7): a work tile is one (Q tile, head, batch). They are numbered in one order for
// every scheduler (traits.hpp, tile_coord): (b, h) pairs are cut into L2 sections of whole GQA
// groups (as many as keep their K/V within half the L2, spread evenly over the sections; v12: at
// most two waves of tiles when causal, one group when not: section_tile_cap), and
// inside a section the Q tiles go heaviest first (causal: the last Q tiles see the most keys), the
// heads of a section interleaved. one_shot launches one CTA per work tile in that order; persistent
// and dynamic launch as many CTAs as fit on the device at once. A persistent CTA walks tiles
// blockIdx.x, + gridDim.x, ... (a fixed round robin); a dynamic CTA (v7) takes blockIdx.x and then
// claims each next tile from a counter in global memory, so a CTA that drew short causal tiles
// takes more of them and all finish together. What both buy: the producer loads the next tile's
// first K tile and Q (after q_empty) while the consumers still run the last P V and write O, so the
// pipeline fill of every tile but the first is hidden; the K/V ring and the turn ring run on
// across tiles. The producer decides the tiles and hands each to the consumers with its Q slot
// (tile_info, published before the arrive on q_full), so the consumers never decode a tile index.
//
// Causal: tiles past a Q tile's last visible key are never loaded; only tiles straddling the
// diagonal or the sequence end are masked. Rows that see no key keep m = -inf, l = 0 and give
// O = 0, LSE = -inf.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/sm_count.hpp"
#include "kernels/common/hopper/sync.cuh"
#include "kernels/common/hopper/tensor_map.hpp"
#include "kernels/common/hopper/tma.cuh"
#include "kernels/common/hopper/warpgroup.cuh"
#include "kernels/common/hopper/wgmma.cuh"
#include "kernels/common/hopper/wgmma_f16.cuh"
#include "kernels/fa3_pipelined/traits.hpp"

#include "flashbench/check.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace fb::fa3 {
namespace detail {

using namespace fb::hopper;

struct KernelArgs {
  CUtensorMap tm_q, tm_k, tm_v; // 64-byte aligned; TMA reads them from the kernel's parameter space
  CUtensorMap tm_o;             // O as Q's map with 64-row boxes: the TMA store epilogue (v5)
  void *o;
  float *lse;
  int64_t o_batch, o_seq, o_head; // O's element strides (Q's)
  // v10: Q and K in global memory, read only to recompute the scores of a K/V tile whose optimistic
  // exp2 overflowed (recompute_s; never on the timed path of ordinary inputs).
  const void *q, *k;
  int64_t k_batch, k_seq, k_head; // K's element strides
  int seqlen_q, seqlen_kv;
  int heads_q, group;
  float scale_log2;
  TileDecoder order; // the work order (traits.hpp: tile_coord)
  // v17: heads_q and stages as FastDivs: the producer divides by them for every tile and K/V load
  // (a `/` by a run-time int queued on the pipe of the consumers' exp2s: NOTES.md, v17).
  fb::kernels::FastDiv heads_q_div, stages_div;
  int total_tiles;   // num_q_tiles x heads_q x batch
  int *claims;       // dynamic scheduler (v7): [0] tiles claimed past the first wave, [1] CTAs done
  int stages;
  int consumers;
  int pingpong;
  int causal;
  int o_tma; // O through shared memory and TMA stores (o_staged), else 4-byte stores from registers
  int q_bufs; // Q buffers (q_buffers): 2 lets the next work tile's Q load under this one
  float rescale_slack; // softmax_tile: log2 units a row's max may pass its offset before O is rescaled
  int wg_pass; // v13 (causal): a warpgroup passes over K/V tiles right of its last row's diagonal
  int half_diag; // v17 (causal): no exp2 for the right half of a warpgroup's last tile when no row sees it
  // v15, scheduler stream_k: the tail shared out by K/V tiles (ctas 0 otherwise), its partials
  // (split_workspace_bytes) and their flags (split_semaphore_bytes).
  TailSplit split;
  float *partials;
  int *split_flags;
};

constexpr float kLn2 = 0.69314718055994531f;
constexpr float kRescaleSlack = 8.f; // log2 units: P stays <= 2^8 between rescales (softmax_tile)
constexpr int kBarTurn0 = 1; // named barrier ids; 0 is __syncthreads; turns use 1..3
constexpr int kBarEpi0 = 4;  // one per consumer warpgroup (4..6): its O staging buffer

template <class T> struct TypeOps;
template <> struct TypeOps<__nv_bfloat16> {
  using Tag = Bf16Tag;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
  }
};
template <> struct TypeOps<__half> {
  using Tag = F16Tag;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
  }
};

// A wgmma accumulator row is held by the four lanes of a quad, as in mma.sync's m16n8 layout: the same quad
// reductions apply.
using fb::kernels::quad_max;
using fb::kernels::quad_sum;
// 2^x on the MUFU alone (kernels/common/mma.cuh): 1 instruction per score on the critical softmax path instead of
// exp2f's 4; P values below 2^-126 do not matter (rounded into bf16/fp16 P and summed into l next to values >= 1).
using fb::kernels::fast_exp2;
// v13, the tile's end (finish_tile): 1 / l and log2 l on the MUFU alone. IEEE 1.f / l and log2f
// are a reciprocal with a Newton step and a slow-path call, and a 12-term polynomial: ~60 dependent
// instructions per row half on every warpgroup's path from its last P V to its next tile. l >= 1
// (a row's offset is the largest score it has seen, which adds exp2(0) = 1 to l), so there is no
// denormal case; both are good to ~2 ulp (O is rounded to bf16/fp16; LSE's tolerance is 2e-3).
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// exp2 offset of a row whose running max (scaled) is m: 0 while the row has seen no key, so that
// exp2(-inf - offset) = 0 rather than NaN.
__device__ __forceinline__ float row_offset(float m_scaled) {
  return m_scaled == -INFINITY ? 0.f : m_scaled;
}

// Shared-memory map of one CTA (byte addresses in the shared window, tiles 1024-aligned).
template <int D, int BN> struct Smem {
  static constexpr int kChunks = D / 64;           // 64-column (128-byte) TMA boxes per row
  static constexpr uint32_t kKvBytes = BN * D * 2; // one K or one V tile
  static constexpr uint32_t kKvChunk = BN * 128;   // one column chunk of a K/V tile
  uint32_t q, k, v, o, bars;
  int block_m, stages, q_bufs;
  // q: q_bufs (1 or 2, v5) Q tiles; with 2, the next work tile's Q loads while this one's is in
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
  // Q slot 0's barriers keep their v4 places; slot 1's follow the ring's (v5).
  // Arithmetic rather than a select (v15): the select took a register more in the producer
  // thread, whose 24 were all in use there.
  __device__ __forceinline__ uint32_t q_full(int slot) const {
    return bars + uint32_t(slot) * 8 * (2 + 4 * kMaxStages);
  }
  __device__ __forceinline__ uint32_t k_full(int s) const { return bars + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const {
    return bars + 8 * (1 + kMaxStages + s);
  }
  // v3: K and V slots are handed back separately (K right after its Q K^T retired, V after P V).
  __device__ __forceinline__ uint32_t k_empty(int s) const {
    return bars + 8 * (1 + 2 * kMaxStages + s);
  }
  __device__ __forceinline__ uint32_t v_empty(int s) const {
    return bars + 8 * (1 + 3 * kMaxStages + s);
  }
  __device__ __forceinline__ uint32_t q_empty(int slot) const {
    return bars + 8 * (1 + 4 * kMaxStages) + 16 * uint32_t(slot);
  }
  // v7: the work tile the producer hands over with Q slot `slot` (WorkTile: {q0, hb, n_tiles, part};
  // n_tiles -1: no more work), written before the arrive on q_full(slot), read by the consumers
  // after their wait.
  __device__ __forceinline__ uint32_t tile_info(int slot) const {
    return bars + 192 + 16 * uint32_t(slot);
  }
  // One 4-byte slot per consumer thread (tid 128..511), written and never read: see pin_softmax.
  __device__ __forceinline__ uint32_t pin_slot(int tid) const {
    return bars + 256 + 4 * uint32_t(tid - 128);
  }
};

// ---- trace (diagnostics; off unless FA3_TRACE is defined: cmake -DFLASHBENCH_FA3_TRACE=ON)
// %globaltimer stamps (32 ns) of every work item (a work tile, or a stream-K segment of one) on the
// first thread of each consumer warpgroup and on the producer thread, so that one launch's tile
// starts and ends can be read per CTA (scripts/dev/fa3_trace.py). Lanes of a CTA's region: consumer
// warpgroup 0..2, producer 3; record 0 of a lane holds its start, end and item count, records
// 1.. its items in order:
//   consumer: q0 | hb << 32, n_tiles | part << 32, tf (fetch_tile entered: the previous item done),
//             t0 (the item handed over: its Q landed), ts (the first P packed), t1 (the last P V
//             retired), t2 (O or the partial out), and (v19) the q_full wait passed, the first
//             k_full wait passed, S(0) retired, and (v25) O's fence entered and passed (0 with
//             direct O stores);
//   producer: q0 | hb << 32, -, tq (Q load issued), -, tc (the claim of this item returned),
//             tv (the item's last V load issued), after the Q, after K(0), and (v24) load_q entered,
//             the Q slot taken, the Q's first box issued.
// Plain stores only: a call (printf, a __noinline__ helper) in the kernel makes ptxas serialise
// every WGMMA (C7510), so the host prints them: launch_tile, after launch FA3_TRACE_LAUNCH of the
// process (the check's launches come first, so a timed one), writes "fa3trace ..." lines. Only the
// overlap path stamps. The stamps cost registers: a trace build may spill where the real one
// does not (it only warns), so read its times as a picture, not as results.
#ifdef FA3_TRACE
#ifndef FA3_TRACE_LAUNCH
#define FA3_TRACE_LAUNCH 12
#endif
constexpr int kTraceRecords = 65536, kTraceWords = 12, kTraceLanes = 4;
static __device__ unsigned long long fa3_trace_rec[kTraceRecords * kTraceWords];
__host__ __device__ constexpr int trace_per_lane(int grid) {
  return kTraceRecords / (grid * kTraceLanes) < 256 ? kTraceRecords / (grid * kTraceLanes) : 256;
}
__device__ __forceinline__ unsigned long long trace_now() {
  unsigned long long v;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  return v;
}
// Record k of this CTA's lane, or null past the lane's room.
__device__ __forceinline__ unsigned long long *trace_slot(int lane, int k) {
  const int per = trace_per_lane(gridDim.x);
  return k < per ? fa3_trace_rec + kTraceWords * ((int64_t(blockIdx.x) * kTraceLanes + lane) * per + k)
                 : nullptr;
}
__device__ __forceinline__ void trace_put(int lane, int k, int word, unsigned long long v) {
  if (unsigned long long *x = trace_slot(lane, k))
    x[word] = v;
}
__device__ __forceinline__ unsigned long long trace_meta(int q0, int hb) {
  return (unsigned long long)unsigned(q0) | (unsigned long long)unsigned(hb) << 32;
}
// Host: after the launch just queued, the FA3_TRACE_LAUNCH-th of the process, print its records.
static void trace_dump(int grid, cudaStream_t stream) {
  static int launches = 0;
  if (++launches != FA3_TRACE_LAUNCH)
    return;
  const int per = trace_per_lane(grid);
  std::vector<unsigned long long> h(size_t(grid) * kTraceLanes * per * kTraceWords);
  FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  FB_CUDA_CHECK(cudaMemcpyFromSymbol(h.data(), fa3_trace_rec, h.size() * 8));
  std::printf("fa3trace launch %d grid %d per %d\n", launches, grid, per);
  for (int c = 0; c < grid; ++c)
    for (int lane = 0; lane < kTraceLanes; ++lane) {
      const unsigned long long *r = h.data() + (size_t(c) * kTraceLanes + lane) * per * kTraceWords;
      const int n = std::min(int(r[2]), per - 1);
      if (r[0] == 0 && n == 0)
        continue;
      std::printf("fa3trace lane %d %d %llu %llu %d\n", c, lane, r[0], r[1], n);
      for (int k = 1; k <= n; ++k) {
        const unsigned long long *x = r + k * kTraceWords;
        std::printf("fa3trace rec %d %d", c, lane);
        for (int w = 0; w < kTraceWords; ++w)
          std::printf(" %llu", x[w]);
        std::printf("\n");
      }
    }
  std::fflush(stdout);
}
#endif

// One work tile: Q tile qt (rows q0..q0 + block_m - 1) of head h, batch b, and the K/V tiles it visits:
// j0..n_tiles - 1. v15: a stream-K segment of tail chunk `chunk` starts at j0 > 0 (a later part of
// its tile: it leaves a partial in the chunk's slot) or ends before the tile's last K/V tile (the
// first part: it folds in the partials of the `folds` chunks after its own); all three packed in
// `part` (j0 < kMaxSplitIters = 2^14, folds in the 9 bits above, chunk < kMaxSplitCtas in the 8
// above those; a whole tile is part 0), one register in the producer, whose 24 spilled with them
// apart.
//
// Head and batch are packed too (hb = h | b << 16; both below 2^16, supports()): tile_info holds
// the whole struct in 16 bytes, and a consumer carries one register for both across its K/V loop
// (v15: the one `part` takes there; d128 block_n 192 spilled without it).
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
// Whether the launch is causal: known at compile time except in the all-paths kernel (kModeAny, v37).
template <int MODE> __device__ __forceinline__ bool causal_of(const KernelArgs &a) {
  if constexpr (MODE == kModeAny)
    return a.causal != 0;
  return MODE == kModeCausal;
}

// Work tile t in the order described at the top of the file (traits.hpp: tile_coord).
template <int BN, int MODE>
__device__ __forceinline__ WorkTile tile_at(const KernelArgs &a, int t, int block_m) {
  const TileCoord tc = tile_coord(a.order, t);
  WorkTile w;
  w.q0 = tc.qt * block_m;
  const int b = int(a.heads_q_div.div(uint32_t(tc.bh)));
  w.hb = (tc.bh - b * a.heads_q) | (b << 16);
  w.n_tiles = int(kv_tiles_for(tc.qt, block_m, BN, a.seqlen_q, a.seqlen_kv, causal_of<MODE>(a)));
  return w;
}

// Takes Q slot use `q_use` for work tile w (waits until the consumers handed the slot's previous
// use back) and writes w into its tile_info; the caller's arrive on q_full publishes it.
template <int D, int BN>
__device__ __forceinline__ int take_q_slot(const Smem<D, BN> &sm, int q_use, const WorkTile &w) {
  const int slot = q_use & (sm.q_bufs - 1), n = q_use >> (sm.q_bufs - 1); // q_bufs 1 or 2
  if (n > 0)
    mbar_wait(sm.q_empty(slot), (n - 1) & 1);
  st_shared_v4(sm.tile_info(slot), make_int4(w.q0, w.hb, w.n_tiles, w.part));
  return slot;
}

// Q of work tile w into Q slot use q_use: the slot's wait, tile_info, then the TMA load.
template <int D, int BN>
__device__ __forceinline__ void load_q(const KernelArgs &a, const Smem<D, BN> &sm, int q_use,
                                       const WorkTile &w) {
#ifdef FA3_TRACE
  trace_put(3, q_use + 1, 8, trace_now());
#endif
  const int slot = take_q_slot(sm, q_use, w);
#ifdef FA3_TRACE
  trace_put(3, q_use + 1, 9, trace_now());
#endif
  mbar_arrive_expect_tx(sm.q_full(slot), uint32_t(sm.block_m) * D * 2);
#pragma unroll
  for (int c = 0; c < Smem<D, BN>::kChunks; ++c) {
    tma_load_4d(sm.q_tile(slot) + c * sm.q_chunk_bytes(), &a.tm_q, sm.q_full(slot), c * 64, w.q0,
                w.h(), w.b());
#ifdef FA3_TRACE
    if (c == 0)
      trace_put(3, q_use + 1, 10, trace_now());
#endif
  }
#ifdef FA3_TRACE
  trace_put(3, q_use + 1, 2, trace_now());
  trace_put(3, q_use + 1, 0, trace_meta(w.q0, w.hb));
#endif
}

// Loads of one work tile: Q once, K/V tiles j0..n_tiles-1 through the ring.
template <int D, int BN, int MODE, class Claim>
__device__ __forceinline__ void produce_tile(const KernelArgs &a, const Smem<D, BN> &sm,
                                             const WorkTile &w, int kv_base, int q_use,
                                             Claim &&claim_next) {
  using S = Smem<D, BN>;
  // kv_base: K/V tiles of the CTA's ring before this tile's K/V tile 0 (j0 of them not loaded).
  const int n_tiles = w.n_tiles, hkv = w.h() / a.group, j0 = mode_has_split(D, MODE) ? w.j0() : 0;
  // Order K(0), K(1), V(0), K(2), V(1), ..., V(n-1): the order in which the overlapped consumer
  // needs them (Q K^T(j) is issued with P V(j-1)), so a V slot that is still busy with P V(j-2)
  // never holds up K(j). K slot of tile j is free once Q K^T(j - stages) retired (k_empty), the V
  // slot once P V(j - stages) retired (v_empty). No deadlock: K(j+1) waits for Q K^T(j+1-stages),
  // which every consumer retired before it needs V(j) (stages >= 2).
  // The ring runs on across work tiles: this tile's K/V tile j is the CTA's (kv_base + j)-th.
  auto load_k = [&](int j) {
    const int g = kv_base + j, use = int(a.stages_div.div(uint32_t(g))), s = g - use * sm.stages;
    if (use > 0)
      mbar_wait(sm.k_empty(s), (use - 1) & 1);
    mbar_arrive_expect_tx(sm.k_full(s), S::kKvBytes);
#pragma unroll
    for (int c = 0; c < S::kChunks; ++c)
      tma_load_4d(sm.k_tile(s) + c * S::kKvChunk, &a.tm_k, sm.k_full(s), c * 64, j * BN, hkv, w.b());
  };
  auto load_v = [&](int j) {
    const int g = kv_base + j, use = int(a.stages_div.div(uint32_t(g))), s = g - use * sm.stages;
    if (use > 0)
      mbar_wait(sm.v_empty(s), (use - 1) & 1);
    mbar_arrive_expect_tx(sm.v_full(s), S::kKvBytes);
#pragma unroll
    for (int c = 0; c < S::kChunks; ++c)
      tma_load_4d(sm.v_tile(s) + c * S::kKvChunk, &a.tm_v, sm.v_full(s), c * 64, j * BN, hkv, w.b());
  };
  // Q before K(0) (v16; v4-v15 loaded K(0) first). With two Q buffers the Q slot's last use was two
  // tiles back, while K(0)'s slot waits for Q K^T(n-2) of the tile before: the trace (NOTES v16)
  // had the next Q go out ~0.35 us after the consumers' last P V of the tile before, and land
  // ~0.45 us after they were ready for it. With one buffer both wait for the tile's last Q K^T,
  // and the tile needs both before it can start.
  load_q(a, sm, q_use, w);
#ifdef FA3_TRACE
  trace_put(3, q_use + 1, 6, trace_now());
#endif
  load_k(j0);
#ifdef FA3_TRACE
  trace_put(3, q_use + 1, 7, trace_now());
#endif
  for (int j = j0 + 1; j < n_tiles; ++j) {
    load_k(j);
    load_v(j - 1);
  }
  // The next work tile is claimed here, about a K/V tile before the consumers finish this one (the
  // V slot's wait below): late enough that a CTA never holds a tile it could have left to an idle
  // one, early enough that the claim's round trip hides under that wait.
  claim_next();
  load_v(n_tiles - 1);
#ifdef FA3_TRACE
  trace_put(3, q_use + 1, 5, trace_now());
#endif
}

// ---- producer
// ----------------------------------------------------------------------------------------------
template <int D, int BN, int MODE>
__device__ __forceinline__ void producer(const KernelArgs &a, const Smem<D, BN> &sm) {
  tma_prefetch_desc(&a.tm_q);
  tma_prefetch_desc(&a.tm_k);
  tma_prefetch_desc(&a.tm_v);
  // Work tiles: blockIdx.x first; then blockIdx.x + gridDim.x, ... (one_shot, persistent) or, with
  // the dynamic scheduler, whatever the claim counter gives: gridDim.x + (claims before this one).
  const bool dynamic = a.claims != nullptr;
  auto next_of = [&](int t) {
    return dynamic ? int(gridDim.x) + atomicAdd(a.claims, 1) : t + int(gridDim.x);
  };
  // Every tile, empty or not, and the end, go to the consumers through a Q slot (tile_info): an
  // empty tile (no row sees a key) and the end come with a plain arrive and no load.
  // stream_k (v15): claim u < split.first is whole tile u; the next split.ctas claims are the
  // tail's chunks, last first; any later one ends the CTA's work. The cursor t is a whole tile, or
  // total_tiles + the tail's K/V tile where the next segment starts (the chunk is recomputed from
  // it: no register); after a chunk's last segment the CTA claims again. One cursor, one loop and
  // one produce_tile: a second copy of the loop, or a second cursor, spilled the producer's 24
  // registers. Without a split (split.first = total_tiles, ctas 0) every claim past the tiles ends.
  const int tail_end = a.total_tiles + a.split.lo(a.split.ctas);
  auto cursor_of = [&](int u) {
    const int k = a.split.ctas - 1 - (u - a.split.first);
    return u < a.split.first ? u : k >= 0 ? a.total_tiles + a.split.lo(k) : tail_end;
  };
  // The segment ending at the tail's K/V tile g_end (exclusive) ends its chunk.
  auto ends_chunk = [&](int g_end) { return g_end == a.split.lo(a.split.chunk_of(g_end - 1) + 1); };
  int t = cursor_of(int(blockIdx.x)), kv_base = 0, q_use = 0; // K/V tiles and Q slots used before
  while (true) {
    const bool whole = t < a.split.first;
    if (!whole && (!mode_has_split(D, MODE) || t >= tail_end))
      break;
    WorkTile w;
    if (whole || !mode_has_split(D, MODE)) {
      w = tile_at<BN, MODE>(a, t, sm.block_m);
    } else {
      const int g = t - a.total_tiles, chunk = a.split.chunk_of(g);
      const Segment seg = segment_at(a.split, chunk, g);
      w = tile_at<BN, MODE>(a, a.split.first + seg.tile, sm.block_m);
      w.n_tiles = seg.j1;
      w.part = pack_part(seg.j0, seg.split, chunk);
    }
    if (w.n_tiles > 0) {
      // Both cursors move back by j0 in place (0 for a whole tile), so that nothing more stays
      // live through the loads than for a whole tile: t + n_tiles is then the tail's next segment.
      if constexpr (mode_has_split(D, MODE)) {
        t -= w.j0();
        kv_base -= w.j0();
      }
      int next = -1;
      produce_tile<D, BN, MODE>(a, sm, w, kv_base, q_use, [&] {
        // whole, or the chunk's last segment; from the parameter bank, not a live predicate
        if (t < a.split.first || ends_chunk(t + w.n_tiles - a.total_tiles)) {
          next = cursor_of(next_of(t));
#ifdef FA3_TRACE
          trace_put(3, q_use + 2, 4, trace_now());
#endif
        }
      });
      kv_base += w.n_tiles;
      ++q_use;
      t = next >= 0 ? next : t + w.n_tiles;
      continue;
    }
    mbar_arrive(sm.q_full(take_q_slot(sm, q_use, w))); // whole tiles only: segments have keys
    ++q_use;
    t = cursor_of(next_of(t));
  }
  mbar_arrive(sm.q_full(take_q_slot(sm, q_use, WorkTile{.q0 = 0, .hb = 0, .n_tiles = -1})));
#ifdef FA3_TRACE
  if (unsigned long long *r = trace_slot(3, 0))
    r[0] = r[1] = trace_now(), r[2] = unsigned(q_use);
#endif
  // Dynamic: this CTA made its last claim. The last CTA to get here resets both counters, so the
  // next launch finds them zero (LaunchArgs::semaphores); every other CTA's last claim came before
  // its count (the fence), so nothing touches the claim counter after the reset.
  if (dynamic) {
    __threadfence();
    if (atomicAdd(a.claims + 1, 1) == int(gridDim.x) - 1) {
      atomicExch(a.claims, 0);
      atomicExch(a.claims + 1, 0);
    }
  }
}

// ---- consumer pieces
// --------------------------------------------------------------------------------------- S = Q K^T
// for this warpgroup's 64 rows and K/V slot s: D/16 k-steps, the first overwriting S.
template <class T, int D, int BN>
__device__ __forceinline__ void issue_qk(float (&sacc)[BN / 2], const Smem<D, BN> &sm, int wg,
                                         int q_slot, int s) {
  using Tag = typename TypeOps<T>::Tag;
  // Every operand of the descriptors (q_slot, wg, s, the Smem fields) is warp-uniform and known so
  // to ptxas (v9: see the broadcast at the consumer's tile start), so they are built with uniform
  // instructions (UIADD3, ULEA) straight into the uniform registers HGMMA reads, and Q's, the same
  // for every K/V tile of a work tile, stay there across the K/V loop. v7-v8 kept them in vector
  // registers (hoisted Q descriptors spilled at d128 block_n 192 until an empty asm pinned them in
  // the loop) and moved each into uniform registers with two R2URs right before its HGMMA.
  const uint32_t q_base = sm.q_tile(q_slot) + uint32_t(wg) * kRowsPerWarpgroup * 128;
  const DescBase dq = desc_base(q_base, 16), dk = desc_base(sm.k_tile(s), 16);
  const uint32_t q_chunk16 = sm.q_chunk_bytes() >> 4;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint64_t da = dq.plus16((kk / 4) * q_chunk16).at((kk % 4) * 32);
    const uint64_t db = dk.at((kk / 4) * Smem<D, BN>::kKvChunk + (kk % 4) * 32);
    wgmma_ss(sacc, da, db, kk > 0 ? 1 : 0, Tag{}, IntC<BN>{});
  }
}

// O += P V for K/V slot s: BN/16 k-steps of m64 x D x 16, P from registers.
template <class T, int D, int BN>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&pa)[BN / 16][4],
                                         const Smem<D, BN> &sm, int s) {
  using Tag = typename TypeOps<T>::Tag;
  const DescBase dv = desc_base(sm.v_tile(s), Smem<D, BN>::kKvChunk);
#pragma unroll
  for (int kt = 0; kt < BN / 16; ++kt)
    wgmma_rs(o, pa[kt], dv.at(kt * 16 * 128), Tag{}, IntC<D>{});
}

// Masks keys past the sequence end or (causal) right of the diagonal. row0 = this thread's half-0
// row. Key key0 + 2 (lane % 4) + c (c = 8 i + e % 2, a constant after unrolling) survives while
// c <= lim[half]: one compare with an immediate and one select a score (v6; v5 recomputed the key
// and compared it twice, 2 ISETP a score: the d64 kernels are ALU bound and a causal N512 launch
// masks 40% of its K/V tiles).
//
// v13: a causal tile that ends inside the sequence is cut by the diagonal alone, and there row
// g + 8 sees exactly 8 keys more than row g, so the score 8 columns right on the row 8 below has
// the same predicate: the compares fall from BN / 2 to BN / 4 + 2 a tile (34 instead of 64 at
// block_n 128; cuDNN's kernel does the same, ncu at d64 N512 causal: 16 ISETP per warp and K/V
// tile against our 47).
template <int BN>
__device__ __forceinline__ void apply_mask(float (&sacc)[BN / 2], int row0, int key0, int lane,
                                           int seqlen_q, int seqlen_kv, bool causal) {
  const int base = key0 + 2 * (lane % 4);
  if (causal && key0 + BN <= seqlen_kv) { // warp-uniform
    const int lim = row0 + (seqlen_kv - seqlen_q) - base; // half 0's; half 1's is lim + 8
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (8 * i + (e % 2) - 8 * (e / 2) > lim)
          sacc[4 * i + e] = -INFINITY;
    return;
  }
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int last = seqlen_kv - 1; // the last key row h may see
    if (causal)
      last = min(last, row0 + 8 * h + seqlen_kv - seqlen_q);
    lim[h] = last - base;
  }
#pragma unroll
  for (int i = 0; i < BN / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (8 * i + (e % 2) > lim[e / 2])
        sacc[4 * i + e] = -INFINITY;
}

// Online softmax of one tile: turns S into unnormalised P = exp2(S * scale_log2 - offset) in place,
// updates l, and, only when needed, m and the factors alpha by which O must be rescaled (per half).
// Returns whether any row of the warp moved its offset (else alpha = 1 and O needs no rescale).
//
// Lazy rescale (v6): a row keeps the offset it has while its new maximum stays within `slack` (log2
// units) of it; P is then at most 2^slack (256 at slack 8: exact in bf16/fp16, and l and O are fp32),
// and the final O / l and LSE = (m scale_log2 + log2 l) ln 2 use the same offset, so the result is the
// same softmax. After a row's first tile its offset almost never moves, so the D / 2 FMULs of O's
// rescale (one per score at d 128) leave the K/V loop and the ping-pong turn. The decision is
// warp-uniform (__any_sync): a lane that did not grow rescales by exactly 1. slack = -inf restores
// the exact running max (every tile rescales): the ablation.
//
// Both row reductions run as kReduceLanes independent chains folded by a tree at the end (v8; the
// max here, the sum in exp2_sum_block as the exp2s come out, v34): the softmax runs while the other consumer issues its GEMMs, one warp of this warpgroup per
// scheduler, so it is latency bound; v7's single chains (x = max(x, ...), sum += ...) were 17 and 32
// dependent steps per row half (ncu: the max phase alone 18% of the consumer warps' time at d 128,
// mostly `wait` stalls). A full tree needs a temporary per pair and spilled at block_n 128-192.
constexpr int kReduceLanes = 8;
template <int BN, class Op>
__device__ __forceinline__ float half_reduce(const float (&sacc)[BN / 2], int hh, Op op) {
  constexpr int kN = BN / 4, kLanes = kReduceLanes; // the BN / 4 scores of row half hh that this thread holds
  static_assert(kN % kLanes == 0, "half_reduce: block_n must be a multiple of 32");
  float a[kLanes];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float x = sacc[4 * (i / 2) + 2 * hh + i % 2];
    a[i % kLanes] = i < kLanes ? x : op(a[i % kLanes], x);
  }
#pragma unroll
  for (int w = kLanes / 2; w >= 1; w /= 2)
#pragma unroll
    for (int i = 0; i < w; ++i)
      a[i] = op(a[i], a[i + w]);
  return a[0];
}
// P = exp2(S scale_log2 - offset) and the lane-partial row sums of P, each P added to one of
// kReduceLanes chains per row half as it comes out (as half_reduce), both row halves in one stream (v8:
// the MUFU queue never waits on a half's sum). v34: exp2s, FFMAs and FADDs in one basic block, so
// that ptxas fills the MUFU's issue gaps (a warp's MUFU.EX2 after MUFU.EX2 waits 8 cycles: 16
// lanes a clock per SM) with the scale FFMAs and the sums. With exp2s and sums in separate blocks
// (v8-v33: a branch on right_dead between the row halves' exp2s, the sums after the join) ptxas
// issued 32 FFMAs, 32 MUFUs back to back (stall 8 each), the branch, the same again, then 62
// FADDs: ~128 issue cycles a tile and warp on top of the MUFU's 512 (NOTES.md, v34).
// kRightDead (v17): no row of this warp sees a key in the tile's right half (the half diagonal
// tile, half_diag_tile), whose scores the mask made -inf: their P is 0 with no exp2: half the
// exp2s of such a tile (block_n 128: a quarter of a causal N512 launch's tiles are such).
template <int BN, bool kRightDead>
__device__ __forceinline__ void exp2_sum_block(float (&sacc)[BN / 2], const float (&off)[2],
                                               float sl2, float (&sum)[2]) {
  constexpr int kLanes = kReduceLanes, kEnd = kRightDead ? BN / 4 : BN / 2;
  float acc[2][kLanes];
#pragma unroll
  for (int k = 0; k < kEnd; ++k) {
    sacc[k] = fast_exp2(fmaf(sacc[k], sl2, -off[(k % 4) / 2]));
    const int hh = (k % 4) / 2, n = (k / 4) * 2 + k % 2; // n: the score's place in its row half
    acc[hh][n % kLanes] = n < kLanes ? sacc[k] : acc[hh][n % kLanes] + sacc[k];
  }
  if constexpr (kRightDead) {
    // 0 in place, opaque to the compiler: as the constant 0.f the accumulators of the next Q K^T
    // became constants on one path, and ptxas serialised every WGMMA of the kernel (C7511).
#pragma unroll
    for (int i = BN / 4; i < BN / 2; ++i)
      asm("and.b32 %0, %0, 0;" : "+f"(sacc[i]));
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
    for (int w = kLanes / 2; w >= 1; w /= 2)
#pragma unroll
      for (int i = 0; i < w; ++i)
        acc[hh][i] += acc[hh][i + w];
    sum[hh] = acc[hh][0];
  }
}
template <int BN>
__device__ __forceinline__ void exp2_sum(float (&sacc)[BN / 2], const float (&off)[2], float sl2,
                                         bool right_dead, float (&sum)[2]) {
  if (right_dead) // warp-uniform
    exp2_sum_block<BN, true>(sacc, off, sl2, sum);
  else
    exp2_sum_block<BN, false>(sacc, off, sl2, sum);
}
template <int BN>
__device__ __forceinline__ bool softmax_tile(float (&sacc)[BN / 2], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], float sl2, float slack,
                                             bool right_dead) {
  const auto max_op = [](float x, float y) { return fmaxf(x, y); };
  float mx[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
    mx[hh] = quad_max(half_reduce<BN>(sacc, hh, max_op));
  // (mx - m) sl2 > slack: true when m = -inf and the tile has a key; NaN (false) when both are -inf.
  const bool grow = __any_sync(0xffffffffu, (mx[0] - m[0]) * sl2 > slack || (mx[1] - m[1]) * sl2 > slack);
  float off[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (grow) {
      const float m_new = fmaxf(m[hh], mx[hh]);
      alpha[hh] = fast_exp2(fmaf(m[hh], sl2, -row_offset(m_new * sl2)));
      m[hh] = m_new;
    } else {
      alpha[hh] = 1.f;
    }
    off[hh] = row_offset(m[hh] * sl2);
  }
  float sum[2];
  exp2_sum<BN>(sacc, off, sl2, right_dead, sum);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
    l[hh] = grow ? l[hh] * alpha[hh] + sum[hh] : l[hh] + sum[hh]; // lane-partial; the quad's parts are summed once at the end
  return grow;
}

// Optimistic softmax of a tile (v10), for a warp whose rows all have a finite offset (they saw a
// key in an earlier tile): P = exp2(S * scale_log2 - offset) from the offsets as they are, with no
// row max first. With the lazy rescale a row's offset almost never moves after its first tile, so
// the max phase in front of the exp2 stream (v9: ~16% of a consumer warp's time, ~450 cycles of
// latency a tile at d128 block_n 128) only ever confirmed it. The check comes after the exp2s and
// costs no extra pass: the lane-partial row sums that l needs anyway bound every P they contain, so
// P <= 2^slack holds while each sum is <= 2^slack (a sum can pass it with no P past it: then the
// slow path below runs for nothing, and it is still exact).
// Returns 0: P ready, offsets unchanged (alpha = 1). 1: some sum passed the bound; every row of the
// warp whose max grew moved its offset to that max, and P and l were multiplied by alpha (O follows
// before its next P V). 2: some P passed 2^100 or overflowed (a score passed its offset by > 100 log2 units,
// e.g. keys whose scale grows along the sequence by orders of magnitude): S is lost, P overwrote
// it, and the caller recomputes S (recompute_s) and runs softmax_tile; m, l and alpha untouched.
template <int BN>
__device__ __forceinline__ int softmax_tile_optimistic(float (&sacc)[BN / 2], float (&m)[2],
                                                       float (&l)[2], float (&alpha)[2], float sl2,
                                                       float p_bound, bool right_dead) {
  const auto max_op = [](float x, float y) { return fmaxf(x, y); };
  const float off[2] = {m[0] * sl2, m[1] * sl2};
  float sum[2];
  exp2_sum<BN>(sacc, off, sl2, right_dead, sum);
  // !(x <= bound): NaN counts as past the bound.
  if (!__any_sync(0xffffffffu, !(sum[0] <= p_bound) || !(sum[1] <= p_bound))) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      l[hh] += sum[hh], alpha[hh] = 1.f;
    return 0;
  }
  // Slow path: the row maxima of P give the new offsets (P >= 0; a row whose keys were all masked
  // here has max 0, log2 -inf, and keeps its offset).
  float mp[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
    mp[hh] = quad_max(half_reduce<BN>(sacc, hh, max_op));
  // Past 2^100 (or inf: an overflowed exp2) the tile goes back to S: alpha ~ 1 / max P must stay a
  // normal float, since ex2.approx.ftz flushes results below 2^-126 to 0 and a row whose offset
  // jumped by 126-128 log2 units would lose O and l (a numpy model of this path found such rows
  // with the x3 key growth of the tests before the GPU did).
  constexpr float kRedoAbove = 0x1p100f;
  if (__any_sync(0xffffffffu, !(mp[0] <= kRedoAbove) || !(mp[1] <= kRedoAbove)))
    return 2;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float lg;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(lg) : "f"(mp[hh]));
    const float m_new = fmaxf(m[hh], __fdividef(off[hh] + lg, sl2));
    alpha[hh] = fast_exp2(off[hh] - m_new * sl2);
    m[hh] = m_new;
    l[hh] = (l[hh] + sum[hh]) * alpha[hh];
  }
#pragma unroll
  for (int i = 0; i < BN / 2; ++i)
    sacc[i] *= alpha[(i % 4) / 2];
  return 1;
}

// S of K/V tile j again, for the rare tile whose optimistic exp2 overflowed (softmax_tile_optimistic
// returned 2): each thread computes its own accumulator entries (the layout at the top of the file)
// as fp32 dot products of Q and K read from global memory, 0 past either sequence end as TMA's fill
// gives. Per warp, with no warpgroup-wide instruction, since only some warps of a warpgroup may need
// it; slow (D x block_n / 2 FMAs a thread) but off every path that ordinary inputs take.
template <class T, int D, int BN>
__device__ __forceinline__ void recompute_s(float (&sacc)[BN / 2], const KernelArgs &a,
                                            const WorkTile &w, int row0, int j, int lane) {
  const T *q = static_cast<const T *>(a.q) + int64_t(w.b()) * a.o_batch + int64_t(w.h()) * a.o_head;
  const T *k = static_cast<const T *>(a.k) + int64_t(w.b()) * a.k_batch +
               int64_t(w.h() / a.group) * a.k_head;
  const int key0 = j * BN + 2 * (lane % 4);
  const T *qr[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = row0 + 8 * hh;
    qr[hh] = row < a.seqlen_q ? q + int64_t(row) * a.o_seq : nullptr;
  }
  // One key at a time in a loop that is not unrolled, each a loop over d, the result put in place
  // by compile-time-indexed selects: a handful of registers and one copy of the loop. Unrolled over
  // the keys (one d loop each) this path took uniform registers from the HGMMA descriptors of the
  // K/V loop around it and spilled at block_n 192.
#pragma unroll 1
  for (int kk = 0; kk < BN / 4; ++kk) {
    const int key = key0 + 8 * (kk / 2) + kk % 2;
    float s0 = 0.f, s1 = 0.f;
    if (key < a.seqlen_kv) {
      const T *kr = k + int64_t(key) * a.k_seq;
#pragma unroll 1
      for (int d = 0; d < D; ++d) {
        const float kv = fb::kernels::Elem<T>::to_float(kr[d]);
        if (qr[0] != nullptr)
          s0 = fmaf(fb::kernels::Elem<T>::to_float(qr[0][d]), kv, s0);
        if (qr[1] != nullptr)
          s1 = fmaf(fb::kernels::Elem<T>::to_float(qr[1][d]), kv, s1);
      }
    }
#pragma unroll
    for (int i = 0; i < BN / 4; ++i)
      if (i == kk) {
        sacc[4 * (i / 2) + i % 2] = s0;
        sacc[4 * (i / 2) + 2 + i % 2] = s1;
      }
  }
}

// pin_softmax: kernels/common/hopper/wgmma.cuh.

template <int D>
__device__ __forceinline__ void rescale(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    o[4 * i + 0] *= alpha[0], o[4 * i + 1] *= alpha[0];
    o[4 * i + 2] *= alpha[1], o[4 * i + 3] *= alpha[1];
  }
}

template <class T, int BN>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[BN / 16][4], const float (&sacc)[BN / 2]) {
#pragma unroll
  for (int kt = 0; kt < BN / 16; ++kt) {
    pa[kt][0] = TypeOps<T>::pack(sacc[8 * kt + 0], sacc[8 * kt + 1]);
    pa[kt][1] = TypeOps<T>::pack(sacc[8 * kt + 2], sacc[8 * kt + 3]);
    pa[kt][2] = TypeOps<T>::pack(sacc[8 * kt + 4], sacc[8 * kt + 5]);
    pa[kt][3] = TypeOps<T>::pack(sacc[8 * kt + 6], sacc[8 * kt + 7]);
  }
}

// O of one warpgroup's 64 rows through shared memory and TMA (v5): stmatrix puts the normalised
// accumulators into the staging buffer in the 128-byte-swizzled layout the O map expects (conflict
// free: the 8 rows of an 8x8 matrix land in 8 different 16-byte units), then one thread issues a
// TMA store per 64-column chunk and the warpgroup goes on to its next work tile while the copy
// engine writes; rows past seqlen_q are clipped by the map. The v4 epilogue (4-byte stores from
// registers) cost ~18% of the consumer warps' time at d128 N512 (ncu: SHFL and register reuse
// stalled behind 32 queued STG per thread). Before rewriting the buffer, the issuing thread waits
// until its previous store has read it, and a warpgroup barrier passes that on.
template <class T, int D, int BN>
__device__ __forceinline__ void store_o_tma(const KernelArgs &a, const Smem<D, BN> &sm, int wg,
                                            const WorkTile &w, const float (&o)[D / 2],
                                            const float (&inv)[2]
#ifdef FA3_TRACE
                                            , unsigned long long *tf = nullptr
#endif
) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  if (t == 0)
    bulk_wait_read_all();
  named_sync(kBarEpi0 + wg, 128);
  // Lane 8j + r addresses row r of matrix j: j % 2 = row half, j / 2 = second column block.
  const int mtx = lane / 8, r = lane % 8;
  const uint32_t row_addr =
      sm.o + uint32_t(wg * kRowsPerWarpgroup + 16 * warp + 8 * (mtx % 2) + r) * 128;
#pragma unroll
  for (int i = 0; i < D / 8; i += 2) {
    const int ii = i + mtx / 2; // column block (8 columns) this lane addresses
    const uint32_t addr =
        row_addr + uint32_t(ii / 8) * sm.q_chunk_bytes() + uint32_t(((ii % 8) ^ r) * 16);
    stmatrix_x4(addr, TypeOps<T>::pack(o[4 * i + 0] * inv[0], o[4 * i + 1] * inv[0]),
                TypeOps<T>::pack(o[4 * i + 2] * inv[1], o[4 * i + 3] * inv[1]),
                TypeOps<T>::pack(o[4 * i + 4] * inv[0], o[4 * i + 5] * inv[0]),
                TypeOps<T>::pack(o[4 * i + 6] * inv[1], o[4 * i + 7] * inv[1]));
  }
#ifdef FA3_TRACE
  if (tf && t == 0)
    tf[0] = trace_now();
#endif
  fence_proxy_async_smem();
#ifdef FA3_TRACE
  if (tf && t == 0)
    tf[1] = trace_now();
#endif
  named_sync(kBarEpi0 + wg, 128);
  if (t == 0) {
    const uint64_t evict_first = l2_policy_evict_first();
#pragma unroll
    for (int c = 0; c < D / 64; ++c)
      tma_store_4d(&a.tm_o,
                   sm.o + uint32_t(c) * sm.q_chunk_bytes() + uint32_t(wg * kRowsPerWarpgroup) * 128,
                   c * 64, w.q0 + wg * kRowsPerWarpgroup, w.h(), w.b(), evict_first);
    bulk_commit();
  }
}

// ---- consumer
// ------------------------------------------------------------------------------------------------
// What a consumer warpgroup keeps about the work tile it is on: the tile, this thread's half-0 row,
// the first K/V tile that needs a mask, and the Q slot holding the tile's Q.
struct TileCtx {
  WorkTile w;
  int row0;       // this thread's half-0 row; half 1 is row0 + 8
  int first_mask; // first K/V tile whose keys need masking for some row of this warpgroup
  int n_wg;       // K/V tiles this warpgroup computes (the rest it passes over: pass_k, pass_v)
  int q_slot;
#ifdef FA3_TRACE
  unsigned long long t_q; // fetch_tile: q_full passed
  mutable unsigned long long tf[2]; // v25: O's fence entered and passed (store_o_tma)
#endif
};
template <int MODE>
__device__ __forceinline__ TileCtx make_ctx(const KernelArgs &a, const WorkTile &w, int wg,
                                            int q_slot, int bn) {
  const int t = threadIdx.x % 128;
  TileCtx c;
  c.w = w;
  c.row0 = w.q0 + wg * kRowsPerWarpgroup + (t / 32) * 16 + (t % 32) / 4;
  // The K/V tile holding key seqlen_kv, or (causal) the first whose last key lies right of the
  // diagonal for the warpgroup's first row.
  c.first_mask = a.seqlen_kv / bn;
  if (causal_of<MODE>(a)) {
    const int x = w.q0 + wg * kRowsPerWarpgroup + (a.seqlen_kv - a.seqlen_q) + 1;
    c.first_mask = min(c.first_mask, x <= 0 ? 0 : x / bn);
  }
  // v13: causal, the tiles right of the diagonal of this warpgroup's last row hold no key any of
  // its rows sees (block_m 192 at block_n 128: 13% of a causal N512 launch's warpgroup-tiles, 10%
  // at N1024; test WarpgroupsPassOverTilesRightOfTheirDiagonal). At
  // least one tile stays, so rows that see no key still get m = -inf, l = 0 from a masked tile.
  // n_wg takes n_tiles' register in the K/V loop (a second one spilled 4 bytes at d64 with three
  // consumers and at d128 block_n 192); the passes after it recompute n_tiles (pass_count).
  c.n_wg = w.n_tiles;
  if (causal_of<MODE>(a) && a.wg_pass)
    c.n_wg = max(1, kv_tiles_to_row(min(w.q0 + (wg + 1) * kRowsPerWarpgroup, a.seqlen_q) - 1, bn,
                                    a.seqlen_q, a.seqlen_kv, true));
  c.q_slot = q_slot;
#ifdef FA3_TRACE
  c.tf[0] = c.tf[1] = 0;
#endif
  return c;
}

// The work tile's first row, from this thread's row0 (v15): what follows the K/V loop reads q0 this
// way, so that nothing after the loop needs c.w.q0 next to row0. (While v15 fought its spills this
// alone did not move ptxas's allocation; keeping `part` uniform did. It costs three integer ops.)
__device__ __forceinline__ int tile_q0(const TileCtx &c, int wg) {
  const int t = threadIdx.x % 128;
  return c.row0 - wg * kRowsPerWarpgroup - (t / 32) * 16 - (t % 32) / 4;
}

// K/V tiles of the work tile that this warpgroup passes over (v13): n_tiles - n_wg, n_tiles
// recomputed as tile_at did (kv_tiles_for), from the CTA's last row.
// Non-causal (or wg_pass off): none, and n_wg is the segment's end (v15), not n_tiles.
template <int MODE>
__device__ __forceinline__ int pass_count(const KernelArgs &a, const TileCtx &c, int wg, int bn) {
  if (!causal_of<MODE>(a) || !a.wg_pass)
    return 0;
  const int last_row = min(tile_q0(c, wg) + a.consumers * kRowsPerWarpgroup, a.seqlen_q) - 1;
  return kv_tiles_to_row(last_row, bn, a.seqlen_q, a.seqlen_kv, true) - c.n_wg;
}

// v17, the half diagonal tile: causal, K/V tile j is this warpgroup's last and none of its rows
// sees a key in the tile's right half. With block_n 128 and seqlen_q = seqlen_kv that is every
// other 64-row block's diagonal tile (rows 128k .. 128k + 63): a quarter of the tiles a causal N512
// launch computes at block_m 192 or 128, a ninth at N1024. Any alignment: the test is on the
// warpgroup's last visible key. (Computing such a tile as m64n64 GEMMs as well was tried: a second,
// narrower copy of either GEMM in the loop serialised every WGMMA of the 3-consumer kernel
// (C7511) or spilled it; NOTES.md, v17.)
template <int BN, int MODE>
__device__ __forceinline__ bool half_diag_tile(const KernelArgs &a, const TileCtx &c, int wg,
                                               int j) {
  if (!causal_of<MODE>(a) || !a.half_diag || j != c.n_wg - 1)
    return false;
  const int last_row = min(tile_q0(c, wg) + (wg + 1) * kRowsPerWarpgroup, a.seqlen_q) - 1;
  return last_row + (a.seqlen_kv - a.seqlen_q) - j * BN < BN / 2;
}

// Position in the CTA's K/V ring: slot and how many times it was used before (the ring runs on
// across work tiles).
struct RingPos {
  int s = 0, use = 0;
  __device__ __forceinline__ void next(int stages) {
    if (++s == stages)
      s = 0, ++use;
  }
  // The position before this one (stages >= 2).
  __device__ __forceinline__ RingPos prev(int stages) const {
    return s == 0 ? RingPos{stages - 1, use - 1} : RingPos{s - 1, use};
  }
};

// Named barriers of the ping-pong turn ring (2 or 3 consumers): consumer wg waits on its own turn
// and opens the next one's (mod consumers).
__device__ __forceinline__ int turn_bar(int wg) { return kBarTurn0 + wg; }
__device__ __forceinline__ int next_turn_bar(int wg, int consumers) {
  return kBarTurn0 + (wg + 1 == consumers ? 0 : wg + 1);
}

// A K/V tile this warpgroup does not compute (rows past seqlen_q, v12; keys right of its diagonal,
// v13) still has its books kept, or the others would wait forever: its ping-pong turn, taken in the
// ring's order, and both ring slots handed back. A slot goes back only once it has filled: an arrive
// before the fill would count towards the phase of the slot's previous use.
template <int D, int BN>
__device__ __forceinline__ void pass_k(const KernelArgs &a, const Smem<D, BN> &sm, int wg,
                                       const RingPos &r) {
  mbar_wait(sm.k_full(r.s), r.use & 1);
  if (a.pingpong) {
    named_sync(turn_bar(wg), 256);
    named_arrive(next_turn_bar(wg, a.consumers), 256);
  }
  if (threadIdx.x % 32 == 0)
    mbar_arrive(sm.k_empty(r.s));
}
template <int D, int BN>
__device__ __forceinline__ void pass_v(const Smem<D, BN> &sm, const RingPos &r) {
  mbar_wait(sm.v_full(r.s), r.use & 1);
  if (threadIdx.x % 32 == 0)
    mbar_arrive(sm.v_empty(r.s));
}

// Rows of a tile that sees no key (causal with seqlen_q > seqlen_kv): O = 0 and LSE = -inf,
// without touching the ring.
template <class T, int D>
__device__ __forceinline__ void write_empty_tile(const KernelArgs &a, const WorkTile &w, int wg) {
  T *og = static_cast<T *>(a.o) + int64_t(w.b()) * a.o_batch + int64_t(w.h()) * a.o_head;
  float *lse = a.lse + (int64_t(w.b()) * a.heads_q + w.h()) * a.seqlen_q;
  const int r0 = w.q0 + wg * kRowsPerWarpgroup, tid = int(threadIdx.x % 128);
  for (int idx = tid; idx < kRowsPerWarpgroup * D / 8; idx += 128) {
    const int row = r0 + idx / (D / 8);
    if (row < a.seqlen_q)
      *reinterpret_cast<uint4 *>(og + int64_t(row) * a.o_seq + (idx % (D / 8)) * 8) =
          make_uint4(0, 0, 0, 0);
  }
  if (tid < kRowsPerWarpgroup && r0 + tid < a.seqlen_q)
    lse[r0 + tid] = -INFINITY;
}

// The CTA's next work tile with keys to visit, as the producer hands it over with Q slot use
// `q_use` (tile_info, after q_full: Q has landed too); empty tiles on the way are written here and
// their slot handed back. False at the end of the CTA's work.
//
// v12: a tile in which all 64 rows of this warpgroup lie past seqlen_q (the last Q tile of a
// block_m 192 launch at N 512: rows 512-575) is passed over here too. Run, TMA's zero fill would
// make it do both GEMMs and the softmax for rows nobody reads: 11% of a d64 N512 launch's tensor
// and MUFU work (ncu: 17% more MUFU instructions than cuDNN's). It still keeps the books: per K/V
// tile it takes its ping-pong turn, and it hands each ring slot back only once the slot has filled
// (an arrive before the fill would count towards the phase of the slot's previous use), which
// moves the ring position r on. Here rather than in the consumer's loop, where the branch cost
// d128 block_n 192 a 4-byte spill.
template <class T, int D, int BN, int MODE>
__device__ __forceinline__ bool fetch_tile(const KernelArgs &a, const Smem<D, BN> &sm, int wg,
                                           int &q_use, TileCtx &c, RingPos &r) {
  while (true) {
    const int slot = q_use & (sm.q_bufs - 1), parity = (q_use >> (sm.q_bufs - 1)) & 1; // 1 or 2
    mbar_wait(sm.q_full(slot), parity);
#ifdef FA3_TRACE
    const unsigned long long t_q = trace_now();
#endif
    // Lane 0 reads the slot and passes it on: lane 0 is also the lane that hands the slot back
    // (q_empty, release_k), so program order alone puts every read of use n before the producer's
    // write of use n + q_bufs (racecheck flagged the other lanes' reads, which nothing ordered
    // with lane 0's arrive).
    int4 info = make_int4(0, 0, 0, 0);
    if (threadIdx.x % 32 == 0)
      info = ld_shared_v4(sm.tile_info(slot));
    const WorkTile w{__shfl_sync(0xffffffffu, info.x, 0), __shfl_sync(0xffffffffu, info.y, 0),
                     __shfl_sync(0xffffffffu, info.z, 0), __shfl_sync(0xffffffffu, info.w, 0)};
    if (w.n_tiles < 0)
      return false;
    if (w.n_tiles > 0 && w.q0 + wg * kRowsPerWarpgroup < a.seqlen_q) {
      c = make_ctx<MODE>(a, w, wg, slot, BN);
#ifdef FA3_TRACE
      c.t_q = t_q;
#endif
      return true;
    }
    if (w.n_tiles > 0) { // all rows past seqlen_q
      for (int j = w.j0(); j < w.n_tiles; ++j) {
        pass_k(a, sm, wg, r);
        pass_v(sm, r);
        r.next(sm.stages);
      }
    } else {
      write_empty_tile<T, D>(a, w, wg);
    }
    if (threadIdx.x % 32 == 0)
      mbar_arrive(sm.q_empty(slot));
    ++q_use;
  }
}

// O / l and LSE = (m * scale_log2 + log2 l) * ln 2 of a finished work tile. Every multiply and
// conversion comes before the first store, so no shuffle or row sum queues behind the stores.
template <class T, int D, int BN>
__device__ __forceinline__ void finish_tile(const KernelArgs &a, const Smem<D, BN> &sm, int wg,
                                            const TileCtx &c, const float (&o)[D / 2],
                                            const float (&m)[2], const float (&l)[2]) {
  const int lane = threadIdx.x % 32, sq = a.seqlen_q;
  float inv[2], lt[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    lt[hh] = quad_sum(l[hh]);
    inv[hh] = lt[hh] > 0.f ? fast_rcp(lt[hh]) : 0.f;
  }
  float *lse = a.lse + (int64_t(c.w.b()) * a.heads_q + c.w.h()) * sq;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = c.row0 + 8 * hh;
    if (row < sq && lane % 4 == 0)
      lse[row] = lt[hh] > 0.f ? (m[hh] * a.scale_log2 + fast_log2(lt[hh])) * kLn2 : -INFINITY;
  }
  if (a.o_tma) {
    store_o_tma<T, D, BN>(a, sm, wg, WorkTile{.q0 = tile_q0(c, wg), .hb = c.w.hb, .n_tiles = 0},
                          o, inv
#ifdef FA3_TRACE
                          , c.tf
#endif
    );
    return;
  }
  // Direct: 4-byte stores from the accumulators (a quad writes 16 contiguous bytes per row and
  // column block); the v4 epilogue, kept for configs whose ring leaves no room for the staging.
  T *og = static_cast<T *>(a.o) + int64_t(c.w.b()) * a.o_batch + int64_t(c.w.h()) * a.o_head;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = c.row0 + 8 * hh;
    if (row >= sq)
      continue;
    T *orow = og + int64_t(row) * a.o_seq + 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      *reinterpret_cast<uint32_t *>(orow + 8 * i) =
          TypeOps<T>::pack(o[4 * i + 2 * hh] * inv[hh], o[4 * i + 2 * hh + 1] * inv[hh]);
  }
}

// v15, stream_k: a segment that does not start its tile leaves this thread's O accumulators, m and
// l as they are (unnormalised, relative to its own offsets m) in its chunk's workspace slot,
// thread-minor so that a warpgroup's stores coalesce, then raises the slot's flag for this
// warpgroup. Only the first segment of a chunk can be such a part: a slot is written once a launch.
template <int D>
__device__ __forceinline__ void write_partial(const KernelArgs &a, int wg, int chunk,
                                              const float (&o)[D / 2], const float (&m)[2],
                                              const float (&l)[2]) {
  const int t = threadIdx.x % 128, slot = chunk * a.consumers + wg;
  float *p = a.partials + int64_t(slot) * 128 * split_partial_floats(D) + t;
#pragma unroll
  for (int i = 0; i < D / 2; ++i)
    __stcg(p + i * 128, o[i]);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    __stcg(p + (D / 2 + hh) * 128, m[hh]);
    __stcg(p + (D / 2 + 2 + hh) * 128, l[hh]);
  }
  named_sync(kBarEpi0 + wg, 128); // every thread's stores before the release
  if (t == 0)
    st_release_gpu(a.split_flags + slot, 1);
}
// The tile's first segment (the last of its chunk): folds in the parts of chunks chunk + 1 .. + n
// (the first segments of chunks claimed before this one, so the wait is short), as two softmax
// states are merged: both rescaled to the larger offset. The flags go back to zero (the
// semaphores' contract) once every thread has read its part.
template <int D>
__device__ __forceinline__ void fold_partials(const KernelArgs &a, int wg, int chunk, int n,
                                              float (&o)[D / 2], float (&m)[2], float (&l)[2]) {
  const int t = threadIdx.x % 128;
  for (int k = 1; k <= n; ++k) {
    const int slot = (chunk + k) * a.consumers + wg;
    if (t == 0)
      while (ld_acquire_gpu(a.split_flags + slot) == 0) {
      }
    named_sync(kBarEpi0 + wg, 128);
    const float *p = a.partials + int64_t(slot) * 128 * split_partial_floats(D) + t;
    float f[2], fp[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float mp = __ldcg(p + (D / 2 + hh) * 128), lp = __ldcg(p + (D / 2 + 2 + hh) * 128);
      const float mx = fmaxf(m[hh], mp);
      // exp2(-inf) = 0 for a side that saw no key; both -inf: offset 0, both factors 0 (O = 0).
      f[hh] = fast_exp2(fmaf(m[hh], a.scale_log2, -row_offset(mx * a.scale_log2)));
      fp[hh] = fast_exp2(fmaf(mp, a.scale_log2, -row_offset(mx * a.scale_log2)));
      l[hh] = l[hh] * f[hh] + lp * fp[hh];
      m[hh] = mx;
    }
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
      o[i] = o[i] * f[(i % 4) / 2] + __ldcg(p + i * 128) * fp[(i % 4) / 2];
  }
  named_sync(kBarEpi0 + wg, 128);
  for (int k = t; k < n; k += 128)
    a.split_flags[(chunk + 1 + k) * a.consumers + wg] = 0;
}
// The first K/V tile of a work tile or (v15) of a stream-K segment of one.
template <int D, int MODE> __device__ __forceinline__ int j_first(const TileCtx &c) {
  return mode_has_split(D, MODE) ? c.w.j0() : 0;
}
// The end of a work tile, or (v15) of a stream-K segment of one: a later part leaves a partial; the
// first part of a split tile folds the others in before it writes O and LSE as a whole tile does.
template <class T, int D, int BN, int MODE>
__device__ __forceinline__ void end_tile(const KernelArgs &a, const Smem<D, BN> &sm, int wg,
                                         const TileCtx &c, float (&o)[D / 2], float (&m)[2],
                                         float (&l)[2]) {
  if constexpr (mode_has_split(D, MODE)) {
    if (j_first<D, MODE>(c) > 0) {
      write_partial<D>(a, wg, c.w.chunk(), o, m, l);
      return;
    }
    if (c.w.folds() > 0)
      fold_partials<D>(a, wg, c.w.chunk(), c.w.folds(), o, m, l);
  }
  finish_tile<T, D, BN>(a, sm, wg, c, o, m, l);
}

// A consumer warpgroup's share of every work tile of the CTA: its 64 rows of each Q tile against
// the tile's K/V tiles, then O and LSE.
//
// intra_wg_overlap on. Inside a tile, Q K^T(j) and P V(j-1) are issued together and softmax(j)
// runs while P V(j-1) is in flight. A tile starts on its own (Q K^T(0), wait, softmax(0)) and ends
// with its last P V alone, then O. (v5 tried issuing the next work tile's Q K^T(0) with this
// tile's last P V: no gain, up to 7% lost at d64, removed in v7; NOTES.md.)
// The work tiles come from the producer (fetch_tile), whatever the scheduler.
//
// intra_wg_overlap off: one tile at a time, each GEMM waited for (the ablation).
template <class T, int D, int BN, bool OVERLAP, int MODE>
__device__ __forceinline__ void consumer(const KernelArgs &a, const Smem<D, BN> &sm, int wg) {
  const int lane = threadIdx.x % 32;
  const int sq = a.seqlen_q, skv = a.seqlen_kv;
  const bool causal = causal_of<MODE>(a), pp = a.pingpong != 0;
  const float sl2 = a.scale_log2;
  // Turn ring over the consumers (2 or 3): consumer w waits on turn w, opens turn w+1 (mod C).
  const int nwg = a.consumers;
  const int my_turn = turn_bar(wg), other_turn = next_turn_bar(wg, nwg);
  if (pp && wg == nwg - 1)
    named_arrive(kBarTurn0, 256); // consumer 0 takes the first turn
  auto qk_turn_begin = [&]() {
    if (pp)
      named_sync(my_turn, 256);
  };
  auto qk_turn_end = [&]() {
    if (pp)
      named_arrive(other_turn, 256);
  };
  // Q K^T(j) of tile c retired: the producer may refill this K slot while we do softmax; after this
  // warpgroup's last one of the tile, its Q slot too (n_wg = n_tiles in the ablation path).
  auto release_k = [&](int s, int j, const TileCtx &c) {
    if (lane == 0) {
      mbar_arrive(sm.k_empty(s));
      if (j == c.n_wg - 1)
        mbar_arrive(sm.q_empty(c.q_slot));
    }
  };
  auto release_v = [&](int s) {
    if (lane == 0)
      mbar_arrive(sm.v_empty(s));
  };

  float o[D / 2];
  float m[2], l[2], alpha[2];
  bool grew = true; // the last softmax moved an offset: O needs `alpha` before its next P V
  // v10: once every row of the warp has an offset (after the tile in which all its rows saw a key),
  // tiles go through softmax_tile_optimistic; not in the exact-rescale ablation (slack -inf).
  // v38: in the non-causal kernels (plain, split) every row sees the first key of its work tile's
  // first K/V tile, so after the tile start's exact softmax the warp is settled, and the overlapped
  // loop runs the optimistic softmax at every step: it holds no copy of the exact one but the
  // overflow's redo. Their launches are always lazy (the exact-rescale ablation runs the all-paths
  // kernel: all_paths_requested). v40: so does the causal kernel, which starts every work tile at
  // key 0 and runs only problems whose every row sees key 0 (traits.hpp kernel_mode).
  constexpr bool kSettledLoop = MODE == kModePlain || MODE == kModeSplit || MODE == kModeCausal;
  const bool lazy = kSettledLoop || a.rescale_slack > 0.f;
  const float p_bound = lazy ? exp2f(a.rescale_slack) : 0.f;
  bool settled = false; // warp-uniform
  float sacc[BN / 2];
  uint32_t pa[BN / 16][4];
  auto reset_stats = [&]() {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      m[hh] = -INFINITY, l[hh] = 0.f;
    settled = false;
  };
  auto zero_o = [&]() {
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
      o[i] = 0.f;
  };
  auto exact_softmax = [&](bool right_dead) {
    grew = softmax_tile<BN>(sacc, m, l, alpha, sl2, a.rescale_slack, right_dead);
    settled = lazy && __all_sync(0xffffffffu, m[0] > -INFINITY && m[1] > -INFINITY);
  };
  // The mask of K/V tile j where it needs one; true when its right half holds no key for this warp.
  auto mask_tile = [&](const TileCtx &c, int j) {
    if (j < c.first_mask)
      return false;
    apply_mask<BN>(sacc, c.row0, j * BN, lane, sq, skv, causal);
    return half_diag_tile<BN, MODE>(a, c, wg, j);
  };
  // The softmax of K/V tile j, optimistic where `optimistic` (the warp is settled), else exact.
  // True when S was lost to an overflowing exp2 (warp-uniform): the caller then runs redo_softmax
  // before packing P. In the overlap loop it does so after P V(j-1) retired, so that P of j-1 is
  // no longer live: with O, S and that P live the recompute's few registers spilled (bn192).
  auto mask_and_softmax = [&](const TileCtx &c, int j, bool optimistic) {
    const bool right_dead = mask_tile(c, j);
    if (optimistic) {
      const int r = softmax_tile_optimistic<BN>(sacc, m, l, alpha, sl2, p_bound, right_dead);
      grew = r == 1;
      return r == 2;
    }
    exact_softmax(right_dead);
    return false;
  };
  auto redo_softmax = [&](const TileCtx &c, int j) {
    recompute_s<T, D, BN>(sacc, a, c.w, c.row0, j, lane);
    exact_softmax(mask_tile(c, j));
  };
  auto rescale_o = [&]() {
    if (grew) // warp-uniform
      rescale<D>(o, alpha);
  };

  int q_use = 0; // Q slot uses (work tiles, empty ones included) before the current tile
  RingPos r;     // K/V tile j of the current work tile
  TileCtx c;
#ifdef FA3_TRACE
  const bool tracer = threadIdx.x % 128 == 0;
  const unsigned long long t_begin = trace_now();
  int items = 0;
  if (tracer)
    trace_put(wg, 1, 2, t_begin);
#endif
  if (fetch_tile<T, D, BN, MODE>(a, sm, wg, q_use, c, r)) {
    if constexpr (!OVERLAP) {
      do {
        reset_stats();
        zero_o();
        for (int j = j_first<D, MODE>(c); j < c.n_wg; ++j) {
          mbar_wait(sm.k_full(r.s), r.use & 1);
          qk_turn_begin();
          wgmma_fence();
          issue_qk<T, D, BN>(sacc, sm, wg, c.q_slot, r.s);
          wgmma_commit();
          qk_turn_end();
          wgmma_wait<0>();
          fence_operands(sacc);
          release_k(r.s, j, c);
          if (mask_and_softmax(c, j, settled))
            redo_softmax(c, j);
          rescale_o();
          pack_p<T, BN>(pa, sacc);
          mbar_wait(sm.v_full(r.s), r.use & 1);
          wgmma_fence();
          issue_pv<T, D, BN>(o, pa, sm, r.s);
          wgmma_commit();
          wgmma_wait<0>();
          fence_operands(o);
          fence_operands(pa);
          release_v(r.s);
          r.next(sm.stages);
        }
        for (int j = 0, n = pass_count<MODE>(a, c, wg, BN); j < n; ++j) { // v13, as in the overlap path
          pass_k(a, sm, wg, r);
          pass_v(sm, r);
          r.next(sm.stages);
        }
        end_tile<T, D, BN, MODE>(a, sm, wg, c, o, m, l);
      } while (fetch_tile<T, D, BN, MODE>(a, sm, wg, ++q_use, c, r));
    } else {
      // The K/V tile whose P is in pa: always the one before r. Derived rather than carried (v9): a
      // copy of r carried in the loop was kept in a vector register and its V descriptors with it.
      auto rp = [&] { return r.prev(sm.stages); };
      // The ring position and the Q slot are the same in every lane, but ptxas does not prove it
      // for values carried around the work-tile loop (whose exit goes through fetch_tile), and then
      // builds every HGMMA descriptor from them in vector registers, with two R2URs per HGMMA right
      // before it (v8: 44 R2URs in the d128 block_n 128 K/V loop's issue, the HGMMAs waiting on
      // them). A broadcast from lane 0 at each tile start makes them uniform for the compiler (v9:
      // one R2UR left there). Not in the ablation path above: its SASS got worse with it.
      auto broadcast_tile_state = [&]() {
        r.s = __shfl_sync(0xffffffffu, r.s, 0);
        r.use = __shfl_sync(0xffffffffu, r.use, 0);
        c.q_slot = __shfl_sync(0xffffffffu, c.q_slot, 0);
        c.w.part = __shfl_sync(0xffffffffu, c.w.part, 0); // v15: kept in a uniform register
      };
      // Q K^T into S (Q from q_slot, K from ring slot r) and, on top, O *= alpha then P V (V from rp):
      // both GEMMs in flight, in this consumer's turn. O is not an operand of Q K^T, so the rescale
      // runs while it does.
      auto issue_qk_and_pv = [&](int q_slot) {
        qk_turn_begin();
        wgmma_fence();
        issue_qk<T, D, BN>(sacc, sm, wg, q_slot, r.s);
        wgmma_commit();
        rescale_o();
        wgmma_fence();
        issue_pv<T, D, BN>(o, pa, sm, rp().s);
        wgmma_commit();
        qk_turn_end();
      };
      // Pin the softmax results above the wait that follows: without these the compiler sinks the
      // whole softmax (max, exp2, row sums) below `wait_group 0` (v1's SASS: every MUFU.EX2 after
      // WARPGROUP.DEPBAR.LE gsb0, 0x0), which serializes it behind the P V in flight and made
      // overlap ~15% slower than no overlap on the first GPU run.
      auto pin_above_wait = [&]() {
        fence_operands(sacc);
        fence_operands(alpha);
        fence_operands(l);
        fence_operands(m);
        pin_softmax(sm.pin_slot(int(threadIdx.x)), l, alpha);
      };
      do {
#ifdef FA3_TRACE
        if (tracer)
          trace_put(wg, items + 1, 3, trace_now());
#endif
        // The tile's start on its own: S(0), softmax, P; its P V is issued with the next Q K^T.
        broadcast_tile_state();
        reset_stats();
        zero_o();
        mbar_wait(sm.k_full(r.s), r.use & 1);
#ifdef FA3_TRACE
        if (tracer) {
          trace_put(wg, items + 1, 7, c.t_q);
          trace_put(wg, items + 1, 8, trace_now());
        }
#endif
        qk_turn_begin();
        wgmma_fence();
        issue_qk<T, D, BN>(sacc, sm, wg, c.q_slot, r.s);
        wgmma_commit();
        qk_turn_end();
        wgmma_wait<0>();
        fence_operands(sacc);
#ifdef FA3_TRACE
        if (tracer)
          trace_put(wg, items + 1, 9, trace_now());
#endif
        release_k(r.s, j_first<D, MODE>(c), c);
        mask_and_softmax(c, j_first<D, MODE>(c), false); // the exact softmax, never a redo
        pack_p<T, BN>(pa, sacc);
        r.next(sm.stages);
#ifdef FA3_TRACE
        if (tracer)
          trace_put(wg, items + 1, 4, trace_now());
#endif
        // v39: the overflow's redo leaves the K/V loop (break) and re-enters it after the step, so
        // that its code (recompute + exact softmax) lies outside the loop a step runs through. In
        // the plain kernel at head_dim 64 only: its A/B (c149) gained 0.5-3% at d64 N >= 1024 and
        // lost 0.5-1% at d128; the all-paths and split kernels of d64 with three consumers and d128
        // block_n 192 spilled 8-20 bytes with it, head_dim 256 36-44 (c147).
        constexpr bool kRedoExit = MODE == kModePlain && D == 64;
        for (int j = j_first<D, MODE>(c) + 1; j < c.n_wg;) {
          bool redo = false;
          for (; j < c.n_wg; ++j) {
            // Both waits come before the first issue: nothing that may spin sits between the two
            // GEMMs in flight.
            mbar_wait2(sm.k_full(r.s), r.use & 1, sm.v_full(rp().s), rp().use & 1);
            issue_qk_and_pv(c.q_slot); // Q K^T(j), P V(j-1)
            wgmma_wait<1>(); // S of tile j is ready; P V of tile j-1 may still run
            fence_operands(sacc);
            release_k(r.s, j, c);
            redo = mask_and_softmax(c, j, kSettledLoop || settled);
            pin_above_wait();
            wgmma_wait<0>();
            fence_operands(o);
            fence_operands(pa);
            release_v(rp().s);
            if (redo) {
              if constexpr (kRedoExit)
                break;
              redo_softmax(c, j);
              redo = false;
            }
            pack_p<T, BN>(pa, sacc);
            r.next(sm.stages);
          }
          if (!redo)
            break;
          redo_softmax(c, j);
          pack_p<T, BN>(pa, sacc);
          r.next(sm.stages);
          ++j;
        }
        // The last P V alone, then the tile's O.
        mbar_wait(sm.v_full(rp().s), rp().use & 1);
        rescale_o();
        wgmma_fence();
        issue_pv<T, D, BN>(o, pa, sm, rp().s);
        wgmma_commit();
        // v13: the K/V tiles right of this warpgroup's diagonal: their turns and K slots now, in the
        // place of the Q K^T that is not issued, so the other consumers' turns are not held up by
        // this one's O; their V slots after it (the producer needs them only for the next tile's
        // second V).
        const int n_pass = pass_count<MODE>(a, c, wg, BN);
        RingPos rk = r;
        for (int j = 0; j < n_pass; ++j) {
          pass_k(a, sm, wg, rk);
          rk.next(sm.stages);
        }
        wgmma_wait<0>();
        fence_operands(o);
        fence_operands(pa);
        release_v(rp().s);
#ifdef FA3_TRACE
        if (tracer)
          trace_put(wg, items + 1, 5, trace_now());
#endif
        end_tile<T, D, BN, MODE>(a, sm, wg, c, o, m, l);
#ifdef FA3_TRACE
        if (tracer)
          if (unsigned long long *x = trace_slot(wg, items + 1)) {
            x[6] = trace_now();
            x[10] = c.tf[0];
            x[11] = c.tf[1];
            x[0] = trace_meta(c.w.q0, c.w.hb);
            x[1] = (unsigned long long)unsigned(c.w.n_tiles) | (unsigned long long)unsigned(c.w.part) << 32;
          }
        ++items;
#endif
        for (int j = 0; j < pass_count<MODE>(a, c, wg, BN); ++j) {
          pass_v(sm, r);
          r.next(sm.stages);
        }
#ifdef FA3_TRACE
        if (tracer)
          trace_put(wg, items + 1, 2, trace_now());
#endif
      } while (fetch_tile<T, D, BN, MODE>(a, sm, wg, ++q_use, c, r));
    }
  }
  // The last consumer opened consumer 0's turn after its last Q K^T (and at the start): consumer 0
  // takes that turn here, so every named barrier ends with as many arrivals as waits.
  if (pp && wg == 0)
    named_sync(kBarTurn0, 256);
  // The last O copies must have read the staging buffer before the CTA's shared memory goes.
  if (a.o_tma && threadIdx.x % 128 == 0)
    bulk_wait_all();
#ifdef FA3_TRACE
  if (tracer)
    if (unsigned long long *r = trace_slot(wg, 0))
      r[0] = t_begin, r[1] = trace_now(), r[2] = unsigned(items);
#endif
}

// A CTA per work tile (one_shot) or per resident slot (persistent, walking the work tiles):
// warpgroup 0 produces, warpgroups 1..consumers consume. WIDE = false: 1 or 2
// consumers (384 threads at most, consumers get 240 registers); WIDE = true (v3, head_dim 64): 3
// consumers, 512 threads, 24 x 128 + 160 x 384 = 64512 <= 65536 registers. MODE (v37,
// traits.hpp): the paths compiled in (all, or only non-causal, causal or stream-K's).
template <class T, int D, int BN, bool OVERLAP, bool WIDE, int MODE>
__global__ void __launch_bounds__(WIDE ? 512 : 384, 1)
    fa3_kernel(const __grid_constant__ KernelArgs a) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const int block_m = kRowsPerWarpgroup * a.consumers;
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const Smem<D, BN> sm(base, block_m, a.stages, a.o_tma != 0, a.q_bufs);
  if (threadIdx.x == 0) {
    for (int slot = 0; slot < a.q_bufs; ++slot) {
      mbar_init(sm.q_full(slot), 1);
      mbar_init(sm.q_empty(slot), 4 * a.consumers);
    }
    for (int s = 0; s < a.stages; ++s) {
      mbar_init(sm.k_full(s), 1);
      mbar_init(sm.v_full(s), 1);
      mbar_init(sm.k_empty(s), 4 * a.consumers);
      mbar_init(sm.v_empty(s), 4 * a.consumers);
    }
    mbar_fence_init();
  }
  __syncthreads();

  // Warp-uniform by construction (a broadcast), so the role branch is uniform for the compiler too.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (wg == 0) {
    regs_dealloc<kProducerRegs>();
    if (threadIdx.x == 0)
      producer<D, BN, MODE>(a, sm);
    return;
  }
  regs_alloc<WIDE ? kConsumerRegsWide : kConsumerRegs>();
  consumer<T, D, BN, OVERLAP, MODE>(a, sm, wg - 1);
}

// Experiment knobs that run the all-paths kernel (kModeAny, v37) instead of the problem's own:
// FLASHBENCH_FA3_ALL_PATHS=1 (the same-build ablation of v37-v38), and the exact-rescale ablation
// (FLASHBENCH_FA3_EXACT_RESCALE=1, launch_tile), which the non-causal kernels do not compile (v38).
inline bool all_paths_requested() {
  for (const char *knob : {"FLASHBENCH_FA3_ALL_PATHS", "FLASHBENCH_FA3_EXACT_RESCALE"})
    if (const char *e = std::getenv(knob); e && std::atoi(e) == 1)
      return true;
  return false;
}

// The instantiation of a tile that a problem runs with a scheduler (kernel_mode), or with
// `all_paths` the all-paths kernel, which every tile compiles (all_paths_requested).
using KernelPtr = void (*)(const KernelArgs);
template <class T, int D, int BN, bool OVERLAP, bool WIDE>
KernelPtr kernel_fn(const AttentionProblem &p, int scheduler, bool all_paths) {
  if constexpr (modes_compiled(D, BN)) {
    switch (all_paths ? kModeAny : kernel_mode(D, BN, p, scheduler)) {
    case kModePlain:
      return &fa3_kernel<T, D, BN, OVERLAP, WIDE, kModePlain>;
    case kModeCausal:
      return &fa3_kernel<T, D, BN, OVERLAP, WIDE, kModeCausal>;
    case kModeSplit:
      if constexpr (split_compiled(D))
        return &fa3_kernel<T, D, BN, OVERLAP, WIDE, kModeSplit>;
      break;
    default:
      break;
    }
  }
  return &fa3_kernel<T, D, BN, OVERLAP, WIDE, kModeAny>;
}
template <class T, int D, int BN, bool OVERLAP, bool WIDE>
const void *kernel_ptr(const AttentionProblem &p, int scheduler) {
  return reinterpret_cast<const void *>(
      kernel_fn<T, D, BN, OVERLAP, WIDE>(p, scheduler, all_paths_requested()));
}

// The device's L2 size, read once per process (the section size of the work order).
inline int64_t l2_bytes() {
  static const int64_t bytes = [] {
    int dev = 0, v = 0;
    FB_CUDA_CHECK(cudaGetDevice(&dev));
    FB_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev));
    return int64_t(v);
  }();
  return bytes;
}

// The device's SM count (kernels/common/sm_count.hpp, read once per process like l2_bytes), and the
// resident CTAs per SM of one instantiation at one shared-memory size, asked once per (kernel, size):
// launch_tile needs both on every launch (the persistent grid, the work order's sections), and a
// timed launch should not pay the driver's occupancy calculator each time.
using fb::kernels::sm_count;
inline int resident_per_sm(const void *kernel, int threads, int64_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void *, int, int64_t>, int> cache;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, threads, smem);
  if (const auto it = cache.find(key); it != cache.end())
    return it->second;
  int per_sm = 0;
  FB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads,
                                                              static_cast<size_t>(smem)));
  return cache[key] = per_sm;
}

template <class T, int D, int BN, bool OVERLAP, bool WIDE>
void launch_tile(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
                 cudaStream_t stream) {
  KernelArgs a{};
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  a.tm_q = make_tile_map(args.q, p.dtype, D, p.seqlen_q, p.heads_q, p.batch, qs, c.block_m);
  a.tm_k = make_tile_map(args.k, p.dtype, D, p.seqlen_kv, p.heads_kv, p.batch, ks, BN);
  a.tm_v = make_tile_map(args.v, p.dtype, D, p.seqlen_kv, p.heads_kv, p.batch, ks, BN);
  a.o_tma = o_staged(D, c) ? 1 : 0;
  a.q_bufs = q_buffers(D, c);
  // Experiment knob (NOTES.md, v5): FLASHBENCH_FA3_Q_BUFS=1 keeps one Q buffer (the ablation of the
  // second; the launch then asks for one Q tile less shared memory than launch_smem_bytes).
  if (const char *e = std::getenv("FLASHBENCH_FA3_Q_BUFS"); e && std::atoi(e) == 1)
    a.q_bufs = 1;
  // Lazy rescale (v6, softmax_tile): a row's offset moves only when its max passes it by more than 8
  // (log2 units), so P <= 256. Experiment knob: FLASHBENCH_FA3_EXACT_RESCALE=1 moves it on every new
  // max and rescales O after every tile, as v1-v5 did (the same-build ablation).
  a.rescale_slack = kRescaleSlack;
  if (const char *e = std::getenv("FLASHBENCH_FA3_EXACT_RESCALE"); e && std::atoi(e) == 1)
    a.rescale_slack = -INFINITY;
  // Experiment knob (v13): FLASHBENCH_FA3_WG_PASS=0 makes every warpgroup compute every K/V tile of
  // its work tile, those right of its diagonal included (fully masked), as v1-v12 did.
  a.wg_pass = 1;
  if (const char *e = std::getenv("FLASHBENCH_FA3_WG_PASS"); e && std::atoi(e) == 0)
    a.wg_pass = 0;
  // Experiment knob (v17): FLASHBENCH_FA3_HALF_DIAG=0 runs the exp2s of the half diagonal tile's
  // right half too.
  a.half_diag = 1;
  if (const char *e = std::getenv("FLASHBENCH_FA3_HALF_DIAG"); e && std::atoi(e) == 0)
    a.half_diag = 0;
  if (a.o_tma)
    a.tm_o = make_tile_map(args.o, p.dtype, D, p.seqlen_q, p.heads_q, p.batch, qs,
                           kRowsPerWarpgroup);
  a.o = args.o;
  a.lse = args.lse;
  a.o_batch = qs.batch, a.o_seq = qs.seq, a.o_head = qs.head;
  a.q = args.q;
  a.k = args.k;
  a.k_batch = ks.batch, a.k_seq = ks.seq, a.k_head = ks.head;
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.seqlen_kv = static_cast<int>(p.seqlen_kv);
  a.heads_q = static_cast<int>(p.heads_q);
  a.group = static_cast<int>(p.group_size());
  a.scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
  a.total_tiles = static_cast<int>(total_work_tiles(p, c));
  const KernelPtr kernel =
      kernel_fn<T, D, BN, OVERLAP, WIDE>(p, c.scheduler, all_paths_requested());
  const int64_t smem =
      launch_smem_bytes(D, c) - int64_t(q_buffers(D, c) - a.q_bufs) * 2 * D * c.block_m;
  FB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  const int threads = 128 * (1 + c.consumers);
  const int per_sm = resident_per_sm(reinterpret_cast<const void *>(kernel), threads, smem);
  const int64_t resident = persistent_grid(a.total_tiles, sm_count(), per_sm);
  // Experiment knob (v12): FLASHBENCH_FA3_SECTION_WAVES=x caps an L2 section at x waves of resident
  // CTAs' worth of work tiles instead of section_tile_cap(); x = 0: the half-L2 rule alone (v4-v11).
  int64_t section_cap = section_tile_cap(p, resident);
  if (const char *e = std::getenv("FLASHBENCH_FA3_SECTION_WAVES"))
    section_cap = static_cast<int64_t>(std::max(0.0, std::atof(e)) * double(resident));
  TileOrder order = tile_order(p, c.block_m, D, l2_bytes(), section_cap);
  // Experiment knob (NOTES.md, v4): FLASHBENCH_FA3_SECTIONS=n fixes the number of L2 sections (at
  // most one per GQA group; n = groups is close to the version-3 order: one group after another).
  if (const char *e = std::getenv("FLASHBENCH_FA3_SECTIONS"); e && std::atoi(e) > 0)
    order.sections = std::min(std::atoi(e), order.groups);
  a.order = TileDecoder(order);
  a.heads_q_div = fb::kernels::FastDiv(uint32_t(p.heads_q));
  a.stages_div = fb::kernels::FastDiv(uint32_t(c.stages));
  a.claims = nullptr;
  if (c.scheduler == kSchedDynamic || c.scheduler == kSchedStreamK) {
    if (args.semaphores == nullptr || args.semaphore_bytes < kDynamicSemaphoreBytes)
      throw std::invalid_argument("fa3_pipelined: scheduler dynamic needs " +
                                  std::to_string(kDynamicSemaphoreBytes) +
                                  " bytes of zeroed semaphores (LaunchArgs::semaphores)");
    a.claims = static_cast<int *>(args.semaphores);
  }
  a.stages = c.stages;
  a.consumers = c.consumers;
  a.pingpong = c.pingpong;
  a.causal = p.causal ? 1 : 0;

  int grid = persistent_sched(c) ? static_cast<int>(resident) : a.total_tiles;
  a.split = TailSplit{};
  a.split.first = a.total_tiles;
  a.partials = nullptr;
  a.split_flags = nullptr;
  if (c.scheduler == kSchedStreamK) {
    if (p.causal)
      throw std::invalid_argument("fa3_pipelined: scheduler stream_k is for non-causal problems "
                                  "(equal work tiles); use dynamic for causal");
    const int64_t ws = split_workspace_bytes(D, c.consumers);
    const size_t sem = split_semaphore_bytes(c.consumers);
    if (args.workspace == nullptr || int64_t(args.workspace_bytes) < ws ||
        args.semaphores == nullptr || args.semaphore_bytes < sem)
      throw std::invalid_argument("fa3_pipelined: scheduler stream_k needs " + std::to_string(ws) +
                                  " bytes of workspace and " + std::to_string(sem) +
                                  " bytes of zeroed semaphores");
    // Experiment knob (v15): FLASHBENCH_FA3_SPLIT_MIN=n, the shortest chunk of the tail in K/V
    // tiles (kSplitMinIters); a large n turns the split off (stream_k is then dynamic).
    int64_t min_iters = kSplitMinIters;
    if (const char *e = std::getenv("FLASHBENCH_FA3_SPLIT_MIN"); e && std::atoi(e) > 0)
      min_iters = std::atoi(e);
    // The tail may spread over every resident slot, more CTAs than work tiles included: as many
    // chunks as slots (at most), and the grid holds that many CTAs.
    const int64_t slots = int64_t(sm_count()) * std::max(1, per_sm);
    a.split = tail_split(a.total_tiles, slots,
                         kv_tiles_for(0, c.block_m, BN, p.seqlen_q, p.seqlen_kv, false), min_iters);
    grid = std::max(grid, a.split.ctas);
    a.partials = static_cast<float *>(args.workspace);
    a.split_flags = static_cast<int *>(args.semaphores) + 2; // after the claim counters
  }
  kernel<<<grid, threads, static_cast<size_t>(smem), stream>>>(a);
  FB_CHECK_LAUNCH();
#ifdef FA3_TRACE
  trace_dump(grid, stream);
#endif
}

} // namespace detail

// The compiled instantiations of one (T, D) slice: block_n x intra_wg_overlap x (3 consumers or
// not), as tile_compiled() (traits.hpp) allows; block_m, stages, consumers 1-2, pingpong and the
// scheduler are run-time parameters. visit_tile calls f(Tile<BN, OV, W>{}) for the instantiation a
// config needs and returns its result, or R{} when none is compiled.
template <int BN, bool OV, bool W> struct Tile {
  static constexpr int block_n = BN;
  static constexpr bool overlap = OV, wide = W;
};
template <int D, class R, class F> R visit_tile(const Params &c, F &&f) {
  const bool ov = c.intra_overlap != 0, w = c.consumers == 3;
  R r{};
  auto try_one = [&](auto tile) {
    using X = decltype(tile);
    if constexpr (tile_compiled(D, X::block_n, X::wide))
      if (c.block_n == X::block_n && ov == X::overlap && w == X::wide)
        r = f(tile);
  };
  try_one(Tile<64, false, false>{});
  try_one(Tile<64, true, false>{});
  try_one(Tile<128, false, false>{});
  try_one(Tile<128, true, false>{});
  try_one(Tile<192, false, false>{});
  try_one(Tile<192, true, false>{});
  try_one(Tile<64, false, true>{});
  try_one(Tile<64, true, true>{});
  try_one(Tile<128, false, true>{});
  try_one(Tile<128, true, true>{});
  return r;
}
template <class T, int D> LaunchFn pick_launch(const Params &c) {
  return visit_tile<D, LaunchFn>(c, [](auto tile) -> LaunchFn {
    using X = decltype(tile);
    return &detail::launch_tile<T, D, X::block_n, X::overlap, X::wide>;
  });
}
template <class T, int D> KernelFn pick_kernel(const Params &c) {
  return visit_tile<D, KernelFn>(c, [](auto tile) -> KernelFn {
    using X = decltype(tile);
    return &detail::kernel_ptr<T, D, X::block_n, X::overlap, X::wide>;
  });
}

} // namespace fb::fa3
