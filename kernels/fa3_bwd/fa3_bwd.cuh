// FA3-style attention backward for Hopper (sm_90a): TMA loads into an mbarrier ring, WGMMA for the five
// products, a producer warpgroup and two consumer warpgroups with setmaxnreg. Three kernels:
//  1. preprocess (kernels/common/bwd_rows.cuh): D = rowsum(dO∘O), the base-2 LSE, the zeroed dQ accumulator.
//  2. main: one CTA per (column block of 128 keys, kv head, batch), in the order of grid_order (traits.hpp).
//     K and V stay in shared memory and dK, dV in registers for the CTA's life, across every row block it visits
//     and every query head of its GQA group, so dK and dV are written once with no atomics. Consumer warpgroup w
//     owns keys [64w, 64w + 64) of the block. The producer warpgroup's warp 0 issues the TMA loads of Q and dO,
//     warp 1 adds the dQ partials (dq_add bulk), warp 2 copies the rows' LSE₂ and D. Per row block (block_m query
//     rows), with the scores transposed (keys as rows) so that Pᵀ and dSᵀ come out of the accumulators in the
//     layout of a register A operand:
//       Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ (SS WGMMA, both from shared memory)
//       Pᵀ = exp2(Sᵀ·scale·log2e − LSE₂) (masked: 0); dV += Pᵀ·dO (RS WGMMA: Pᵀ from registers)
//       dSᵀ = Pᵀ∘(dPᵀ − D); dS to shared memory (stmatrix.trans: queries as rows), both warpgroups' halves
//       dQ_partial = dS·K (SS WGMMA, K as an MN-major B), split between the warpgroups by columns (64-row blocks)
//       or by rows (128-row blocks, head_dim 64); at 80-row blocks transposed, dQᵀ = Kᵀ·dSᵀ (SS WGMMA, K as an
//       MN-major A), each warpgroup 64 head_dim columns. Then dK += dSᵀ·Q (RS WGMMA), which runs while the dQ
//       partial is handed on:
//       dq_add bulk: stored to shared memory in the accumulator's tile order (DqTileOrder), from where warp 1
//       adds the whole tile with one bulk reduce-add (cp.reduce.async.bulk) while the consumers go on (at 80
//       rows the order is dQᵀ's fragments: pairs of rows adjacent). Two buffers where they fit, so a consumer
//       waits only if the reduce of two row blocks back has not been read yet.
//       dq_add red: each consumer thread adds its fragments with red.global.add.v4 (512 consecutive bytes a
//       warp, in the same order).
//     dS has two buffers, so one barrier of the two consumers per row block (dS written) is all they share: a
//     warpgroup passing the barrier of row block i knows that the other finished row block i − 1, whose dQ
//     product read the buffer that row block i + 1 will write.
//     deterministic (dq_add bulk): warp 1 adds a row block's dQ partial when its counter (semaphores) says that
//     every column block to the right has added its own, waits for the add to complete, then counts this one
//     in; column block 0 resets it. A causal diagonal column block reaches a row block first, and CTAs are
//     launched rightmost column first (grid_order), so a CTA only ever waits on one launched before it.
//     Epilogue: dK (times scale) and dV through the K and V tiles' shared memory and TMA stores.
//  3. convert (bwd_rows.cuh): dQ = scale · accumulator, reading it in DqTileOrder.
// scale is applied once: to dK in the epilogue and to dQ in convert.
#pragma once

#include "kernels/common/bwd_rows.cuh"
#include "kernels/common/hopper/bwd_n80.cuh"
#include "kernels/common/hopper/epilogue.cuh"
#include "kernels/common/hopper/ring.cuh"
#include "kernels/common/hopper/sync.cuh"
#include "kernels/common/hopper/tensor_map.hpp"
#include "kernels/common/hopper/tma.cuh"
#include "kernels/common/hopper/warpgroup.cuh"
#include "kernels/common/hopper/wgmma.cuh"
#include "kernels/common/hopper/wgmma_f16.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/sm_count.hpp"
#include "kernels/fa3_bwd/traits.hpp"

