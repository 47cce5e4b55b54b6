// FA3-style attention backward for Hopper (sm_90a): TMA loads into an mbarrier ring, WGMMA for the five
// products, a producer warpgroup and two consumer warpgroups with setmaxnreg. Three kernels:
//  1. preprocess (kernels/common/bwd_rows.cuh): D = rowsum(dO∘O), the base-2 LSE, the zeroed dQ accumulator.
//  2. main: one CTA per (column block of 128 keys, kv head, batch), in the order of grid_order (traits.hpp).
//     K and V stay in shared memory and dK, dV in registers for the CTA's life, across every row block it visits
//     and every query head of its GQA group, so dK and dV are written once with no atomics. Consumer warpgroup w
//     owns keys [64w, 64w + 64) of the block. Per row block (block_m query rows), with the scores transposed
//     (keys as rows) so that Pᵀ and dSᵀ come out of the accumulators in the layout of a register A operand:
//       Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ (SS WGMMA, both from shared memory)
//       Pᵀ = exp2(Sᵀ·scale·log2e − LSE₂) (masked: 0); dV += Pᵀ·dO (RS WGMMA: Pᵀ from registers)
//       dSᵀ = Pᵀ∘(dPᵀ − D); dK += dSᵀ·Q (RS WGMMA)
//       dS to shared memory (stmatrix.trans: queries as rows), both warpgroups' halves, then
//       dQ_partial = dS·K (SS WGMMA, K as an MN-major B), split between the warpgroups by columns (head_dim / 2
//       each), added into the fp32 accumulator with red.global.add.v4.f32.
//     dS has two buffers, so one barrier of the two consumers per row block (dS written) is all they share: a
//     warpgroup passing the barrier of row block i knows that the other finished row block i − 1, whose dQ
//     product read the buffer that row block i + 1 will write.
//     deterministic: the two warpgroups add a row block's dQ partial when its counter (semaphores) says that every
//     column block to the right has added its own, then count themselves in; column block 0 resets it. A causal
//     diagonal column block reaches a row block first, and CTAs are launched rightmost column first
//     (grid_order), so a CTA only ever waits on one launched before it.
//     Epilogue: dK (times scale) and dV through the K and V tiles' shared memory and TMA stores.
//  3. convert (bwd_rows.cuh): dQ = scale · accumulator.
// scale is applied once: to dK in the epilogue and to dQ in convert.
#pragma once

#include "kernels/common/bwd_rows.cuh"
#include "kernels/common/hopper/epilogue.cuh"
#include "kernels/common/hopper/sync.cuh"
#include "kernels/common/hopper/tensor_map.hpp"
#include "kernels/common/hopper/tma.cuh"
#include "kernels/common/hopper/warpgroup.cuh"
#include "kernels/common/hopper/wgmma.cuh"
#include "kernels/common/hopper/wgmma_f16.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/fa3_bwd/traits.hpp"

