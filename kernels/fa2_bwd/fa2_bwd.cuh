// FlashAttention-2 backward on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async): three kernels.
//
//  1. preprocess: per query row, D = rowsum(dO∘O) in fp32 and the LSE in base 2 (+inf for a row that sees no
//     key, so that its P = exp2(S·c − LSE) is 0 rather than NaN); it also zeroes the fp32 dQ accumulator. Rows
//     are padded to a whole number of row blocks (LSE +inf, D 0), so the main kernel needs no row predicates
//     for them.
//  2. main: one CTA per (K/V column block of block_n keys, kv head, batch). K and V stay in shared memory and
//     dK, dV in registers for the CTA's life, across every Q row block it visits and every query head of its
//     GQA group, so dK and dV are written once with no atomics. Per row block (block_m rows):
//       S = Q·Kᵀ, P = exp2(S·scale·log2e − LSE₂) (masked: 0), dP = dO·Vᵀ, dS = P∘(dP − D);
//       P and dS go to shared memory (bf16/fp16) for the three products that need them transposed or as A:
//       dV += Pᵀ·dO, dK += dSᵀ·Q, dQ_partial = dS·K, added into the fp32 accumulator with red.global.add
//       (two adjacent floats per instruction on sm_90, each lane its own pairs; one float on sm_80).
//     Q, dO, LSE₂ and D of the next row block stream in by cp.async while this one computes (stages 2), so one
//     iteration costs two barriers: one before S (this row block landed; P/dS and the other slot are free), one
//     before the transposed products (P and dS written).
//     Causal: a column block starts at its first visible row block; only the row blocks that straddle the
//     diagonal, and the column block holding the sequence end, evaluate the mask.
//     deterministic: each warp adds its dQ slice of a row block when that slice's counter (semaphores) says
//     that every column block to its right has added its own; one thread counts all the CTA's warps in one phase
//     later (after the next row block's second barrier, so that its fence finds the reductions long issued); the
//     last (column 0) resets the counters. The order follows causal arrival (a diagonal column block reaches a row
//     block first), and blocks are launched rightmost column first, so a CTA only ever waits on one launched before
//     it.
//  3. convert: dQ = scale · accumulator, in the input type.
// scale is applied once: to dK in the epilogue and to dQ in convert (S, P, dP and dS are in unscaled units of
// the score gradient).
#pragma once

#include "kernels/fa2_bwd/traits.hpp"

#include "flashbench/check.hpp"
#include "kernels/common/bwd_rows.cuh"
#include "kernels/common/fast_div.hpp"
#include "kernels/common/mma.cuh"
#include "kernels/common/sm_count.hpp"

#include <cuda_runtime.h>

#include <type_traits>

namespace fb::fa2_bwd {

namespace detail {

using namespace fb::kernels;

template <class T> struct Args {
  const T *q, *k, *v, *o, *dout;
  const float *lse;
  T *dq, *dk, *dv;
  float *dq_acc, *lse2, *delta; // workspace (traits.hpp, workspace_layout)
  int *sem;                     // deterministic: one counter per (batch, head, row block, warp)
  int seqlen_q, seqlen_kv, rows_pad;
  int heads_q, group;
  Strides qs, ks; // Q, O, dO, dQ; K, V, dK, dV
  float scale, scale_log2;
  int stages, n_row_blocks, n_col_blocks;
  // The remap kernel's grid (traits.hpp, launch_grid): (pair of a section, column block, section), pair =
  // section · per + x = batch · heads_kv + kv head.
  int per, bh_count;
  kernels::FastDiv heads_kv;
  bool causal;
  bool
      rotated; // row_order rotated (non-causal): column block n starts at row block rotated_start(n)
};

constexpr float kLog2e = 1.4426950408889634f;

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of COLS 16-bit columns, chunks XOR-swizzled by
// row % 8: the eight rows of one ldmatrix (or of one quad-row store) land in eight distinct bank groups.
template <int COLS> __device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>((row * (COLS / 8) + (chunk ^ (row & 7))) * 16);
}

// Values the optimiser can neither hoist out of the row-block loop nor keep live across it: the loop's per-lane
// addresses (a dozen products' ldmatrix bases, the cp.async chunk offsets, the mask coordinates) are recomputed
// from these (the thread index, and the grid indices that give the CTA's column block, kv head and batch) each
// iteration for a few integer instructions, instead of ~50 hoisted registers that spill next to the 128 dK/dV
// accumulators (fresh_tid: kernels/common/bwd_rows.cuh).
using kernels::bwd::fresh_tid;
template <int DIM> __device__ __forceinline__ int fresh_ctaid() {
  int t;
  if constexpr (DIM == 0)
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(t));
  else if constexpr (DIM == 1)
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(t));
  else
    asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(t));
  return t;
}
__device__ __forceinline__ int64_t opaque(int64_t x) {
  asm volatile("" : "+l"(x));
  return x;
}