#include "flashbench/check.hpp"
#include "flashbench/device.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace fb::fa3_bwd {
namespace detail {

using namespace fb::hopper;

struct KernelArgs {
  CUtensorMap tm_q, tm_do, tm_k, tm_v; // loads: Q, dO (block_m-row boxes), K, V (128-row boxes)
  CUtensorMap tm_dk, tm_dv;            // stores: 64-row boxes, one per consumer warpgroup
  const float *lse2, *delta;           // workspace rows (kernels/common/bwd.hpp)
  float *dq_acc;
  // The semaphores: deterministic, one counter per (batch, query head, row block); split_tail, one per split
  // column block, then the split blocks' fp32 dK and dV sums (split_acc; traits.hpp, semaphore_count). CTAs below
  // split_full run a whole column block, the rest split_pieces pieces of one (traits.hpp, tail_split).
  int *sem;
  float *split_acc;
  int split_full, split_pieces;
  int tail_rows; // row_tail: the rows the last row block's products cover (traits.hpp tail_rows); 0: all block_m
  int seqlen_q, seqlen_kv, rows_pad;
  int heads_q, heads_kv, group;
  int n_row_blocks, n_col_blocks, bh_count; // bh_count = heads_kv x batch
  float scale, scale_log2;
  int stages, order, causal, deterministic, dq_add;
  int sections; // order sections: runs of (batch, kv head) pairs (traits.hpp section_count)
};

// Named barriers (0 is __syncthreads): both consumers; each consumer's own (epilogue staging); per LSE₂/D buffer,
// the row loader and both consumers (kRowsBuffers, row_loader).
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr int kBarDsReady = 1;
constexpr int kBarWg0 = 2;
constexpr int kBarRows0 = kBarWg0 + kConsumers;
constexpr int kRowThreads = kConsumerThreads + 32; // the consumers and the row loader's warp

// The LSE₂/D buffer r's barrier. barrier.sync without .aligned: the row loader and the consumers reach it from
// different instructions, which bar.sync (barrier.sync.aligned) does not allow: every thread of an aligned
// barrier must execute the same instruction (PTX ISA), and synccheck reports the mix as divergent threads.
__device__ __forceinline__ void rows_sync(int r) {
  asm volatile("barrier.sync %0, %1;" ::"r"(kBarRows0 + r), "r"(kRowThreads) : "memory");
}

// LSE₂ and D of a row block sit in a buffer in the order the consumers read them: a thread's rows 8i + 2c,
// 8i + 2c + 1, 8i + 8 + 2c and 8i + 9 + 2c (c = lane % 4, i even) side by side, one 16-byte load for two of its
// accumulator fragments' rows where 8-byte loads took two. Row q = 16k + 8h + 2c + e sits at 16k + 4c + 2h + e; a
// warp's loads of one such quad fall on four consecutive 16-byte units (one wavefront), the row loader's pair stores
// stay pairs.
__device__ __forceinline__ int rows_pos(int q) {
  return (q & ~15) + 4 * ((q >> 1) & 3) + 2 * ((q >> 3) & 1) + (q & 1);
}
__device__ __forceinline__ float4 ld_shared_f4(uint32_t addr) {
  const int4 v = ld_shared_v4(addr);
  return make_float4(__int_as_float(v.x), __int_as_float(v.y), __int_as_float(v.z),
                     __int_as_float(v.w));
}

// The shared-memory map of a launch (traits.hpp smem_map), as 32-bit shared addresses.
template <int D, int BM> struct Smem {
  static constexpr int dq_bufs = dq_buffers(D, BM);
  static constexpr uint32_t dq_bytes = BM * D * 4;
  uint32_t k, v, slots, slot_bytes, ds, ds_bytes, dq, rows, rows_bytes, bars;
  uint32_t q_off, dout_off; // inside a slot
  int stages;
  __device__ Smem(uint32_t base, int stages_, int dq_add) : stages(stages_) {
    const SmemMap m = smem_map(D, BM, stages_, dq_add);
    k = base + uint32_t(m.k), v = base + uint32_t(m.v), slots = base + uint32_t(m.slots);
    slot_bytes = uint32_t(m.slot_bytes), ds = base + uint32_t(m.ds),
    ds_bytes = uint32_t(m.ds_bytes);
    dq = base + uint32_t(m.dq);
    rows = base + uint32_t(m.rows), rows_bytes = uint32_t(m.rows_bytes);
    bars = base + uint32_t(m.bars);
    q_off = uint32_t(m.q), dout_off = uint32_t(m.dout);
  }
  __device__ uint32_t slot(int s) const { return slots + uint32_t(s) * slot_bytes; }
  __device__ uint32_t lse2(int s) const { return rows + uint32_t(s) * rows_bytes; }
  __device__ uint32_t delta(int s) const { return lse2(s) + rows_bytes / 2; }
  __device__ uint32_t ds_buf(int i) const { return ds + uint32_t(i) * ds_bytes; }
  __device__ uint32_t kv_full() const { return bars; }
  __device__ uint32_t full(int s) const { return bars + 8u * uint32_t(1 + s); }
  __device__ uint32_t empty(int s) const { return bars + 8u * uint32_t(1 + kMaxStages + s); }
  // Row block number `it` of the CTA uses dQ buffer it % dq_bufs, for the (it / dq_bufs)-th time; consumer wg's
  // piece is half h = wg of it, with its own full and empty barriers.
  __device__ uint32_t dq_buf(int it) const { return dq + uint32_t(it % dq_bufs) * dq_bytes; }
  __device__ uint32_t dq_half(int it, int h) const {
    return dq_buf(it) + uint32_t(h) * (dq_bytes / 2);
  }
  __device__ uint32_t dq_full(int it, int h) const {
    return bars + 8u * uint32_t(1 + 2 * kMaxStages + kConsumers * (it % dq_bufs) + h);
  }
  __device__ uint32_t dq_empty(int it, int h) const {
    return dq_full(it, h) + 8u * kMaxDqBuffers * kConsumers;
  }
  __device__ uint32_t dq_phase(int it) const { return uint32_t(it / dq_bufs) & 1u; }
};

// The work of one CTA: its column block, kv head and batch entry, and the row blocks [first, end) it visits (for
// each query head of the group in turn). Under split_tail a CTA past split_full is one piece of a split column
// block: the piece's share of the block's row blocks, and `slot` the block's index in the sums (-1: not split).
struct Work {
  int col, hkv, b, first, end, slot;
};
template <int BM> __device__ __forceinline__ Work work_of(const KernelArgs &a) {
  int tile = int(blockIdx.x), piece = 0, pieces = 1, slot = -1;
  if (tile >= a.split_full) {
    const int j = tile - a.split_full;
    pieces = a.split_pieces, slot = j / pieces, piece = j - slot * pieces;
    tile = a.split_full + slot;
  }
  const GridSlot g = grid_order_in<int>(tile, a.n_col_blocks, a.bh_count, a.order,
                                        a.deterministic != 0, a.sections);
  const RowRange r = row_blocks_for(g.col, BM, kBlockN, a.seqlen_q, a.seqlen_kv, a.causal != 0);
  const int n = int(r.end - r.first);
  return {int(g.col),
          int(g.bh % a.heads_kv),
          int(g.bh / a.heads_kv),
          int(r.first) + piece * n / pieces,
          int(r.first) + (piece + 1) * n / pieces,
          slot};
}

// ---- producer: one thread issues every load
template <int D, int BM>
__device__ __forceinline__ void producer(const KernelArgs &a, const Smem<D, BM> &sm,
                                         const Work &w) {
  constexpr uint32_t kKvChunk = kBlockN * 128, kRowChunk = BM * 128;
  tma_prefetch_desc(&a.tm_q);
  tma_prefetch_desc(&a.tm_do);
  mbar_arrive_expect_tx(sm.kv_full(), 2u * kBlockN * D * 2);
#pragma unroll
  for (int c = 0; c < D / 64; ++c) {
    tma_load_4d(sm.k + c * kKvChunk, &a.tm_k, sm.kv_full(), c * 64, w.col * kBlockN, w.hkv, w.b);
    tma_load_4d(sm.v + c * kKvChunk, &a.tm_v, sm.kv_full(), c * 64, w.col * kBlockN, w.hkv, w.b);
  }
  RingPos ring;
  for (int g = 0; g < a.group; ++g) {
    const int hq = w.hkv * a.group + g;
    for (int mb = w.first; mb < w.end; ++mb, ring.next(sm.stages)) {
      const int s = ring.s;
      if (ring.use > 0)
        mbar_wait(sm.empty(s), (ring.use - 1) & 1);
      const uint32_t slot = sm.slot(s), bar = sm.full(s);
      mbar_arrive_expect_tx(bar, 2u * BM * D * 2);
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        tma_load_4d(slot + sm.q_off + c * kRowChunk, &a.tm_q, bar, c * 64, mb * BM, hq, w.b);
        tma_load_4d(slot + sm.dout_off + c * kRowChunk, &a.tm_do, bar, c * 64, mb * BM, hq, w.b);
      }
    }
  }
}