#include "flashbench/check.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fb::fa3_bwd {
namespace detail {

using namespace fb::hopper;

struct KernelArgs {
  CUtensorMap tm_q, tm_do, tm_k, tm_v; // loads: Q, dO (block_m-row boxes), K, V (128-row boxes)
  CUtensorMap tm_dk, tm_dv;            // stores: 64-row boxes, one per consumer warpgroup
  const float *lse2, *delta;           // workspace rows (kernels/common/bwd.hpp)
  float *dq_acc;
  int *sem; // deterministic: one counter per (batch, query head, row block)
  int seqlen_q, seqlen_kv, rows_pad;
  int heads_q, heads_kv, group;
  int n_row_blocks, n_col_blocks, bh_count; // bh_count = heads_kv x batch
  float scale, scale_log2;
  int stages, order, causal, deterministic;
};

// Named barriers (0 is __syncthreads): both consumers; each consumer's own (epilogue staging).
constexpr int kBarDsReady = 1;
constexpr int kBarDet = 2;
constexpr int kBarWg0 = 3;
constexpr int kConsumerThreads = 128 * kConsumers;

__device__ __forceinline__ float2 lds_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

// The shared-memory map of a launch (traits.hpp smem_map), as 32-bit shared addresses.
struct Smem {
  uint32_t k, v, slots, slot_bytes, ds, ds_bytes, bars;
  uint32_t q_off, dout_off, lse2_off, delta_off; // inside a slot
  int stages;
  __device__ Smem(uint32_t base, int d, int stages_) : stages(stages_) {
    const SmemMap m = smem_map(d, stages_);
    k = base + uint32_t(m.k), v = base + uint32_t(m.v), slots = base + uint32_t(m.slots);
    slot_bytes = uint32_t(m.slot_bytes), ds = base + uint32_t(m.ds),
    ds_bytes = uint32_t(m.ds_bytes);
    bars = base + uint32_t(m.bars);
    q_off = uint32_t(m.q), dout_off = uint32_t(m.dout), lse2_off = uint32_t(m.lse2),
    delta_off = uint32_t(m.delta);
  }
  __device__ uint32_t slot(int s) const { return slots + uint32_t(s) * slot_bytes; }
  __device__ uint32_t ds_buf(int i) const { return ds + uint32_t(i) * ds_bytes; }
  __device__ uint32_t kv_full() const { return bars; }
  __device__ uint32_t full(int s) const { return bars + 8u * uint32_t(1 + s); }
  __device__ uint32_t empty(int s) const { return bars + 8u * uint32_t(1 + kMaxStages + s); }
};

// The work of one CTA: its column block, kv head and batch entry, and the row blocks it visits (for each query
// head of the group in turn).
struct Work {
  int col, hkv, b, first, end;
};
__device__ __forceinline__ Work work_of(const KernelArgs &a) {
  const GridSlot g =
      grid_order(blockIdx.x, a.n_col_blocks, a.bh_count, a.order, a.deterministic != 0);
  const RowRange r =
      row_blocks_for(g.col, kBlockM, kBlockN, a.seqlen_q, a.seqlen_kv, a.causal != 0);
  return {int(g.col), int(g.bh % a.heads_kv), int(g.bh / a.heads_kv), int(r.first), int(r.end)};
}

// ---- producer: one thread issues every load
template <int D>
__device__ __forceinline__ void producer(const KernelArgs &a, const Smem &sm, const Work &w) {
  constexpr int BM = kBlockM;
  constexpr uint32_t kKvChunk = kBlockN * 128, kRowChunk = BM * 128;
  tma_prefetch_desc(&a.tm_q);
  tma_prefetch_desc(&a.tm_do);
  mbar_arrive_expect_tx(sm.kv_full(), 2u * kBlockN * D * 2);
#pragma unroll
  for (int c = 0; c < D / 64; ++c) {
    tma_load_4d(sm.k + c * kKvChunk, &a.tm_k, sm.kv_full(), c * 64, w.col * kBlockN, w.hkv, w.b);
    tma_load_4d(sm.v + c * kKvChunk, &a.tm_v, sm.kv_full(), c * 64, w.col * kBlockN, w.hkv, w.b);
  }
  int it = 0;
  for (int g = 0; g < a.group; ++g) {
    const int hq = w.hkv * a.group + g;
    for (int mb = w.first; mb < w.end; ++mb, ++it) {
      const int s = it % sm.stages, use = it / sm.stages;
      if (use > 0)
        mbar_wait(sm.empty(s), (use - 1) & 1);
      const uint32_t slot = sm.slot(s), bar = sm.full(s);
      mbar_arrive_expect_tx(bar, 2u * BM * D * 2 + 2u * BM * 4);
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        tma_load_4d(slot + sm.q_off + c * kRowChunk, &a.tm_q, bar, c * 64, mb * BM, hq, w.b);
        tma_load_4d(slot + sm.dout_off + c * kRowChunk, &a.tm_do, bar, c * 64, mb * BM, hq, w.b);
      }
      const int64_t row = (int64_t(w.b) * a.heads_q + hq) * a.rows_pad + int64_t(mb) * BM;
      bulk_load_1d(slot + sm.lse2_off, a.lse2 + row, BM * 4, bar);
      bulk_load_1d(slot + sm.delta_off, a.delta + row, BM * 4, bar);
    }
  }
}