// Rows [row0, row0 + ROWS) of a [seq, COLS] slice (row stride `stride` elements) into a swizzled tile; rows at
// or past `limit` are zero-filled (so that their products are 0). A thread copies chunk tid % (COLS / 8) of rows
// tid / (COLS / 8) + k · THREADS / (COLS / 8): one source pointer and one destination a thread, stepped by
// constants, where a multiply a chunk had taken ~28 instructions per copy (ncu, d128: 235 for 8 copies).
template <int COLS, int ROWS, int THREADS, class T>
__device__ __forceinline__ void load_rows(uint32_t dst, const T *src, int64_t stride, int row0,
                                          int limit, int tid) {
  constexpr int kCh = COLS / 8, kN = ROWS * kCh;
  if constexpr (THREADS % kCh == 0 && (THREADS / kCh) % 8 == 0) {
    // Each step moves THREADS / kCh rows, a multiple of 8: the swizzle key (row % 8) stays the thread's.
    constexpr int kStep = THREADS / kCh;
    const int r0 = tid / kCh, c = tid % kCh;
    const int64_t st = opaque(stride);
    const T *p = src + (row0 + r0) * st + c * 8;
    const uint32_t d = dst + swz<COLS>(r0, c);
#pragma unroll
    for (int it = 0; it < (kN + THREADS - 1) / THREADS; ++it) {
      if (kN % THREADS == 0 || it * THREADS + tid < kN) {
        const bool ok = row0 + r0 + it * kStep < limit;
        cp_async_16(d + it * kStep * COLS * 2, ok ? p + it * kStep * st : src, ok);
      }
    }
  } else {
#pragma unroll
    for (int it = 0; it < (kN + THREADS - 1) / THREADS; ++it) {
      const int idx = it * THREADS + tid;
      if (kN % THREADS == 0 || idx < kN) {
        const int r = idx / kCh, c = idx % kCh;
        const bool ok = row0 + r < limit;
        cp_async_16(dst + swz<COLS>(r, c), ok ? src + (row0 + r) * opaque(stride) + c * 8 : src,
                    ok);
      }
    }
  }
}

// In every product below, each ldmatrix lane names a row that is (multiple of 8) + lane % 8, so the swizzle key
// of every address is x = lane % 8, and the lane index is read afresh (fresh_tid) in each product so that its
// addresses are not kept live from one product to the next.
// Chunk 2·kk + c of k-step kk: (2·kk + c) ^ x = 8·(kk / 4) + ((2·(kk % 4) + c) ^ x), four lane-dependent byte
// offsets and a compile-time constant.
struct KChunks {
  uint32_t off[4];
  __device__ __forceinline__ KChunks(int c, int x) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      off[i] = static_cast<uint32_t>(((2 * i + c) ^ x) * 16);
  }
  __device__ __forceinline__ uint32_t at(int kk) const { return (kk / 4) * 128 + off[kk % 4]; }
};

// c += one k-step: A fragments a[MT] (16 rows each) times B fragments b[NT / 2] (16 columns each, two n8 tiles).
template <class T, int MT, int NT>
__device__ __forceinline__ void mma_tile(float (&c)[MT][NT][4], const uint32_t (&a)[MT][4],
                                         const uint32_t (&b)[NT / 2][4]) {
#pragma unroll
  for (int n2 = 0; n2 < NT / 2; ++n2)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      Mma<T>::run(c[mt][2 * n2], a[mt], b[n2][0], b[n2][1]);
      Mma<T>::run(c[mt][2 * n2 + 1], a[mt], b[n2][2], b[n2][3]);
    }
}

// The k-loop of every product: PASSES passes of KK unrolled k-steps; a pass moves the A and B bases by A_STEP and
// B_STEP bytes. The passes are a rolled loop (which bounds how many fragments the scheduler loads ahead next to
// the dK/dV accumulators), or unrolled with UNR, so that every ldmatrix takes its k-step's offset as an immediate
// from one base (HISTORY rows 14-15). load_a(frag, base, mt, kk) and load_b(frag, base, n2, kk) issue one
// ldmatrix.x4 each.
// PF: fragments one k-step ahead in two buffers, across the pass boundary too, so the MMAs of step k issue while
// the ldmatrix of step k + 1 are in flight and a new pass does not start on an empty pipeline.
template <class T, int MT, int NT, bool PF, bool UNR, int PASSES, int KK, uint32_t A_STEP,
          uint32_t B_STEP, class LA, class LB>
__device__ __forceinline__ void k_loop(float (&c)[MT][NT][4], uint32_t a_base, uint32_t b_base,
                                       const LA &load_a, const LB &load_b) {
  static_assert(KK % 2 == 0, "the two fragment buffers alternate across passes");
  if constexpr (PF) {
    uint32_t af[2][MT][4], bf[2][NT / 2][4];
    auto load = [&](uint32_t(&a)[MT][4], uint32_t(&b)[NT / 2][4], uint32_t ab, uint32_t bb,
                    int kk) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        load_a(a[mt], ab, mt, kk);
#pragma unroll
      for (int n2 = 0; n2 < NT / 2; ++n2)
        load_b(b[n2], bb, n2, kk);
    };
    load(af[0], bf[0], a_base, b_base, 0);
#pragma unroll(UNR ? PASSES : 1)
    for (int kb = 0; kb < PASSES; ++kb, a_base += A_STEP, b_base += B_STEP) {
#pragma unroll
      for (int kk = 0; kk < KK; ++kk) {
        const int cur = kk & 1;
        if (kk < KK - 1)
          load(af[cur ^ 1], bf[cur ^ 1], a_base, b_base, kk + 1);
        else if (kb + 1 < PASSES)
          load(af[cur ^ 1], bf[cur ^ 1], a_base + A_STEP, b_base + B_STEP, 0);
        mma_tile<T>(c, af[cur], bf[cur]);
      }
    }
  } else {
#pragma unroll(UNR ? PASSES : 1)
    for (int kb = 0; kb < PASSES; ++kb, a_base += A_STEP, b_base += B_STEP) {
#pragma unroll
      for (int kk = 0; kk < KK; ++kk) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          load_a(af[mt], a_base, mt, kk);
#pragma unroll
        for (int n2 = 0; n2 < NT / 2; ++n2) {
          uint32_t bf[4];
          load_b(bf, b_base, n2, kk);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Mma<T>::run(c[mt][2 * n2], af[mt], bf[0], bf[1]);
            Mma<T>::run(c[mt][2 * n2 + 1], af[mt], bf[2], bf[3]);
          }
        }
      }
    }
  }
}