// ---- one producer warp copies each row block's LSE₂ and D (float pairs: lane i the i-th, the (i + 32)-th, ..., at
// rows_pos) into buffer it % 2 and meets both consumers at that buffer's named barrier (rows_sync on both sides), which
// they pass at the start of row block it. Its write of row block it + 2 into the same buffer comes after the barrier of
// row block it + 1, which the consumers pass only when done with row block it: two buffers and one barrier each order
// both the reads after the writes and the next writes after the reads. A named barrier rather than the stage's
// mbarriers because compute-sanitizer's racecheck orders shared-memory accesses by bar.sync alone (it reports mbarrier-
// or bar.arrive-ordered hand-overs as races); the barrier also keeps the loader one row block ahead, so its loads from
// L2 are off the consumers' path.
template <int D, int BM>
__device__ __forceinline__ void row_loader(const KernelArgs &a, const Smem<D, BM> &sm,
                                           const Work &w, int lane) {
  static_assert(BM % 16 == 0, "rows_pos: whole 16-row groups");
  // Lane's pair k sits 64 rows (256 bytes) past pair 0's place: rows_pos(q + 64) = rows_pos(q) + 64.
  const uint32_t at0 = 4u * uint32_t(rows_pos(2 * lane));
  int it = 0;
#pragma unroll 1 // the producer warpgroup's 24 registers
  for (int g = 0; g < a.group; ++g) {
    const int hq = w.hkv * a.group + g;
#pragma unroll 1
    for (int mb = w.first; mb < w.end; ++mb, ++it) {
      const int r = it % kRowsBuffers;
      const int64_t row = (int64_t(w.b) * a.heads_q + hq) * a.rows_pad + int64_t(mb) * BM;
#pragma unroll
      for (int k = 0; k < (BM / 2 + 31) / 32; ++k) {
        const int i = lane + 32 * k; // rows 2i and 2i + 1
        if (BM % 64 == 0 || i < BM / 2) {
          const uint32_t at = at0 + 256u * uint32_t(k);
          st_shared_f2(sm.lse2(r) + at,
                       __ldg(reinterpret_cast<const float2 *>(a.lse2 + row + 2 * i)));
          st_shared_f2(sm.delta(r) + at,
                       __ldg(reinterpret_cast<const float2 *>(a.delta + row + 2 * i)));
        }
      }
      rows_sync(r);
    }
  }
}