// ---- consumer pieces
// acc (m64 x N accumulator, rows = this warpgroup's 64 keys): acc[4i + e] is key row 16·warp + lane/4 + 8·(e/2),
// column (query row of the block) 8i + 2·(lane%4) + e%2.

// Packs an m64 x N accumulator into the A fragments of N/16 k-steps (bf16/fp16): pa[kt] covers columns
// [16kt, 16kt + 16), in the m16n8k16 A layout of the thread's warp's 16 rows.
template <class T, int N>
__device__ __forceinline__ void pack_a(uint32_t (&pa)[N / 16][4], const float (&acc)[N / 2]) {
#pragma unroll
  for (int kt = 0; kt < N / 16; ++kt)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      pa[kt][r] = fb::kernels::Mma<T>::pack(acc[8 * kt + 2 * r], acc[8 * kt + 2 * r + 1]);
}

// C[64 x 64] = A·Bᵀ over head_dim: A = 64 rows of a [128][D] key tile (this warpgroup's), B = a [64][D] row
// tile; both K-major in 128B-swizzled column chunks of 64.
template <class T, int D>
__device__ __forceinline__ void issue_scores(float (&c)[kBlockM / 2], uint32_t key_tile, int wg,
                                             uint32_t row_tile) {
  constexpr int BM = kBlockM;
  constexpr uint32_t kKvChunk16 = kBlockN * 128 / 16, kRowChunk = BM * 128;
  const DescBase da = desc_base(key_tile + uint32_t(wg) * kKeysPerWarpgroup * 128, 16);
  const DescBase db = desc_base(row_tile, 16);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss(c, da.plus16((kk / 4) * kKvChunk16).at((kk % 4) * 32),
             db.at((kk / 4) * kRowChunk + (kk % 4) * 32), kk > 0 ? 1 : 0,
             typename TypeOps<T>::Tag{}, IntC<BM>{});
}

// acc[64 x D] += A-fragments (64 x 64, registers) · B, B a [64][D] row tile as an MN-major operand (K = rows).
template <class T, int D>
__device__ __forceinline__ void
issue_grad(float (&acc)[D / 2], const uint32_t (&pa)[kBlockM / 16][4], uint32_t row_tile) {
  constexpr int BM = kBlockM;
  const DescBase db = desc_base(row_tile, BM * 128);
#pragma unroll
  for (int kt = 0; kt < BM / 16; ++kt)
    wgmma_rs(acc, pa[kt], db.at(kt * 16 * 128), typename TypeOps<T>::Tag{}, IntC<D>{});
}

// This warpgroup's dQ slice [64 x D/2] = dS · K[:, columns (D/2)·wg ..] over the 128 keys: A from the dS buffer
// ([64][128 keys], two 64-key chunks), B from the K tile as an MN-major operand (head_dim 128: the warpgroup's
// 64-column chunk; head_dim 64: its 32-column half of the one chunk, 64 bytes into the swizzle row).
template <class T, int D>
__device__ __forceinline__ void issue_dq(float (&dq)[D / 4], uint32_t ds_buf, uint32_t k_tile,
                                         int wg) {
  constexpr int DQN = D / 2;
  constexpr uint32_t kDsChunk16 = kBlockM * 128 / 16, kKvChunk = kBlockN * 128;
  const int c0 = wg * DQN;
  const uint32_t b_base = k_tile + uint32_t(c0 / 64) * kKvChunk + uint32_t(c0 % 64) * 2;
  const DescBase da = desc_base(ds_buf, 16), db = desc_base(b_base, kKvChunk);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk)
    wgmma_ss_tb(dq, da.plus16((kk / 4) * kDsChunk16).at((kk % 4) * 32), db.at(kk * 16 * 128),
                kk > 0 ? 1 : 0, typename TypeOps<T>::Tag{}, IntC<DQN>{});
}