// c += A·Bᵀ: A rows [a_row0, +16·MT) of a [·][KD] tile, B rows [b_row0, +8·NT) of a [·][KD] tile, depth KD.
// (S = Q·Kᵀ and dP = dO·Vᵀ.) Four k-steps (128 bytes of every row) a pass.
template <class T, int KD, int MT, int NT, bool PF, bool UNR>
__device__ __forceinline__ void gemm_abt(float (&c)[MT][NT][4], uint32_t sA, int a_row0,
                                         uint32_t sB, int b_row0) {
  const int lane = int(fresh_tid() % 32), x = lane & 7;
  const KChunks ac(lane / 16, x), bc((lane / 8) % 2, x);
  const uint32_t a_base = sA + (a_row0 + lane % 16) * KD * 2;
  const uint32_t b_base = sB + (b_row0 + (lane / 16) * 8 + lane % 8) * KD * 2;
  k_loop<T, MT, NT, PF, UNR, KD / 64, 4, 128, 128>(
      c, a_base, b_base,
      [&](uint32_t(&f)[4], uint32_t base, int mt, int kk) {
        ldmatrix_x4(f, base + mt * 16 * KD * 2 + ac.off[kk]);
      },
      [&](uint32_t(&f)[4], uint32_t base, int n2, int kk) {
        ldmatrix_x4(f, base + n2 * 16 * KD * 2 + bc.off[kk]);
      });
}

// c += Xᵀ·Y: X a [KD][XC] tile read transposed (columns [x_col0, +16·MT) become the rows of A), Y a [KD][YC]
// tile (columns [y_col0, +8·NT)), depth KD rows. (dV = Pᵀ·dO and dK = dSᵀ·Q.) Two k-steps (32 rows) a pass: each
// k-step's fragments are 4·(MT + NT/2) registers (24 at d128 and d256), and a deeper look-ahead than two k-steps
// spills next to the accumulators.
template <class T, int KD, int XC, int YC, int MT, int NT, bool PF, bool UNR>
__device__ __forceinline__ void gemm_atb(float (&c)[MT][NT][4], uint32_t sX, int x_col0,
                                         uint32_t sY, int y_col0) {
  const int lane = int(fresh_tid() % 32), x = lane & 7;
  const uint32_t x_base = sX + ((lane / 16) * 8 + lane % 8) * XC * 2;
  const uint32_t y_base = sY + (((lane / 8) % 2) * 8 + lane % 8) * YC * 2;
  const int xc = x_col0 / 8 + (lane / 8) % 2, yc = y_col0 / 8 + lane / 16;
  k_loop<T, MT, NT, PF, UNR, KD / 32, 2, 32 * XC * 2, 32 * YC * 2>(
      c, x_base, y_base,
      [&](uint32_t(&f)[4], uint32_t base, int mt, int kk) {
        ldmatrix_x4_trans(f, base + kk * 16 * XC * 2 + (((xc + 2 * mt) ^ x) << 4));
      },
      [&](uint32_t(&f)[4], uint32_t base, int n2, int kk) {
        ldmatrix_x4_trans(f, base + kk * 16 * YC * 2 + (((yc + 2 * n2) ^ x) << 4));
      });
}

// c += A·B: A rows [a_row0, +16·MT) of a [·][KD] tile, B a [KD][BC] tile (columns [b_col0, +8·NT)), depth KD.
// (dQ = dS·K.) Four k-steps a pass.
template <class T, int KD, int BC, int MT, int NT, bool PF, bool UNR>
__device__ __forceinline__ void gemm_ab(float (&c)[MT][NT][4], uint32_t sA, int a_row0, uint32_t sB,
                                        int b_col0) {
  const int lane = int(fresh_tid() % 32), x = lane & 7;
  const KChunks ac(lane / 16, x);
  const uint32_t a_base = sA + (a_row0 + lane % 16) * KD * 2;
  const uint32_t b_base = sB + (((lane / 8) % 2) * 8 + lane % 8) * BC * 2;
  const int bc = b_col0 / 8 + lane / 16;
  k_loop<T, MT, NT, PF, UNR, KD / 64, 4, 128, 64 * BC * 2>(
      c, a_base, b_base,
      [&](uint32_t(&f)[4], uint32_t base, int mt, int kk) {
        ldmatrix_x4(f, base + mt * 16 * KD * 2 + ac.off[kk]);
      },
      [&](uint32_t(&f)[4], uint32_t base, int n2, int kk) {
        ldmatrix_x4_trans(f, base + kk * 16 * BC * 2 + (((bc + 2 * n2) ^ x) << 4));
      });
}

template <int MT, int NT> __device__ __forceinline__ void zero(float (&c)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        c[mt][nt][e] = 0.f;
}