// deterministic: a counter bumped with release semantics at GPU scope (no returned value to wait for).
__device__ __forceinline__ void red_release_gpu_add(int *p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The accumulator tile of (batch, query head hq, row block mb): block_m x D fp32, in DqTileOrder.
template <int D, int BM>
__device__ __forceinline__ float *dq_tile(const KernelArgs &a, const Work &w, int hq, int mb) {
  return a.dq_acc + ((int64_t(w.b) * a.heads_q + hq) * a.rows_pad + int64_t(mb) * BM) * D;
}

// ---- dq_add bulk: one thread adds each consumer's piece of a row block's dQ partial from shared memory (that
// consumer's dq_full) with a bulk reduce-add as soon as it is there, and frees the piece (its dq_empty) once the
// engine has read it, so that a consumer waits only for its own piece of two row blocks back. deterministic: it
// first waits until every column block to the right has added its partial to this row block (its counter), and
// counts itself in once both of its own adds are complete; column block 0 resets the counter.
template <int D, int BM>
__device__ __forceinline__ void dq_writer(const KernelArgs &a, const Smem<D, BM> &sm,
                                          const Work &w) {
  int it = 0;
  for (int g = 0; g < a.group; ++g) {
    const int hq = w.hkv * a.group + g;
    for (int mb = w.first; mb < w.end; ++mb, ++it) {
      mbar_wait(sm.dq_full(it, 0), sm.dq_phase(it));
      int *ctr = nullptr;
      if (a.deterministic) {
        ctr = a.sem + (int64_t(w.b) * a.heads_q + hq) * a.n_row_blocks + mb;
        const int before =
            int(col_blocks_for(mb, BM, kBlockN, a.seqlen_q, a.seqlen_kv, a.causal != 0)) - 1 -
            w.col;
        while (ld_acquire_gpu(ctr) != before)
          __nanosleep(32);
        fence_proxy_async_global(); // the earlier column blocks' adds before this one
      }
      constexpr uint32_t kHalf = Smem<D, BM>::dq_bytes / 2;
      // row_tail: a partial last block's pieces are their first tail_rows / 8 fragments (consumer).
      const uint32_t bytes =
          a.tail_rows && mb == a.n_row_blocks - 1 ? uint32_t(a.tail_rows) * (kHalf / BM) : kHalf;
      float *const tile = dq_tile<D, BM>(a, w, hq, mb);
      bulk_reduce_add_f32(tile, sm.dq_half(it, 0), bytes);
      bulk_commit();
      if (!a.deterministic) { // piece 0 free once read, whether or not piece 1 is there yet
        bulk_wait_read_all();
        mbar_arrive(sm.dq_empty(it, 0));
      }
      mbar_wait(sm.dq_full(it, 1), sm.dq_phase(it));
      bulk_reduce_add_f32(tile + kHalf / 4, sm.dq_half(it, 1), bytes);
      bulk_commit();
      if (a.deterministic) {
        bulk_wait_all(); // complete in global memory before the counter says so
        // The adds (async proxy) ordered before this thread's generic accesses, then a release at GPU scope: the
        // next column block's writer acquires the counter and fences the proxies the other way before its adds.
        // A release, not __threadfence() (fence.sc) and a returning atomic: the writer does not wait for either.
        fence_proxy_async_global();
        if (w.col == 0)
          st_release_gpu(ctr, 0); // the last of this row block: leave the counter as it was found
        else
          red_release_gpu_add(ctr, 1);
        mbar_arrive(sm.dq_empty(it, 0));
      } else {
        bulk_wait_read_all();
      }
      mbar_arrive(sm.dq_empty(it, 1));
    }
  }
  bulk_wait_all();
}

// ---- consumer pieces
// acc (m64 x N accumulator, rows = this warpgroup's 64 keys): acc[4i + e] is key row 16·warp + lane/4 + 8·(e/2),
// column (query row of the block) 8i + 2·(lane%4) + e%2.

// Packs k-step kt of an m64 x N accumulator (columns [16kt, 16kt + 16)) into one A fragment (bf16/fp16), in the
// m16n8k16 A layout of the thread's warp's 16 rows; pack_a packs all N/16 k-steps.
template <class T, int N>
__device__ __forceinline__ void pack_step(uint32_t (&pa)[4], const float (&acc)[N / 2], int kt) {
#pragma unroll
  for (int r = 0; r < 4; ++r)
    pa[r] = fb::kernels::Mma<T>::pack(acc[8 * kt + 2 * r], acc[8 * kt + 2 * r + 1]);
}
template <class T, int N>
__device__ __forceinline__ void pack_a(uint32_t (&pa)[N / 16][4], const float (&acc)[N / 2]) {
#pragma unroll
  for (int kt = 0; kt < N / 16; ++kt)
    pack_step<T, N>(pa[kt], acc, kt);
}

// C[64 x R] = A·Bᵀ over head_dim: A = 64 rows of a [128][D] key tile (this warpgroup's), B = the first R rows of a
// [block_m][D] row tile; both K-major in 128B-swizzled column chunks of 64. R < block_m: a partial last row block
// (row_tail), in the same shared-memory layout.
template <class T, int D, int BM, int R = BM>
__device__ __forceinline__ void issue_scores(float (&c)[R / 2], uint32_t key_tile, int wg,
                                             uint32_t row_tile) {
  constexpr uint32_t kKvChunk16 = kBlockN * 128 / 16, kRowChunk = BM * 128;
  const DescBase da = desc_base(key_tile + uint32_t(wg) * kKeysPerWarpgroup * 128, 16);
  const DescBase db = desc_base(row_tile, 16);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss(c, da.plus16((kk / 4) * kKvChunk16).at((kk % 4) * 32),
             db.at((kk / 4) * kRowChunk + (kk % 4) * 32), kk > 0 ? 1 : 0,
             typename TypeOps<T>::Tag{}, IntC<R>{});
}

// acc[64 x D] += A-fragments (64 x R, registers) · B, B the first R rows of a [block_m][D] row tile as an MN-major
// operand (K = rows).
template <class T, int D, int BM, int R = BM>
__device__ __forceinline__ void issue_grad(float (&acc)[D / 2], const uint32_t (&pa)[R / 16][4],
                                           uint32_t row_tile) {
  const DescBase db = desc_base(row_tile, BM * 128);
#pragma unroll
  for (int kt = 0; kt < R / 16; ++kt)
    wgmma_rs(acc, pa[kt], db.at(kt * 16 * 128), typename TypeOps<T>::Tag{}, IntC<D>{});
}

// This warpgroup's dQ piece [64 x DQN] over the 128 keys (DqTileOrder), from the dS buffer ([block_m][128 keys],
// two 64-key chunks) and the K tile:
//  - split by columns (64 rows): dS · K, rows [0, 64) and columns [DQN·wg, DQN·wg + DQN) (DQN = D/2; head_dim
//    128: the warpgroup's 64-column chunk of K); A the dS buffer, B the K tile as an MN-major operand;
//  - split by rows (128 rows): the same product for rows [64·wg, 64·wg + 64) and every column (DQN = D);
//  - transposed (80 rows): dQᵀ = Kᵀ · dSᵀ, head_dim columns [64·wg, 64·wg + 64) (the M) by the block's rows
//    (DQN = BM, or the R rows of a partial last block); A the warpgroup's 64-column chunk of the K tile as an
//    MN-major operand, B the dS buffer (K-major: keys contiguous along each query row).
template <class T, int D, int BM, int DQN>
__device__ __forceinline__ void issue_dq(float (&dq)[DQN / 2], uint32_t ds_buf, uint32_t k_tile,
                                         int wg) {
  constexpr bool by_rows = dq_split(BM) == DqSplit::rows;
  constexpr uint32_t kDsChunk16 = BM * 128 / 16, kKvChunk = kBlockN * 128;
  if constexpr (dq_split(BM) == DqSplit::transposed) {
    static_assert(D == 128 && DQN <= BM && DQN % 16 == 0,
                  "a warpgroup's 64 head_dim columns are one 64-column chunk of K");
    const DescBase da = desc_base(k_tile + uint32_t(wg) * kKvChunk, kKvChunk),
                   db = desc_base(ds_buf, 16);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      wgmma_ss_ta(dq, da.at(kk * 16 * 128), db.plus16((kk / 4) * kDsChunk16).at((kk % 4) * 32),
                  kk > 0 ? 1 : 0, typename TypeOps<T>::Tag{}, IntC<DQN>{});
  } else {
    const int c0 = by_rows ? 0 : wg * DQN;
    const uint32_t a_base = ds_buf + (by_rows ? uint32_t(wg) * 64 * 128 : 0u);
    const uint32_t b_base = k_tile + uint32_t(c0 / 64) * kKvChunk + uint32_t(c0 % 64) * 2;
    const DescBase da = desc_base(a_base, 16), db = desc_base(b_base, kKvChunk);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      wgmma_ss_tb(dq, da.plus16((kk / 4) * kDsChunk16).at((kk % 4) * 32), db.at(kk * 16 * 128),
                  kk > 0 ? 1 : 0, typename TypeOps<T>::Tag{}, IntC<DQN>{});
  }
}

// This warpgroup's dSᵀ (packed as A fragments) into its 64-key chunk of the dS buffer, transposed: row q of the
// chunk holds keys [0, 64) of query row q, 16-byte units XOR-swizzled by q % 8 (the 128B swizzle WGMMA reads).
template <int BM, int R = BM>
__device__ __forceinline__ void store_ds(uint32_t ds_buf, const uint32_t (&dsa)[R / 16][4], int wg,
                                         int warp, int lane) {
  const uint32_t chunk = ds_buf + uint32_t(wg) * BM * 128;
  const int j = lane / 8, r = lane % 8;
  const uint32_t unit = uint32_t(2 * warp + j % 2); // 8 keys: 16·warp + 8·(j % 2)
#pragma unroll
  for (int kt = 0; kt < R / 16; ++kt) {
    const int q = 16 * kt + 8 * (j / 2) + r; // matrix j: columns 8·(2kt + j/2), key half j % 2
    stmatrix_x4_trans(chunk + uint32_t(q) * 128 + ((unit ^ uint32_t(r)) << 4), dsa[kt][0],
                      dsa[kt][1], dsa[kt][2], dsa[kt][3]);
  }
}

// A warpgroup's m64 x N fp32 accumulator added to global memory in fragment order (thread t's fragment j is float4
// 128j + t) with 16-byte vector reductions, 512 consecutive bytes a warp: a dQ partial into its piece of the
// accumulator tile (DqTileOrder), and under split_tail a piece's dK and dV into the split block's sums.
template <int N>
__device__ __forceinline__ void add_frags_red(float *dst, const float (&acc)[N / 2], int t) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst + (128 * j + t) * 4),
                 "f"(acc[4 * j]), "f"(acc[4 * j + 1]), "f"(acc[4 * j + 2]), "f"(acc[4 * j + 3])
                 : "memory");
}
// The same partial to its half of the shared dQ buffer, in the same order (conflict-free 16-byte stores).
template <int N>
__device__ __forceinline__ void store_dq(uint32_t half, const float (&dq)[N / 2], int t) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
    st_shared_v4(half + uint32_t(128 * j + t) * 16,
                 make_int4(__float_as_int(dq[4 * j]), __float_as_int(dq[4 * j + 1]),
                           __float_as_int(dq[4 * j + 2]), __float_as_int(dq[4 * j + 3])));
}