// This warpgroup's dSᵀ (packed as A fragments) into its 64-key chunk of the dS buffer, transposed: row q of the
// chunk holds keys [0, 64) of query row q, 16-byte units XOR-swizzled by q % 8 (the 128B swizzle WGMMA reads).
__device__ __forceinline__ void store_ds(uint32_t ds_buf, const uint32_t (&dsa)[kBlockM / 16][4],
                                         int wg, int warp, int lane) {
  constexpr int BM = kBlockM;
  const uint32_t chunk = ds_buf + uint32_t(wg) * BM * 128;
  const int j = lane / 8, r = lane % 8;
  const uint32_t unit = uint32_t(2 * warp + j % 2); // 8 keys: 16·warp + 8·(j % 2)
#pragma unroll
  for (int kt = 0; kt < BM / 16; ++kt) {
    const int q = 16 * kt + 8 * (j / 2) + r; // matrix j: columns 8·(2kt + j/2), key half j % 2
    stmatrix_x4_trans(chunk + uint32_t(q) * 128 + ((unit ^ uint32_t(r)) << 4), dsa[kt][0],
                      dsa[kt][1], dsa[kt][2], dsa[kt][3]);
  }
}

// Adds a 64 x N dQ slice (rows row0.., columns col0.. of a row-major [rows][D] fp32 accumulator) with 4-float
// vector reductions: lanes 2i and 2i + 1 swap halves so that each holds four adjacent columns of one row.
template <int D, int N>
__device__ __forceinline__ void add_dq(float *acc, const float (&dq)[N / 2], int col0, int warp,
                                       int lane) {
  const bool odd = lane & 1;
  const int r = 16 * warp + lane / 4 + (odd ? 8 : 0), c = col0 + 4 * ((lane % 4) / 2);
#pragma unroll
  for (int i = 0; i < N / 8; ++i) {
    const float *e = dq + 4 * i;
    const float g0 = __shfl_xor_sync(0xffffffffu, odd ? e[0] : e[2], 1);
    const float g1 = __shfl_xor_sync(0xffffffffu, odd ? e[1] : e[3], 1);
    float *dst = acc + int64_t(r) * D + c + 8 * i;
    const float v0 = odd ? g0 : e[0], v1 = odd ? g1 : e[1], v2 = odd ? e[2] : g0,
                v3 = odd ? e[3] : g1;
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(v0), "f"(v1),
                 "f"(v2), "f"(v3)
                 : "memory");
  }
}