// Where an accumulator-layout tile's pairs go in a swizzled [·][COLS] tile (columns [col0, +8·NT), col0 a multiple
// of 8): row row0 + 16·mt + 8·hh + lane/4 has the same row % 8 for every mt and hh, so each column block's
// swizzled chunk is computed once a call (NT xors) and the rows are immediates; written per store, ptxas had
// recomputed the xor for every (row, chunk), ~45 integer instructions a tile at d128.
template <int COLS, int NT> struct AccStores {
  uint32_t at_nt[NT]; // byte offset of (mt 0, hh 0, column block nt) for this lane
  __device__ __forceinline__ AccStores(int row0, int col0, int lane) {
    const int r = row0 + lane / 4, x = r & 7;
    const uint32_t base = static_cast<uint32_t>(r * (COLS / 8) * 16 + (lane % 4) * 4);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      at_nt[nt] = base + static_cast<uint32_t>(((col0 / 8 + nt) ^ x) * 16);
  }
  __device__ __forceinline__ uint32_t at(int mt, int nt, int hh) const {
    return at_nt[nt] + (16 * mt + 8 * hh) * COLS * 2;
  }
};

// An accumulator tile (rows [row0, +16·MT), columns [col0, +8·NT)) times `mul` into a swizzled [·][COLS] tile of T.
template <class T, int COLS, int MT, int NT>
__device__ __forceinline__ void store_tile(unsigned char *tile, const float (&c)[MT][NT][4],
                                           int row0, int col0, int lane, float mul = 1.f) {
  const AccStores<COLS, NT> st(row0, col0, lane);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        *reinterpret_cast<uint32_t *>(tile + st.at(mt, nt, hh)) =
            Mma<T>::pack(c[mt][nt][2 * hh] * mul, c[mt][nt][2 * hh + 1] * mul);
}

// Packed pairs of an accumulator-layout tile (rows [row0, +16·MT), columns [col0, +8·NT)) into a swizzled
// [·][COLS] tile.
template <int COLS, int MT, int NT>
__device__ __forceinline__ void store_packed(unsigned char *tile, const uint32_t (&c)[MT][NT][2],
                                             int row0, int col0, int lane) {
  const AccStores<COLS, NT> st(row0, col0, lane);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        *reinterpret_cast<uint32_t *>(tile + st.at(mt, nt, hh)) = c[mt][nt][hh];
}