// bar.sync of `threads` threads at barrier `id` that also returns whether any of them passed `pred` (bar.red.or):
// one thread's answer handed to the others without a shared-memory word.
__device__ __forceinline__ bool named_sync_any(int id, int threads, bool pred) {
  uint32_t any;
  asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n"
               " bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}"
               : "=r"(any)
               : "r"(uint32_t(pred)), "r"(id), "r"(threads)
               : "memory");
  return any != 0;
}

// split_tail: this piece's dK and dV added to its column block's fp32 sums (this warpgroup's fragments, thread t's
// fragment j at float4 128j + t, add_frags_red's order). The last piece of the block to finish (its counter)
// takes the sums back into dk and dv, clears them and its counter (the semaphores' zero between launches) and
// returns true: it writes the block's dK and dV. Every thread fences its adds before the counter moves, and the
// last piece fences after reading the counter, before it reads the sums (from L2: .cg).
template <int D>
__device__ __forceinline__ bool merge_split(const KernelArgs &a, const Work &w, int wg,
                                            float (&dk)[D / 2], float (&dv)[D / 2]) {
  const int t = int(kernels::bwd::fresh_tid() % 128);
  float4 *const sum_k = reinterpret_cast<float4 *>(
      a.split_acc + (int64_t(w.slot) * kBlockN + int64_t(wg) * kKeysPerWarpgroup) * 2 * D);
  float4 *const sum_v = sum_k + kKeysPerWarpgroup * D / 4;
  add_frags_red<D>(reinterpret_cast<float *>(sum_k), dk, t);
  add_frags_red<D>(reinterpret_cast<float *>(sum_v), dv, t);
  __threadfence();
  named_sync(kBarDsReady, kConsumerThreads);
  bool last = false;
  if (threadIdx.x == 128)
    last = atomicAdd(a.sem + w.slot, 1) == a.split_pieces - 1;
  if (!named_sync_any(kBarDsReady, kConsumerThreads, last))
    return false;
  __threadfence();
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    const float4 k4 = __ldcg(sum_k + 128 * j + t), v4 = __ldcg(sum_v + 128 * j + t);
    dk[4 * j] = k4.x, dk[4 * j + 1] = k4.y, dk[4 * j + 2] = k4.z, dk[4 * j + 3] = k4.w;
    dv[4 * j] = v4.x, dv[4 * j + 1] = v4.y, dv[4 * j + 2] = v4.z, dv[4 * j + 3] = v4.w;
    __stcg(sum_k + 128 * j + t, zero);
    __stcg(sum_v + 128 * j + t, zero);
  }
  if (threadIdx.x == 128)
    a.sem[w.slot] = 0;
  return true;
}