template <class T, int D>
__device__ __forceinline__ void consumer(const KernelArgs &a, const Smem &sm, const Work &w,
                                         int wg) {
  constexpr int BM = kBlockM, DQN = D / 2;
  const int t = int(threadIdx.x) % 128, warp = t / 32, lane = t % 32;
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i)
    dk[i] = 0.f, dv[i] = 0.f;
  const int off = a.seqlen_kv - a.seqlen_q; // causal: row q sees keys <= q + off
  const int key_lo = w.col * kBlockN + wg * kKeysPerWarpgroup + 16 * warp + lane / 4;
  mbar_wait(sm.kv_full(), 0);

  int it = 0;
  for (int g = 0; g < a.group; ++g) {
    const int hq = w.hkv * a.group + g;
    for (int mb = w.first; mb < w.end; ++mb, ++it) {
      const int s = it % sm.stages;
      const uint32_t slot = sm.slot(s);
      mbar_wait(sm.full(s), (it / sm.stages) & 1);

      float sacc[BM / 2], dpacc[BM / 2];
      wgmma_fence();
      issue_scores<T, D>(sacc, sm.k, wg, slot + sm.q_off);
      wgmma_commit();
      issue_scores<T, D>(dpacc, sm.v, wg, slot + sm.dout_off);
      wgmma_commit();
      wgmma_wait<1>();
      fence_operands(sacc);

      // Pᵀ, masked where a key is past the sequence end or (causal) right of a query's diagonal.
      const int q_lo = mb * BM + 2 * (lane % 4);
      const bool need_mask = (w.col + 1) * kBlockN > a.seqlen_kv ||
                             (a.causal && w.col * kBlockN + kBlockN - 1 > mb * BM + off);
      const uint32_t lse_row = slot + sm.lse2_off + uint32_t(2 * (lane % 4)) * 4;
#pragma unroll
      for (int i = 0; i < BM / 8; ++i) {
        const float2 l = lds_f2(lse_row + uint32_t(8 * i) * 4);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p =
              fb::kernels::fast_exp2(fmaf(sacc[4 * i + e], a.scale_log2, e % 2 ? -l.y : -l.x));
          if (need_mask) {
            const int key = key_lo + 8 * (e / 2), q = q_lo + 8 * i + e % 2;
            if (key >= a.seqlen_kv || (a.causal && key > q + off))
              p = 0.f;
          }
          sacc[4 * i + e] = p;
        }
      }
      uint32_t pa[BM / 16][4];
      pack_a<T, BM>(pa, sacc);
      wgmma_fence();
      issue_grad<T, D>(dv, pa, slot + sm.dout_off);
      wgmma_commit();
      wgmma_wait<1>(); // dPᵀ
      fence_operands(dpacc);

      const uint32_t delta_row = slot + sm.delta_off + uint32_t(2 * (lane % 4)) * 4;
#pragma unroll
      for (int i = 0; i < BM / 8; ++i) {
        const float2 dd = lds_f2(delta_row + uint32_t(8 * i) * 4);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dpacc[4 * i + e] = sacc[4 * i + e] * (dpacc[4 * i + e] - (e % 2 ? dd.y : dd.x));
      }
      uint32_t dsa[BM / 16][4];
      pack_a<T, BM>(dsa, dpacc);
      const uint32_t ds_buf = sm.ds_buf(it & 1);
      store_ds(ds_buf, dsa, wg, warp, lane);
      wgmma_fence();
      issue_grad<T, D>(dk, dsa, slot + sm.q_off);
      wgmma_commit();
      fence_proxy_async_smem(); // the stmatrix writes, visible to WGMMA (the async proxy)
      named_sync(kBarDsReady, kConsumerThreads);

      float dq[DQN / 2];
      wgmma_fence();
      issue_dq<T, D>(dq, ds_buf, sm.k, wg);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(dq);
      fence_operands(pa);
      fence_operands(dsa);
      fence_operands(dk);
      fence_operands(dv);
      __syncwarp();
      if (lane == 0)
        mbar_arrive(sm.empty(s)); // Q, dO, LSE₂ and D of this slot are read

      float *acc =
          a.dq_acc + (int64_t(w.b) * a.heads_q + hq) * a.rows_pad * D + int64_t(mb) * BM * D;
      const int col0 = DQN * wg;
      if (a.deterministic) {
        int *ctr = a.sem + (int64_t(w.b) * a.heads_q + hq) * a.n_row_blocks + mb;
        const int before =
            int(col_blocks_for(mb, BM, kBlockN, a.seqlen_q, a.seqlen_kv, a.causal != 0)) - 1 -
            w.col;
        if (threadIdx.x == 128)
          while (ld_acquire_gpu(ctr) != before)
            __nanosleep(32);
        named_sync(kBarDet, kConsumerThreads);
        add_dq<D, DQN>(acc, dq, col0, warp, lane);
        named_sync(kBarDet, kConsumerThreads);
        if (threadIdx.x == 128) {
          __threadfence();
          if (w.col == 0)
            atomicExch(ctr, 0); // the last of this row block: leave the counter as it was found
          else
            atomicAdd(ctr, 1);
        }
      } else {
        add_dq<D, DQN>(acc, dq, col0, warp, lane);
      }
    }
  }

  // Epilogue: both consumers are done with K and V (their last dQ and dP products have retired) before either
  // overwrites its half of the tiles with dK or dV.
  named_sync(kBarDsReady, kConsumerThreads);
  const float scale2[2] = {a.scale, a.scale}, one2[2] = {1.f, 1.f};
  const int key0 = w.col * kBlockN + wg * kKeysPerWarpgroup;
  store_tile_tma<T, D>(&a.tm_dk, sm.k, kBlockN * 128, kBarWg0 + wg, key0, w.hkv, w.b, dk, scale2,
                       wg * kKeysPerWarpgroup);
  store_tile_tma<T, D>(&a.tm_dv, sm.v, kBlockN * 128, kBarWg0 + wg, key0, w.hkv, w.b, dv, one2,
                       wg * kKeysPerWarpgroup);
  if (t == 0)
    bulk_wait_all();
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1) fa3_bwd_main(const __grid_constant__ KernelArgs a) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const Smem sm(base, D, a.stages);
  if (threadIdx.x == 0) {
    mbar_init(sm.kv_full(), 1);
    for (int s = 0; s < a.stages; ++s) {
      mbar_init(sm.full(s), 1);
      mbar_init(sm.empty(s), 4 * kConsumers);
    }
    mbar_fence_init();
  }
  __syncthreads();
  const Work w = work_of(a);
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (wg == 0) {
    regs_dealloc<kProducerRegs>();
    if (threadIdx.x == 0)
      producer<D>(a, sm, w);
    return;
  }
  regs_alloc<kConsumerRegs>();
  consumer<T, D>(a, sm, w, wg - 1);
}