// Deterministic mode's count-in and wait as the PTX memory model's release and acquire patterns, split so that
// neither costs more than it must: a release fence and relaxed gpu-scope writes after it (one fence for several
// counters; fence.release is MEMBAR without fence.acq_rel's L1 invalidation), and relaxed polls with an acquire
// fence once one has seen the count (ld.acquire's L1 invalidation waits for its load, so an acquire poll stalls the
// warp for the round trip; a relaxed load issued before the dQ product returns under it).
__device__ __forceinline__ void release_fence() { asm volatile("fence.release.gpu;" ::: "memory"); }
__device__ __forceinline__ void acquire_fence() { asm volatile("fence.acquire.gpu;" ::: "memory"); }
__device__ __forceinline__ int ld_relaxed(const int *p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_add_relaxed(int *p, int v) {
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void store_relaxed(int *p, int v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// dQ accumulator += c (rows [row0, +16·MT), columns [col0, +8·NT) of a row block's tile at `acc`, in FragOrder:
// fragment (mt, nt) is one 512-byte run, lane l's four floats at 16l in it).
template <int D, int MT, int NT>
__device__ __forceinline__ void add_dq(float *acc, const float (&c)[MT][NT][4], int row0, int col0,
                                       int lane) {
  float *base = acc + (int64_t(row0 / 16) * (D / 8) + col0 / 8) * 128 + 4 * lane;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float *dst = base + (mt * (D / 8) + nt) * 128;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(c[mt][nt][0]),
                   "f"(c[mt][nt][1]), "f"(c[mt][nt][2]), "f"(c[mt][nt][3])
                   : "memory");
#else
#pragma unroll
      for (int e = 0; e < 4; ++e)
        atomicAdd(dst + e, c[mt][nt][e]);
#endif
    }
}

template <class T, int D, int BM, int BN, int W, int WM, bool PF, int WMQ, int MODE>
__global__ void __launch_bounds__(W * 32, 1) fa2_bwd_main(const Args<T> a) {
  constexpr bool kDet = MODE == kModeDet, kRemap = MODE == kModeRemap;
  constexpr int kThreads = W * 32;
  // S and dP: warp tile SR x SC; dQ: SR x QC; dK and dV: KR x KC.
  constexpr int WN = W / WM, SR = BM / WM, SC = BN / WN, MT = SR / 16, NT = SC / 8;
  // dQ is computed and added in column chunks of QCH: at head_dim 256 a whole slice would be 64 more registers
  // next to the 128 of dK and dV.
  // dQ has its own row warps (dq_layout): WMQ along the rows, WNQ along head_dim, QR x QC a warp.
  constexpr int WNQ = W / WMQ, QR = BM / WMQ, MQ = QR / 16, QC = D / WNQ, QCH = D >= 256 ? 32 : QC;
  constexpr int WK = kv_warps_n(BN, W), WKD = W / WK, KR = BN / WK, KC = D / WKD, MK = KR / 16,
                NK = KC / 8;
  static_assert(SR % 16 == 0 && SC % 16 == 0 && QR % 16 == 0 && QC % 16 == 0 && KR % 16 == 0 &&
                    KC % 16 == 0,
                "warp slices must be multiples of 16");
  static_assert(2 * BM <= 4 * kThreads, "LSE and D need BM / 2 copy threads");
  // frag_prefetch: the products that load their fragments one k-step ahead (traits.hpp).
  constexpr int kPf = PF ? kPfAll : 0;
  constexpr bool kUnroll = unrolled_passes(D, W);

  // Shared memory: K, V, P, dS, then `stages` slots of (Q, dO, LSE₂, D).
  constexpr uint32_t kKV = BN * D * 2, kPS = BM * BN * 2, kQ = BM * D * 2,
                     kSlot = 2 * kQ + 2 * BM * 4;
  constexpr uint32_t oK = 0, oV = kKV, oP = 2 * kKV, oDS = oP + kPS, oSlots = oDS + kPS;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sbase = smem_u32(smem);

  // This CTA's column block, kv head and batch entry, read from the grid's indices (traits.hpp, launch_grid)
  // wherever needed rather than kept live across the loop. The indices and the arguments are warp-uniform, so what
  // derives from them runs on the uniform datapath (a shared-memory copy of the decoded values put their
  // dependent address arithmetic on the vector pipe: 2% slower at d128). Natural order: rightmost column block
  // first when deterministic (a CTA waits only on columns to its right), otherwise leftmost first.
  auto pair = [&] { return unsigned(fresh_ctaid<2>() * a.per + fresh_ctaid<0>()); };
  auto col = [&] {
    if constexpr (kRemap)
      return fresh_ctaid<1>();
    else
      return kDet ? a.n_col_blocks - 1 - fresh_ctaid<0>() : fresh_ctaid<0>();
  };
  auto kv_head = [&] {
    if constexpr (kRemap)
      return int(a.heads_kv.mod(pair()));
    else
      return fresh_ctaid<1>();
  };
  auto batch = [&] {
    if constexpr (kRemap)
      return int(a.heads_kv.div(pair()));
    else
      return fresh_ctaid<2>();
  };
  if constexpr (kRemap)
    if (int(pair()) >= a.bh_count)
      return; // the last section's missing pairs
  // First row block that column block n visits (n_row_blocks: none); int arithmetic of row_blocks_for.
  auto first_row_block = [&](int n) {
    if (!a.causal)
      return 0;
    const int first_row = n * BN - (a.seqlen_kv - a.seqlen_q);
    if (first_row > a.seqlen_q - 1)
      return a.n_row_blocks;
    return first_row <= 0 ? 0 : int(unsigned(first_row) / BM);
  };

  // row_order rotated: the column block's first row block, kept in shared memory (one LDS a use) rather than
  // a register across the loop, and read after the barrier below.
  __shared__ int rot_start;
  if (threadIdx.x == 0)
    rot_start = a.rotated ? rotated_start(col(), a.n_row_blocks, a.n_col_blocks) : 0;
  __syncthreads();

  {
    const int n = col(), hkv = kv_head(), b = batch();
    const int64_t kv_off = int64_t(b) * a.ks.batch + int64_t(hkv) * a.ks.head;
    load_rows<D, BN, kThreads>(sbase + oK, a.k + kv_off, a.ks.seq, n * BN, a.seqlen_kv,
                               threadIdx.x);
    load_rows<D, BN, kThreads>(sbase + oV, a.v + kv_off, a.ks.seq, n * BN, a.seqlen_kv,
                               threadIdx.x);
  }

  // Iteration `it` of the loop is row block first + it % rows of group head it / rows (rows: the column block's
  // row blocks), derived afresh each time so that the loop carries nothing but `it`, dK and dV.
  struct Step {
    int g, m;
  };
  auto step_of = [&](int it) {
    const int first = first_row_block(col()), rows = a.n_row_blocks - first;
    // Rotated (non-causal, so first is 0): row block (start + j) mod rows.
    const auto rotate = [&](int m) {
      if (!a.rotated)
        return m;
      m += rot_start;
      return m >= rows ? m - rows : m;
    };
    if (a.group == 1) // no GQA group: no division (~25 instructions, twice a row block)
      return Step{0, rotate(first + it)};
    const int g = it / rows;
    return Step{g, rotate(first + it - g * rows)};
  };
  auto iterations = [&] { return (a.n_row_blocks - first_row_block(col())) * a.group; };

  // Q, dO, LSE₂ and D of row block m of group head g into `slot`.
  auto load_block = [&](Step st, int slot, int tid) {
    const int h = kv_head() * a.group + st.g, b = batch(), m = st.m;
    const uint32_t s = sbase + oSlots + slot * kSlot;
    const int64_t q_off = int64_t(b) * a.qs.batch + int64_t(h) * a.qs.head;
    load_rows<D, BM, kThreads>(s, a.q + q_off, a.qs.seq, m * BM, a.seqlen_q, tid);
    load_rows<D, BM, kThreads>(s + kQ, a.dout + q_off, a.qs.seq, m * BM, a.seqlen_q, tid);
    const int64_t row = (int64_t(b) * a.heads_q + h) * a.rows_pad + int64_t(m) * BM;
    if (tid < BM / 4)
      cp_async_16(s + 2 * kQ + tid * 16, a.lse2 + row + tid * 4, true);
    else if (tid < BM / 2)
      cp_async_16(s + 2 * kQ + BM * 4 + (tid - BM / 4) * 16, a.delta + row + (tid - BM / 4) * 4,
                  true);
  };
  if (iterations() > 0)
    load_block(step_of(0), 0, threadIdx.x);
  cp_async_commit();

  // Deterministic: how many column blocks add to row block m before this one (rotated: those that reach it first
  // at one speed; otherwise those to its right), and how many add in all (the last resets the counter).
  auto add_rank = [&](int m) {
    const int n = col(), cols = int(col_blocks_for(m, BM, BN, a.seqlen_q, a.seqlen_kv, a.causal));
    return int2{a.rotated ? rotated_rank(n, m, a.n_row_blocks, cols) : cols - 1 - n, cols};
  };
  // Deterministic: counts every warp's dQ adds to the previous row block in (each warp's counter in the
  // semaphores); the last column block of the row block resets the counters instead. One thread releases for the
  // CTA: a CTA barrier orders every warp's adds before its fence, and one fence a row block costs less than a
  // release by each warp (eight fences a row block took 6-7% of a deterministic run, HISTORY.md row 29). Called
  // one phase after the adds, after the next row block's second barrier, so that the fence's wait for the
  // reductions to complete falls on reductions issued long before, not on those just issued. The waiting lane 0
  // of each warp leaves its counter and whether this column block is the row block's last in shared memory for it
  // (recomputed there, they spilled next to the accumulators), in the slot of its row block's parity: the warps
  // write the next row block's while the releasing thread reads the previous one's, with no barrier between.
  __shared__ int *pending_ctr[2][kDet ? W : 1];
  __shared__ int pending_last[2][kDet ? W : 1];
  auto signal_added = [&](int it_added) {
    if (fresh_tid() != 0)
      return;
    release_fence();
    const int par = it_added & 1;
#pragma unroll 1
    for (int w = 0; w < W; ++w)
      if (pending_last[par][w]) // the last of this row block: leave the counter as it was found
        store_relaxed(pending_ctr[par][w], 0);
      else
        red_add_relaxed(pending_ctr[par][w], 1);
  };

  float dk[MK][NK][4], dv[MK][NK][4];
  zero(dk);
  zero(dv);

  for (int it = 0; it < iterations(); ++it) {
    // Thread coordinates and warp slices, re-derived every iteration (fresh_tid).
    const unsigned tid = fresh_tid();
    const int warp = int(tid / 32), lane = int(tid % 32);
    const int s_row0 = (warp / WN) * SR, s_col0 = (warp % WN) * SC;
    const int slot = a.stages == 2 ? (it & 1) : 0;

    cp_async_wait<0>();
    __syncthreads(); // this row block landed; every warp is done with P, dS and the other slot
    if (a.stages == 2 && it + 1 < iterations())
      load_block(step_of(it + 1), slot ^ 1, int(tid));
    cp_async_commit();

    const Step st = step_of(it);
    const int g = st.g, m = st.m;
    const int n = col(), k0 = n * BN;
    const uint32_t oQ = oSlots + slot * kSlot, oDO = oQ + kQ;
    const float *lse2 = reinterpret_cast<const float *>(smem + oQ + 2 * kQ);
    const float *delta = lse2 + BM;

    // S = Q·Kᵀ.
    float p[MT][NT][4];
    zero(p);
    gemm_abt<T, D, MT, NT, (kPf & kPfS) != 0, kUnroll>(p, sbase + oQ, s_row0, sbase + oK, s_col0);
    const int diag = a.seqlen_kv - a.seqlen_q;
    const bool need_mask =
        k0 + BN > a.seqlen_kv || (a.causal && m * BM + diag < k0 + BN - 1); // CTA-uniform
    // Tile-local bounds: local key kl is past the sequence end when kl >= key_lim, right of the diagonal for
    // local row rl when kl - rl > diag_lim.
    const int key_lim = a.seqlen_kv - k0, diag_lim = a.causal ? m * BM + diag - k0 : BN;
    // P = exp2(S·scale·log2e − LSE₂) (masked: 0) in place of S, dP = dO·Vᵀ, then dS = P∘(dP − D); P and dS to
    // shared memory in T. Two copies of the whole block, chosen per tile: with the mask where the tile holds the
    // sequence end or the diagonal, without it elsewhere (one loop under `need_mask` compiled to a select and
    // three predicate instructions per score on every tile). dP's product sits in the same straight-line block
    // as the exponents, so that its MMAs issue between the MUFU.EX2s: with the branch between them, every warp
    // of a CTA ran its 64 exponents back to back on the MUFU pipe while the tensor pipe idled (ncu, d64). P is
    // stored after dP's product: a shared store before its ldmatrix would keep them behind it.
    auto p_and_ds = [&](auto masked) {
      uint32_t pp[MT][NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int rl = s_row0 + mt * 16 + lane / 4 + 8 * hh;
          const float l2 = lse2[rl];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              float &x = p[mt][nt][2 * hh + j];
              x = fast_exp2(fmaf(x, a.scale_log2, -l2));
              if constexpr (decltype(masked)::value) {
                const int kl = s_col0 + nt * 8 + 2 * (lane % 4) + j;
                if (kl >= key_lim || kl - rl > diag_lim)
                  x = 0.f;
              }
            }
            pp[mt][nt][hh] = Mma<T>::pack(p[mt][nt][2 * hh], p[mt][nt][2 * hh + 1]);
          }
        }
      float dp[MT][NT][4];
      zero(dp);
      gemm_abt<T, D, MT, NT, (kPf & kPfDP) != 0, kUnroll>(dp, sbase + oDO, s_row0, sbase + oV,
                                                          s_col0);
      store_packed<BN>(smem + oP, pp, s_row0, s_col0, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float dl = delta[s_row0 + mt * 16 + lane / 4 + 8 * hh];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            pp[mt][nt][hh] = Mma<T>::pack(p[mt][nt][2 * hh] * (dp[mt][nt][2 * hh] - dl),
                                          p[mt][nt][2 * hh + 1] * (dp[mt][nt][2 * hh + 1] - dl));
        }
      store_packed<BN>(smem + oDS, pp, s_row0, s_col0, lane);
    };
    if (need_mask)
      p_and_ds(std::true_type{});
    else
      p_and_ds(std::false_type{});
    __syncthreads(); // P and dS complete
    if (kDet && it > 0)
      signal_added(it - 1); // the previous row block's adds: two CTA barriers and this S and dP ago

    {
      const int w2 = int(fresh_tid() / 32);
      const int k_row0 = (w2 / WKD) * KR, k_col0 = (w2 % WKD) * KC;
      gemm_atb<T, BM, BN, D, MK, NK, (kPf & kPfKV) != 0, kUnroll>(dv, sbase + oP, k_row0,
                                                                  sbase + oDO, k_col0);
      gemm_atb<T, BM, BN, D, MK, NK, (kPf & kPfKV) != 0, kUnroll>(dk, sbase + oDS, k_row0,
                                                                  sbase + oQ, k_col0);
    }

    {
      const unsigned t3 = fresh_tid();
      const int w3 = int(t3 / 32), l3 = int(t3 % 32);
      const int q_row0 = (w3 / WNQ) * QR, q_col0 = (w3 % WNQ) * QC;
      const int h = kv_head() * a.group + g, b = batch();
      float *acc = a.dq_acc + ((int64_t(b) * a.heads_q + h) * a.rows_pad + int64_t(m) * BM) * D;
      int *ctr = a.sem + ((int64_t(b) * a.heads_q + h) * a.n_row_blocks + m) * W + w3;
      // Deterministic: the counter, read before the first dQ product so that the load returns under it.
      int seen = 0;
      if (kDet && l3 == 0)
        seen = ld_relaxed(ctr);
#pragma unroll
      for (int ch = 0; ch < QC / QCH; ++ch) {
        float dq[MQ][QCH / 8][4];
        zero(dq);
        gemm_ab<T, BN, D, MQ, QCH / 8, (kPf & kPfDQ) != 0, kUnroll>(dq, sbase + oDS, q_row0,
                                                                    sbase + oK, q_col0 + ch * QCH);
        if (kDet && ch == 0) {
          const int2 o = add_rank(m);
          // One lane polls, backing off a little so that waiting warps do not crowd the L2 slices that
          // serve the reductions they wait for.
          if (l3 == 0) {
            while (seen != o.x) {
              __nanosleep(32);
              seen = ld_relaxed(ctr);
            }
            acquire_fence();
            pending_ctr[it & 1][w3] = ctr, pending_last[it & 1][w3] = o.x == o.y - 1;
          }
          __syncwarp();
        }
        add_dq<D>(acc, dq, q_row0, q_col0 + ch * QCH, l3);
      }
    }

    if (a.stages == 1 && it + 1 < iterations()) {
      __syncthreads(); // every warp is done with the only slot
      load_block(step_of(it + 1), 0, int(fresh_tid()));
      cp_async_commit();
    }
  }

  // Epilogue: dK (scaled) and dV through the K and V tiles, then 16-byte stores of the rows before the end.
  const int tid = int(fresh_tid()), warp = tid / 32, lane = tid % 32;
  const int k_row0 = (warp / WKD) * KR, k_col0 = (warp % WKD) * KC;
  const int k0 = col() * BN, hkv = kv_head(), b = batch();
  cp_async_wait<0>();
  __syncthreads(); // every warp is done with K and V (and, with no row block, K and V have landed)
  // The last row block's adds, every warp's ordered by the barrier above.
  if (kDet && iterations() > 0)
    signal_added(iterations() - 1);
  store_tile<T, D>(smem + oK, dk, k_row0, k_col0, lane, a.scale);
  store_tile<T, D>(smem + oV, dv, k_row0, k_col0, lane);
  __syncthreads();
  const int64_t kv_off = int64_t(b) * a.ks.batch + int64_t(hkv) * a.ks.head;
  T *dkg = a.dk + kv_off, *dvg = a.dv + kv_off;
  for (int idx = tid; idx < BN * D / 8; idx += kThreads) {
    const int r = idx / (D / 8), c = idx % (D / 8);
    if (k0 + r < a.seqlen_kv) {
      const int64_t off = int64_t(k0 + r) * a.ks.seq + c * 8;
      *reinterpret_cast<uint4 *>(dkg + off) =
          *reinterpret_cast<const uint4 *>(smem + oK + swz<D>(r, c));
      *reinterpret_cast<uint4 *>(dvg + off) =
          *reinterpret_cast<const uint4 *>(smem + oV + swz<D>(r, c));
    }
  }
}