// row_tail: the partial last row block mb of query head hq (the CTA's it-th, in ring slot s of parity ph) over its
// first R rows, its valid rows rounded up to 16 (traits.hpp, tail_rows), where a whole block is 80.
template <class T, int D, int BM, int R>
__device__ __forceinline__ void
partial_block(const KernelArgs &a, const Smem<D, BM> &sm, const Work &w, int wg, int hq, int mb,
              int it, int s, uint32_t ph, int t0, int off, float (&dk)[D / 2], float (&dv)[D / 2]) {
  constexpr int DQN = dq_piece_n(D, BM); // the N of this warpgroup's dQ piece
  constexpr bool kDqT = dq_split(BM) == DqSplit::transposed;
  // 64-row blocks issue dV's product as soon as Pᵀ is packed, under dPᵀ's wait and dSᵀ's arithmetic; 80- and
  // 128-row blocks only once dSᵀ is packed too, so that the fp32 Sᵀ and dPᵀ (40 + 40 or 64 + 64 registers) are
  // dead by the time the packed Pᵀ and dSᵀ must stay live for their products (traits.hpp, block_m_compiled).
  constexpr bool kDvEarly = BM == 64;
#include "kernels/fa3_bwd/row_block.cuh"
}

template <class T, int D, int BM>
__device__ __forceinline__ void consumer(const KernelArgs &a, const Smem<D, BM> &sm, const Work &w,
                                         int wg) {
  constexpr bool kDqT = dq_split(BM) == DqSplit::transposed;
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i)
    dk[i] = 0.f, dv[i] = 0.f;
  const int off = a.seqlen_kv - a.seqlen_q; // causal: row q sees keys <= q + off
  mbar_wait(sm.kv_full(), 0);
  const int t0 = int(threadIdx.x) % 128;

  int it = 0;
  RingPos ring;
  // row_tail: the partial last row block apart (partial_block), over the fewest 16-row steps that cover it; its
  // index is past every whole block's, so the loop over whole blocks stops at it.
  const int tail = kDqT ? a.tail_rows : 0;
  const int whole_end = tail ? a.n_row_blocks - 1 : w.end;
  for (int g = 0; g < a.group; ++g) {
    const int hq = w.hkv * a.group + g;
    const int end = min(w.end, whole_end);
    for (int mb = w.first; mb < end; ++mb, ++it, ring.next(sm.stages)) {
      // The body in place, not a call: row_block.cuh says why.
      constexpr int R = BM;
      constexpr int DQN = dq_piece_n(D, BM);
      constexpr bool kDvEarly = BM == 64;
      const int s = ring.s;
      const uint32_t ph = uint32_t(ring.use & 1);
#include "kernels/fa3_bwd/row_block.cuh"
    }
    if constexpr (kDqT) {
      if (end < w.end) {
        const auto run = [&](auto rows) {
          partial_block<T, D, BM, decltype(rows)::value>(a, sm, w, wg, hq, end, it, ring.s,
                                                         uint32_t(ring.use & 1), t0, off, dk, dv);
        };
        if (tail == 16)
          run(std::integral_constant<int, 16>{});
        else if (tail == 32)
          run(std::integral_constant<int, 32>{});
        else if (tail == 48)
          run(std::integral_constant<int, 48>{});
        else
          run(std::integral_constant<int, 64>{});
        ++it; // the next query head's row blocks follow
        ring.next(sm.stages);
      }
    }
  }

  // Epilogue: both consumers are done with K and V (their last dQ and dP products have retired) before either
  // overwrites its half of the tiles with dK or dV.
  named_sync(kBarDsReady, kConsumerThreads);
  if (w.slot >= 0 && !merge_split<D>(a, w, wg, dk, dv))
    return; // another piece of this column block writes it
  const float scale2[2] = {a.scale, a.scale}, one2[2] = {1.f, 1.f};
  const int key0 = w.col * kBlockN + wg * kKeysPerWarpgroup;
  store_tile_tma<T, D>(&a.tm_dk, sm.k, kBlockN * 128, kBarWg0 + wg, key0, w.hkv, w.b, dk, scale2,
                       wg * kKeysPerWarpgroup);
  store_tile_tma<T, D>(&a.tm_dv, sm.v, kBlockN * 128, kBarWg0 + wg, key0, w.hkv, w.b, dv, one2,
                       wg * kKeysPerWarpgroup);
  if (threadIdx.x % 128 == 0)
    bulk_wait_all();
}