template <class T, int D>
void launch_tile(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
                 cudaStream_t stream) {
  const kernels::bwd::RowArgs<T> rows = kernels::bwd::row_args<T>(p, args, kBlockM);
  KernelArgs a{};
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  a.tm_q = make_tile_map(args.q, p.dtype, D, p.seqlen_q, p.heads_q, p.batch, qs, kBlockM);
  a.tm_do = make_tile_map(args.dout, p.dtype, D, p.seqlen_q, p.heads_q, p.batch, qs, kBlockM);
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
  a.n_row_blocks = static_cast<int>(num_row_blocks(p));
  a.n_col_blocks = static_cast<int>(num_col_blocks(p));
  a.bh_count = static_cast<int>(p.heads_kv * p.batch);
  a.scale = static_cast<float>(p.softmax_scale());
  a.scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
  a.stages = c.stages;
  a.order = c.order;
  a.causal = p.causal ? 1 : 0;
  a.deterministic = c.deterministic;

  kernels::bwd::launch_preprocess<T, D>(rows, p.batch, stream);
  auto *kernel = fa3_bwd_main<T, D>;
  const int64_t smem = smem_bytes(D, c);
  FB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  const int64_t ctas = int64_t(a.n_col_blocks) * p.heads_kv * p.batch;
  kernel<<<static_cast<unsigned>(ctas), kThreads, static_cast<size_t>(smem), stream>>>(a);
  FB_CHECK_LAUNCH();
  kernels::bwd::launch_convert<T, D>(rows, p.batch, stream);
}

template <class T, int D>
std::vector<KernelDesc> describe_tile(const AttentionProblem &p, const Params &c) {
  return {kernels::bwd::preprocess_desc<T, D>("fa3_bwd", p, kBlockM),
          {"fa3_bwd_main", reinterpret_cast<const void *>(&fa3_bwd_main<T, D>), kThreads,
           static_cast<size_t>(smem_bytes(D, c)), num_col_blocks(p) * p.heads_kv * p.batch},
          kernels::bwd::convert_desc<T, D>("fa3_bwd", p)};
}

} // namespace detail

// The launch and kernel-list functions of the compiled tile of (T, D) when the config asks for it, else nulls.
template <class T, int D> Instance pick_tile(const Params &) {
  return {&detail::launch_tile<T, D>, &detail::describe_tile<T, D>};
}

} // namespace fb::fa3_bwd