template <class T, int D, int BM, int BN, int W, int WM, bool PF, int WMQ, int MODE>
void launch_tile(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
                 cudaStream_t stream) {
  const Workspace ws = workspace_layout(p, c);
  unsigned char *w = static_cast<unsigned char *>(args.workspace);
  Args<T> a{};
  a.q = static_cast<const T *>(args.q);
  a.k = static_cast<const T *>(args.k);
  a.v = static_cast<const T *>(args.v);
  a.o = static_cast<const T *>(args.o);
  a.dout = static_cast<const T *>(args.dout);
  a.lse = args.lse;
  a.dq = static_cast<T *>(args.dq);
  a.dk = static_cast<T *>(args.dk);
  a.dv = static_cast<T *>(args.dv);
  a.dq_acc = reinterpret_cast<float *>(w + ws.dq_acc);
  a.lse2 = reinterpret_cast<float *>(w + ws.lse2);
  a.delta = reinterpret_cast<float *>(w + ws.delta);
  a.sem = static_cast<int *>(args.semaphores);
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.seqlen_kv = static_cast<int>(p.seqlen_kv);
  a.rows_pad = static_cast<int>(padded_rows(p.seqlen_q, c.block_m));
  a.heads_q = static_cast<int>(p.heads_q);
  a.group = static_cast<int>(p.group_size());
  a.qs = p.q_strides();
  a.ks = p.kv_strides();
  a.scale = static_cast<float>(p.softmax_scale());
  a.scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
  a.stages = c.stages;
  a.n_row_blocks = static_cast<int>(num_row_blocks(p, c));
  a.n_col_blocks = static_cast<int>(num_col_blocks(p, c));
  a.causal = p.causal;
  a.rotated = c.rotated != 0 && !p.causal;
  const LaunchGrid lg = launch_grid(p, c, kernels::sm_count(), kernels::l2_bytes());
  a.per = static_cast<int>(lg.per);
  a.bh_count = static_cast<int>(p.heads_kv * p.batch);
  a.heads_kv = kernels::FastDiv(static_cast<uint32_t>(p.heads_kv));

  const kernels::bwd::RowArgs<T> rows = kernels::bwd::row_args<T>(p, args, c.block_m);
  kernels::bwd::launch_preprocess<T, D>(rows, p.batch, stream);

  auto *kernel = fa2_bwd_main<T, D, BM, BN, W, WM, PF, WMQ, MODE>;
  const int64_t smem = smem_bytes(D, c);
  if (smem > 48 * 1024)
    FB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(lg.x), static_cast<unsigned>(lg.y),
                  static_cast<unsigned>(lg.z));
  kernel<<<grid, W * 32, static_cast<size_t>(smem), stream>>>(a);
  FB_CHECK_LAUNCH();

  kernels::bwd::launch_convert<T, D, FragOrder>(rows, p.batch, stream);
}