template <class T, int D, int BM>
__global__ void __launch_bounds__(kThreads, 1) fa3_bwd_main(const __grid_constant__ KernelArgs a) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const Smem<D, BM> sm(base, a.stages, a.dq_add);
  if (threadIdx.x == 0) {
    mbar_init(sm.kv_full(), 1);
    for (int s = 0; s < a.stages; ++s) {
      mbar_init(sm.full(s), 1);
      mbar_init(sm.empty(s), 4 * kConsumers);
    }
    for (int i = 0; i < sm.dq_bufs; ++i)
      for (int h = 0; h < kConsumers; ++h) {
        mbar_init(sm.dq_full(i, h), 4); // the consumer's four warps
        mbar_init(sm.dq_empty(i, h), 1);
      }
    mbar_fence_init();
  }
  __syncthreads();
  const Work w = work_of<BM>(a);
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (wg == 0) {
    regs_dealloc<kProducerRegs>();
    if (threadIdx.x == 0)
      producer<D, BM>(a, sm, w);
    else if (threadIdx.x == 32 && a.dq_add == kDqBulk)
      dq_writer<D, BM>(a, sm, w);
    else if (threadIdx.x / 32 == 2)
      row_loader<D, BM>(a, sm, w, int(threadIdx.x) % 32);
    return;
  }
  regs_alloc<kConsumerRegs>();
  consumer<T, D, BM>(a, sm, w, wg - 1);
}

template <class T, int D, int BM>
void launch_tile(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
                 cudaStream_t stream) {
  const kernels::bwd::RowArgs<T> rows = kernels::bwd::row_args<T>(p, args, BM);
  KernelArgs a{};
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  a.tm_q = make_tile_map(args.q, p.dtype, D, p.seqlen_q, p.heads_q, p.batch, qs, BM);
  a.tm_do = make_tile_map(args.dout, p.dtype, D, p.seqlen_q, p.heads_q, p.batch, qs, BM);
  a.tm_k = make_tile_map(args.k, p.dtype, D, p.seqlen_kv, p.heads_kv, p.batch, ks, kBlockN);
  a.tm_v = make_tile_map(args.v, p.dtype, D, p.seqlen_kv, p.heads_kv, p.batch, ks, kBlockN);
  a.tm_dk =
      make_tile_map(args.dk, p.dtype, D, p.seqlen_kv, p.heads_kv, p.batch, ks, kKeysPerWarpgroup);
  a.tm_dv =
      make_tile_map(args.dv, p.dtype, D, p.seqlen_kv, p.heads_kv, p.batch, ks, kKeysPerWarpgroup);
  a.lse2 = rows.lse2;
  a.delta = rows.delta;
  a.dq_acc = rows.dq_acc;
  a.sem = static_cast<int *>(args.semaphores);
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.seqlen_kv = static_cast<int>(p.seqlen_kv);
  a.rows_pad = rows.rows_pad;
  a.heads_q = static_cast<int>(p.heads_q);
  a.heads_kv = static_cast<int>(p.heads_kv);
  a.group = static_cast<int>(p.group_size());
  a.n_row_blocks = static_cast<int>(num_row_blocks(p, c));
  a.n_col_blocks = static_cast<int>(num_col_blocks(p));
  a.bh_count = static_cast<int>(p.heads_kv * p.batch);
  a.scale = static_cast<float>(p.softmax_scale());
  a.scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
  a.stages = c.stages;
  a.order = c.order;
  a.causal = p.causal ? 1 : 0;
  a.deterministic = c.deterministic;
  a.dq_add = c.dq_add;
  a.sections = static_cast<int>(
      section_count(p, BM, a.n_col_blocks, fb::kernels::sm_count(), fb::kernels::l2_bytes()));
  const TailSplit split = tail_split(p, c, fb::kernels::sm_count());
  a.split_full = static_cast<int>(split.full);
  a.split_pieces = split.pieces;
  a.split_acc =
      split.tiles > 0 ? reinterpret_cast<float *>(a.sem + split_counter_ints(p)) : nullptr;
  a.tail_rows = tail_rows(p, c);

  kernels::bwd::launch_preprocess<T, D>(rows, p.batch, stream);
  auto *kernel = fa3_bwd_main<T, D, BM>;
  const int64_t smem = smem_bytes(D, c);
  FB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(split.ctas()), kThreads, static_cast<size_t>(smem), stream>>>(a);
  FB_CHECK_LAUNCH();
  kernels::bwd::launch_convert<T, D, DqTileOrder<BM>>(rows, p.batch, stream);
}

// The SM count where a device is present, else 0 (no tail split): the kernel list is also asked for on a machine
// without a GPU (planning, CPU tests).
inline int sms_if_present() { return device_count() > 0 ? fb::kernels::sm_count() : 0; }

template <class T, int D, int BM>
std::vector<KernelDesc> describe_tile(const AttentionProblem &p, const Params &c) {
  return {kernels::bwd::preprocess_desc<T, D>("fa3_bwd", p, BM),
          {"fa3_bwd_main", reinterpret_cast<const void *>(&fa3_bwd_main<T, D, BM>), kThreads,
           static_cast<size_t>(smem_bytes(D, c)), tail_split(p, c, sms_if_present()).ctas()},
          kernels::bwd::convert_desc<T, D, DqTileOrder<BM>>("fa3_bwd", p)};
}

} // namespace detail

// The launch and kernel-list functions of the compiled tile of (T, D) that the config's block_m asks for, else
// nulls. What is compiled is block_m_compiled's (traits.hpp), the one list that supports() also reads.
template <class T, int D, int BM> Instance tile_if(const Params &c) {
  if constexpr (block_m_compiled(D, BM))
    if (c.block_m == BM)
      return {&detail::launch_tile<T, D, BM>, &detail::describe_tile<T, D, BM>};
  return {};
}
template <class T, int D> Instance pick_tile(const Params &c) {
  for (const Instance in : {tile_if<T, D, 64>(c), tile_if<T, D, 80>(c), tile_if<T, D, 128>(c)})
    if (in.launch)
      return in;
  return {};
}

} // namespace fb::fa3_bwd