template <class T, int D, int BM, int BN, int W, int WM, bool PF, int WMQ, int MODE>
std::vector<KernelDesc> describe_tile(const AttentionProblem &p, const Params &c) {
  return {kernels::bwd::preprocess_desc<T, D>("fa2_bwd", p, c.block_m),
          {"fa2_bwd_main",
           reinterpret_cast<const void *>(&fa2_bwd_main<T, D, BM, BN, W, WM, PF, WMQ, MODE>),
           W * 32, static_cast<size_t>(smem_bytes(D, c)),
           num_col_blocks(p, c) * p.heads_kv * p.batch},
          kernels::bwd::convert_desc<T, D, FragOrder>("fa2_bwd", p)};
}

} // namespace detail

// The launch and kernel-list functions of the compiled instantiation for (T, D, tile shape), or nulls when that
// shape and mode is not compiled (tile_compiled() false). One instantiation file compiles one (T, D) slice.
template <class T, int D> Instance pick_tile(const Params &c) {
  const int mode = mode_of(c.deterministic, c.order);
#define FB_FA2_BWD_TILE_MODE(BM, BN, W, WM, PF, WMQ, MODE)                                         \
  if constexpr (tile_compiled(D, BM, BN, W, WM, PF, WMQ, MODE))                                    \
    if (c.block_m == BM && c.block_n == BN && c.warps == W && c.warp_m == WM &&                    \
        c.frag_prefetch == PF && dq_row_warps(c) == WMQ && mode == MODE)                           \
      return {&detail::launch_tile<T, D, BM, BN, W, WM, PF, WMQ, MODE>,                            \
              &detail::describe_tile<T, D, BM, BN, W, WM, PF, WMQ, MODE>};
#define FB_FA2_BWD_TILE(BM, BN, W, WM, PF, WMQ)                                                    \
  FB_FA2_BWD_TILE_MODE(BM, BN, W, WM, PF, WMQ, kModePlain)                                         \
  FB_FA2_BWD_TILE_MODE(BM, BN, W, WM, PF, WMQ, kModeRemap)                                         \
  FB_FA2_BWD_TILE_MODE(BM, BN, W, WM, PF, WMQ, kModeDet)
  FB_FA2_BWD_TILE(64, 64, 4, 2, false, 2)
  FB_FA2_BWD_TILE(64, 64, 4, 2, true, 2)
  FB_FA2_BWD_TILE(64, 64, 8, 2, false, 2)
  FB_FA2_BWD_TILE(64, 64, 8, 2, true, 2)
  FB_FA2_BWD_TILE(64, 64, 8, 4, false, 4)
  FB_FA2_BWD_TILE(64, 64, 8, 4, true, 4)
  FB_FA2_BWD_TILE(64, 128, 8, 2, false, 2)
  FB_FA2_BWD_TILE(64, 128, 8, 2, true, 2)
  FB_FA2_BWD_TILE(64, 128, 8, 4, false, 4)
  FB_FA2_BWD_TILE(64, 128, 8, 4, true, 4)
  FB_FA2_BWD_TILE(128, 64, 8, 2, false, 2)
  FB_FA2_BWD_TILE(128, 64, 8, 2, true, 2)
  FB_FA2_BWD_TILE(128, 64, 8, 4, false, 4)
  FB_FA2_BWD_TILE(128, 64, 8, 4, true, 4)
  FB_FA2_BWD_TILE(128, 128, 8, 2, false, 2)
  FB_FA2_BWD_TILE(128, 128, 8, 2, true, 2)
  FB_FA2_BWD_TILE(128, 128, 8, 4, false, 4)
  FB_FA2_BWD_TILE(128, 128, 8, 4, true, 4)
  // dQ with 4 row warps where S and dP have 2 (dq_layout m4).
  FB_FA2_BWD_TILE(128, 128, 8, 2, false, 4)
  FB_FA2_BWD_TILE(128, 128, 8, 2, true, 4)
#undef FB_FA2_BWD_TILE
#undef FB_FA2_BWD_TILE_MODE
  return {};
}

} // namespace fb::fa2_bwd
