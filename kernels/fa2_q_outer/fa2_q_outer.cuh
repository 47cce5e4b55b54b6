// FlashAttention-2 forward (Q-outer) on tensor cores: mma.sync m16n8k16, ldmatrix, cp.async.
//
// What it changes relative to FA1 (fa1_kv_outer) and why:
//  - The loops are swapped. One CTA owns one Q tile for its whole life and walks the K/V tiles, so O, the row max
//    m and the row sum l never leave registers: FA1's per-step O/l/m round trip through HBM and its Q re-reads are
//    gone, and the HBM traffic falls to Q + O once and K/V once per Q tile (traffic.hpp, traffic_bytes).
//  - O is kept unscaled (a sum of exp(S - m)·V) and divided by l once at the end, instead of FA1's divide at every
//    step: one rescale by exp(m_old - m_new) per tile and row is all the loop pays for the online softmax.
//  - Both GEMMs run on tensor cores (fp16/bf16 in, fp32 accumulate). S stays in the accumulator registers, and
//    since the m16n8 accumulator layout of two adjacent 8-key tiles is exactly the A-operand layout of a 16-deep
//    MMA step, P goes from S to the P·V product without touching shared memory.
//  - K/V tiles stream through a `stages`-deep cp.async ring so the next tile's loads overlap this tile's math.
//    Shared tiles are XOR-swizzled in 16-byte chunks (chunk ^ row % 8) so that ldmatrix's eight row addresses
//    and the cp.async writes each hit distinct banks without padding.
//  - Warp layout is a compile-time choice. split_q (FA2's): each warp owns block_m / warps query rows and sweeps
//    the whole K/V tile, so row max and row sum stay inside a quad of lanes and warps never talk inside the loop.
//    split_k (FA1's): each warp owns block_n / warps keys of every K/V tile for all query rows; the tile's row max
//    is exchanged through shared memory, and the P·V partials of all warps are summed through a shared fp32
//    buffer in head_dim chunks every tile (plus two barriers per chunk). It is kept to measure what FA2's
//    partition buys.
// Causal: K/V tiles past a Q tile's last visible key are never loaded; only tiles that straddle the diagonal or
// the sequence end evaluate the mask. Q tiles are launched heaviest first so that the grid's tail is short CTAs.
// Rows that see no key keep m = -inf and l = 0 and come out as O = 0, LSE = -inf (see softmax_offset).
#pragma once

#include "kernels/fa2_q_outer/traits.hpp"

#include "flashbench/check.hpp"
#include "kernels/common/mma.cuh"

#include <cuda_runtime.h>

namespace fb::fa2 {

namespace detail {

using namespace fb::kernels;

template <class T> struct KernelArgs {
  const T *q;
  const T *k;
  const T *v;
  T *o;
  float *lse;
  int64_t seqlen_q, seqlen_kv;
  int64_t heads_q, group;
  Strides qs, ks;
  float scale_log2;
  int stages;
  int num_q_tiles;
  bool causal;
};

constexpr float kLn2 = 0.69314718055994531f;

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of D columns.
template <int D> __device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>((row * (D / 8) + (chunk ^ (row & 7))) * 16);
}

// ldmatrix addresses: every row a lane names is (multiple of 8) + lane % 8, so its swizzle key is lane % 8 and the
// chunk of k-step `kk` is (2·kk + c) ^ (lane % 8) = 8·(kk / 4) + ((2·(kk % 4) + c) ^ (lane % 8)). The four
// possible low parts are computed once; the loops add compile-time constants.
struct LaneChunks {
  uint32_t off[4];
  __device__ __forceinline__ LaneChunks(int c, int lane) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      off[i] = static_cast<uint32_t>(((2 * i + c) ^ (lane & 7)) * 16);
  }
  __device__ __forceinline__ uint32_t at(int kk) const { return (kk / 4) * 128 + off[kk % 4]; }
};

using fb::kernels::fast_exp2; // kernels/common/mma.cuh

// Hides a value from the optimiser: the compiler can neither hoist what is computed from it out of a loop nor keep
// per-iteration copies of it live. Used for the cp.async addressing inside the K/V loop, whose loop-invariant parts
// (one 64-bit row offset per chunk) ptxas otherwise hoists into ~30 registers and, at 32 rows/warp, spills.
__device__ __forceinline__ int64_t opaque(int64_t x) {
  asm volatile("" : "+l"(x));
  return x;
}

// threadIdx.x and the lane index read afresh (asm volatile): values derived from them cannot be hoisted out of, or
// kept live across, the K/V loop. Used by split_q where registers are the limit (the epilogue, the mask branch).
__device__ __forceinline__ int fresh_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}
__device__ __forceinline__ int fresh_lane() {
  int t;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(t));
  return t;
}

// Rows [row0, row0 + ROWS) of a [seq, D] slice (row stride `stride` elements) into a swizzled tile; rows at or
// past `limit` are zero-filled. Thread tid copies column chunk tid % (D/8) of rows tid / (D/8) + it·RSTEP: one
// 64-bit pointer walked by RSTEP rows per chunk and one remaining-rows count, both opaque, so the loop costs a
// handful of registers whatever ROWS is.
// WALK = false keeps the plain per-chunk addressing (split_k and the prologue, where it compiles tighter).
template <int D, int ROWS, int THREADS, bool WALK = false, class T>
__device__ __forceinline__ void load_tile(uint32_t dst, const T *src, int64_t stride, int64_t row0,
                                          int64_t limit, int tid) {
  constexpr int kChunks = ROWS * D / 8;
  if constexpr (WALK && THREADS % (D / 8) == 0 && kChunks % THREADS == 0) {
    constexpr int RSTEP = THREADS / (D / 8);
    const int r0 = tid / (D / 8), ch = tid % (D / 8);
    const int64_t st = opaque(stride);
    const int64_t rem = opaque(limit - row0) - r0; // rows left from this thread's first row
    const T *p = src + (row0 + r0) * st + ch * 8;
    const uint32_t d0 =
        dst + swz<D>(r0, ch); // r0 + it·RSTEP has the same row % 8 when RSTEP % 8 == 0
#pragma unroll
    for (int it = 0; it < kChunks / THREADS; ++it) {
      const bool ok = it * RSTEP < rem;
      const uint32_t d =
          RSTEP % 8 == 0 ? d0 + it * RSTEP * D * 2 : dst + swz<D>(r0 + it * RSTEP, ch);
      cp_async_16(d, ok ? p : src, ok);
      p += RSTEP * st;
    }
  } else {
#pragma unroll
    for (int it = 0; it < (kChunks + THREADS - 1) / THREADS; ++it) {
      const int idx = it * THREADS + tid;
      if (kChunks % THREADS == 0 || idx < kChunks) {
        const int r = idx / (D / 8), ch = idx % (D / 8);
        const bool ok = row0 + r < limit;
        cp_async_16(dst + swz<D>(r, ch), ok ? src + (row0 + r) * stride + ch * 8 : src, ok);
      }
    }
  }
}

// S = Q·Kᵀ for MT row tiles (A from sQ at q_row0) and NT key tiles (B from sK at k_row0), full head_dim depth.
// ROLLED keeps the head_dim loop rolled (swizzled addresses computed at run time): split_k's warps each hold all
// row tiles, and a fully unrolled loop lets the scheduler hoist every Q fragment of the tile at once and spill.
template <class T, int D, int MT, int NT, bool ROLLED = false>
__device__ __forceinline__ void qk_gemm(float (&s)[MT][NT][4], uint32_t sQ, int q_row0, uint32_t sK,
                                        int k_row0, int lane) {
  const LaneChunks qc(lane / 16, lane), kc((lane / 8) % 2, lane);
  const uint32_t q_base = sQ + (q_row0 + lane % 16) * D * 2;
  const uint32_t k_base = sK + (k_row0 + (lane / 16) * 8 + lane % 8) * D * 2;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[mt][nt][e] = 0.f;
  // One k-step: the MT Q fragments first, then one 16-key K fragment at a time feeding every row tile, so the live
  // operands are 4·MT + 4 registers (not 4·MT + 2·NT) and each K fragment is still read once per warp.
  // ROLLED (split_k, many row tiles per warp) keeps version 1's order: every K fragment of the step first, then one
  // Q fragment per row tile.
  auto step_k_first = [&](uint32_t q_off, uint32_t k_off) {
    uint32_t kb[NT / 2][4];
#pragma unroll
    for (int n2 = 0; n2 < NT / 2; ++n2)
      ldmatrix_x4(kb[n2], k_base + n2 * 16 * D * 2 + k_off);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t qa[4];
      ldmatrix_x4(qa, q_base + mt * 16 * D * 2 + q_off);
#pragma unroll
      for (int n2 = 0; n2 < NT / 2; ++n2) {
        Mma<T>::run(s[mt][2 * n2], qa, kb[n2][0], kb[n2][1]);
        Mma<T>::run(s[mt][2 * n2 + 1], qa, kb[n2][2], kb[n2][3]);
      }
    }
  };
  auto step = [&](uint32_t q_off, uint32_t k_off) {
    uint32_t qa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldmatrix_x4(qa[mt], q_base + mt * 16 * D * 2 + q_off);
#pragma unroll
    for (int n2 = 0; n2 < NT / 2; ++n2) {
      uint32_t kb[4];
      ldmatrix_x4(kb, k_base + n2 * 16 * D * 2 + k_off);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma<T>::run(s[mt][2 * n2], qa[mt], kb[0], kb[1]);
        Mma<T>::run(s[mt][2 * n2 + 1], qa[mt], kb[2], kb[3]);
      }
    }
  };
  if constexpr (ROLLED) {
    const int x = lane & 7, qcol = lane / 16, kcol = (lane / 8) % 2;
#pragma unroll 1
    for (int kk = 0; kk < D / 16; ++kk)
      step_k_first(static_cast<uint32_t>(((2 * kk + qcol) ^ x) * 16),
                   static_cast<uint32_t>(((2 * kk + kcol) ^ x) * 16));
  } else {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      step(qc.at(kk), kc.at(kk));
  }
}

// Masks scores of keys past the sequence end or (causal) right of the diagonal. Rows are absolute query indices.
template <int MT, int NT>
__device__ __forceinline__ void apply_mask(float (&s)[MT][NT][4], int64_t row0, int64_t key0,
                                           int lane, int64_t seqlen_q, int64_t seqlen_kv,
                                           bool causal) {
  const int64_t diag = seqlen_kv - seqlen_q;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row0 + mt * 16 + lane / 4 + 8 * (e / 2);
        const int64_t key = key0 + nt * 8 + 2 * (lane % 4) + (e % 2);
        if (key >= seqlen_kv || (causal && key > row + diag))
          s[mt][nt][e] = -INFINITY;
      }
}

// split_q's mask in tile-local int coordinates: key index kl (0..BN) of the tile against `key_lim` (keys of the
// tile before the sequence end) and, causal, kl - rl against `diag_lim` (the warp's first row sees tile keys up to
// diag_lim + rl, rl the row within the warp). Both bounds are clamped into int range by the caller.
template <int MT, int NT>
__device__ __forceinline__ void apply_mask_local(float (&s)[MT][NT][4], int key_lim, int diag_lim,
                                                 int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rl = mt * 16 + lane / 4 + 8 * (e / 2);
        const int kl = nt * 8 + 2 * (lane % 4) + (e % 2);
        if (kl >= key_lim || kl - rl > diag_lim)
          s[mt][nt][e] = -INFINITY;
      }
}

// P (in S's registers, fp32) -> A fragments of the P·V product, one per 16-key step.
template <class T, int MT, int NT>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[MT][NT / 2][4], const float (&s)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int kt = 0; kt < NT / 2; ++kt) {
      pa[mt][kt][0] = Mma<T>::pack(s[mt][2 * kt][0], s[mt][2 * kt][1]);
      pa[mt][kt][1] = Mma<T>::pack(s[mt][2 * kt][2], s[mt][2 * kt][3]);
      pa[mt][kt][2] = Mma<T>::pack(s[mt][2 * kt + 1][0], s[mt][2 * kt + 1][1]);
      pa[mt][kt][3] = Mma<T>::pack(s[mt][2 * kt + 1][2], s[mt][2 * kt + 1][3]);
    }
}

// acc[mt][dt] += P·V for KT 16-key steps (V rows from v_row0) and DT 8-column tiles starting at column tile dt0.
template <class T, int D, int MT, int KT, int DT>
__device__ __forceinline__ void pv_gemm(float (&acc)[MT][DT][4], const uint32_t (&pa)[MT][KT][4],
                                        uint32_t sV, int v_row0, int dt0, int lane) {
  const LaneChunks vc(lane / 16, lane);
  const uint32_t v_base = sV + (v_row0 + ((lane / 8) % 2) * 8 + lane % 8) * D * 2;
#pragma unroll
  for (int kt = 0; kt < KT; ++kt)
#pragma unroll
    for (int d2 = 0; d2 < DT / 2; ++d2) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, v_base + kt * 16 * D * 2 + vc.at(dt0 / 2 + d2));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma<T>::run(acc[mt][2 * d2], pa[mt][kt], vb[0], vb[1]);
        Mma<T>::run(acc[mt][2 * d2 + 1], pa[mt][kt], vb[2], vb[3]);
      }
    }
}

template <class T, int D, int BM, int BN, int W, bool SQ>
__device__ __forceinline__ void kernel_body(const KernelArgs<T> &a);

// split_q: __launch_bounds__(threads, 1): no occupancy-driven register cap, so ptxas never trades spills for occupancy (it
// did, 8-56 bytes, on small tiles); the shapes compiled are the spill-free ones anyway (traits.hpp).
template <class T, int D, int BM, int BN, int W, bool SQ>
__global__ void __launch_bounds__(W * 32, 1) fa2_q_outer_kernel(const KernelArgs<T> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (sm90_only(D, BM, BN, W,
                          SQ)) { // spills on sm_80: never launched there (supports() says why)
    __trap();
  } else
#endif
  {
    kernel_body<T, D, BM, BN, W, SQ>(a);
  }
}

// split_k keeps version 1's plain launch bounds: with the min-blocks hint its d128 64x128x8 tile spills 4-24 bytes.
template <class T, int D, int BM, int BN, int W>
__global__ void __launch_bounds__(W * 32) fa2_split_k_kernel(const KernelArgs<T> a) {
  kernel_body<T, D, BM, BN, W, false>(a);
}

template <class T, int D, int BM, int BN, int W, bool SQ>
__device__ __forceinline__ void kernel_body(const KernelArgs<T> &a) {
  constexpr int kThreads = W * 32;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // Heaviest Q tiles (causal: the last ones) first.
  const int64_t qt = a.num_q_tiles - 1 - static_cast<int64_t>(blockIdx.x);
  const int64_t q0 = qt * BM;
  const int64_t b = blockIdx.z, h = blockIdx.y, hkv = h / a.group;
  const T *qg = a.q + b * a.qs.batch + h * a.qs.head;
  T *og = a.o + b * a.qs.batch + h * a.qs.head; // split_q recomputes og and lse after its loop
  const T *kg = a.k + b * a.ks.batch + hkv * a.ks.head;
  const T *vg = a.v + b * a.ks.batch + hkv * a.ks.head;
  float *lse = a.lse + (b * a.heads_q + h) * a.seqlen_q;
  const int64_t sq = a.seqlen_q, skv = a.seqlen_kv;
  const float sl2 = a.scale_log2;

  const int64_t n_tiles = kv_tiles_for(qt, BM, BN, sq, skv, a.causal);
  if (n_tiles == 0) { // causal with seqlen_q > seqlen_kv: no row of this tile sees a key
    for (int idx = tid; idx < BM * D / 8; idx += kThreads) {
      const int64_t row = q0 + idx / (D / 8);
      if (row < sq)
        *reinterpret_cast<uint4 *>(og + row * a.qs.seq + (idx % (D / 8)) * 8) =
            make_uint4(0, 0, 0, 0);
    }
    for (int r = tid; r < BM; r += kThreads)
      if (q0 + r < sq)
        lse[q0 + r] = -INFINITY;
    return;
  }

  const uint32_t sQ = smem_u32(smem);
  const uint32_t sKV = sQ + BM * D * 2;
  constexpr uint32_t kTileBytes = BN * D * 2;
  const int stages = a.stages;
  auto load_kv = [&](int64_t j, int slot) {
    const uint32_t sk = sKV + slot * 2 * kTileBytes;
    load_tile<D, BN, kThreads>(sk, kg, a.ks.seq, j * BN, skv, tid);
    load_tile<D, BN, kThreads>(sk + kTileBytes, vg, a.ks.seq, j * BN, skv, tid);
  };

  // Q joins the first commit group, so the first wait covers it.
  load_tile<D, BM, kThreads>(sQ, qg, a.qs.seq, q0, sq, tid);
  for (int s = 0; s < stages - 1; ++s) {
    if (s < n_tiles)
      load_kv(s, s);
    cp_async_commit();
  }

  // Tiles that straddle the causal diagonal or the sequence end; all others skip the mask.
  auto needs_mask = [&](int64_t kv0, int64_t first_row) {
    return kv0 + BN > skv || (a.causal && kv0 + BN - 1 > first_row + (skv - sq));
  };

  if constexpr (SQ) {
    constexpr int R = BM / W, MT = R / 16, NT = BN / 8, DT = D / 8;
    const int row_w = warp * R;
    // d64 128x128x4 (255 registers) is the one shape where the shorter exp2 changes ptxas's schedule into an 80-byte
    // spill (sm_90); it keeps exp2f (HISTORY.md, version 3).
    constexpr bool kFastExp = !(D == 64 && BM == 128 && BN == 128 && W == 4);
    // Version 4's register diet (traits.hpp, lean_loop; d128 128x64x4 only): row sums in shared memory (2·MT floats
    // per thread, read and written once per K/V tile), int mask bounds and thread coordinates re-derived where
    // used, so that only O, m and the loop's addresses are live across the K/V loop.
    constexpr bool kLean = lean_loop(D, BM, BN, W);
    float *l_s = reinterpret_cast<float *>(smem + BM * D * 2 + stages * 2 * kTileBytes);
    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          o[mt][dt][e] = 0.f;
      m[mt][0] = m[mt][1] = -INFINITY;
      l[mt][0] = l[mt][1] = 0.f;
      if constexpr (kLean)
        l_s[(mt * 2) * kThreads + tid] = l_s[(mt * 2 + 1) * kThreads + tid] = 0.f;
    }

    // First K/V tile that this warp must mask: the one holding key skv (sequence end) or, causal, the first whose
    // last key lies right of the diagonal for the warp's first row (x keys visible to it). Warp-uniform, one int,
    // so the loop carries no 64-bit mask bounds.
    int first_mask = static_cast<int>(skv / BN);
    if (a.causal) {
      const int64_t x = q0 + row_w + (skv - sq) + 1;
      first_mask = min(first_mask, x <= 0 ? 0 : static_cast<int>(x / BN));
    }
    const int n_t = static_cast<int>(n_tiles);
    const int64_t kv_off =
        b * a.ks.batch + hkv * a.ks.head; // K and V share strides: one offset for both
    auto load_kv_sq = [&](int jj, int sl) {
      const uint32_t sk = sKV + sl * 2 * kTileBytes;
      const int64_t off = opaque(kv_off);
      load_tile<D, BN, kThreads, true>(sk, a.k + off, a.ks.seq, int64_t(jj) * BN, skv, tid);
      load_tile<D, BN, kThreads, true>(sk + kTileBytes, a.v + off, a.ks.seq, int64_t(jj) * BN, skv,
                                       tid);
    };
    int slot = 0, load_slot = stages - 1;
    for (int j = 0; j < n_t; ++j) {
      // load_slot held tile j - 1, which every warp finished with before the barrier that ended the last step.
      if (j + stages - 1 < n_t)
        load_kv_sq(j + stages - 1, load_slot);
      cp_async_commit();
      cp_async_wait_dynamic(stages - 1);
      __syncthreads();
      const uint32_t sK = sKV + slot * 2 * kTileBytes, sV = sK + kTileBytes;

      float s[MT][NT][4];
      qk_gemm<T, D, MT, NT>(s, sQ, row_w, sK, 0, lane);
      if (!kLean && j >= first_mask)
        apply_mask(s, q0 + row_w, int64_t(j) * BN, lane, sq, skv, a.causal);
      if (kLean && j >= first_mask) {
        // Bounds recomputed from the kernel parameters here, so no 64-bit bound is live across the loop.
        const int64_t kv0 = int64_t(j) * BN;
        const int key_lim = static_cast<int>(min(a.seqlen_kv - kv0, int64_t(BN)));
        const int64_t dl = (a.num_q_tiles - 1 - int64_t(blockIdx.x)) * BM + (fresh_tid() / 32) * R +
                           (a.seqlen_kv - a.seqlen_q) - kv0;
        const int diag_lim =
            a.causal ? static_cast<int>(max(min(dl, int64_t(BN)), int64_t(-BM))) : BN;
        // The lane index re-read here (asm volatile): otherwise ptxas hoists the per-lane (key - row) offsets of
        // the mask out of the loop, a dozen registers live across it for a branch taken on a few tiles.
        apply_mask_local(s, key_lim, diag_lim, fresh_lane());
      }

#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hh], s[mt][nt][2 * hh + 1]));
          const float m_new = fmaxf(m[mt][hh], quad_max(mx));
          const float off = softmax_offset(m_new * sl2);
          const float alpha =
              kFastExp ? fast_exp2(m[mt][hh] * sl2 - off) : exp2f(m[mt][hh] * sl2 - off);
          m[mt][hh] = m_new;
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 2 * hh; e < 2 * hh + 2; ++e) {
              const float x = fmaf(s[mt][nt][e], sl2, -off);
              s[mt][nt][e] = kFastExp ? fast_exp2(x) : exp2f(x);
              sum += s[mt][nt][e];
            }
          // lane-partial; the quad's four parts are summed once at the end
          if constexpr (kLean) {
            float *lp = l_s + (mt * 2 + hh) * kThreads + tid;
            *lp = *lp * alpha + sum;
          } else {
            l[mt][hh] = l[mt][hh] * alpha + sum;
          }
#pragma unroll
          for (int dt = 0; dt < DT; ++dt)
            o[mt][dt][2 * hh] *= alpha, o[mt][dt][2 * hh + 1] *= alpha;
        }

      uint32_t pa[MT][NT / 2][4];
      pack_p<T>(pa, s);
      pv_gemm<T, D, MT, NT / 2, DT>(o, pa, sV, 0, 0, lane);
      __syncthreads();
      slot = slot + 1 == stages ? 0 : slot + 1;
      load_slot = load_slot + 1 == stages ? 0 : load_slot + 1;
    }

    // Epilogue: O / l staged through this warp's own rows of sQ, then 16-byte coalesced stores. The output
    // pointers are recomputed here rather than kept live across the loop.
    // kLean: the thread coordinates are re-derived after the loop, so that none of them is live across it.
    const int e_tid = kLean ? fresh_tid() : tid, e_lane = e_tid % 32, e_row_w = (e_tid / 32) * R;
    const int64_t e_q0 = kLean ? (a.num_q_tiles - 1 - int64_t(blockIdx.x)) * BM : q0;
    og = a.o + int64_t(blockIdx.z) * a.qs.batch + int64_t(blockIdx.y) * a.qs.head;
    lse = a.lse + (int64_t(blockIdx.z) * a.heads_q + blockIdx.y) * a.seqlen_q;
    unsigned char *sq_ptr = smem;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float lt = quad_sum(kLean ? l_s[(mt * 2 + hh) * kThreads + e_tid] : l[mt][hh]);
        const float inv = lt > 0.f ? 1.f / lt : 0.f;
        const int r = e_row_w + mt * 16 + e_lane / 4 + 8 * hh;
        if (e_lane % 4 == 0 && e_q0 + r < sq)
          lse[e_q0 + r] = lt > 0.f ? (m[mt][hh] * sl2 + log2f(lt)) * kLn2 : -INFINITY;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
          *reinterpret_cast<uint32_t *>(sq_ptr + swz<D>(r, dt) + (e_lane % 4) * 4) =
              Mma<T>::pack(o[mt][dt][2 * hh] * inv, o[mt][dt][2 * hh + 1] * inv);
      }
    __syncwarp();
#pragma unroll
    for (int idx = e_lane; idx < R * D / 8; idx += 32) {
      const int r = e_row_w + idx / (D / 8), ch = idx % (D / 8);
      if (e_q0 + r < sq)
        *reinterpret_cast<uint4 *>(og + (e_q0 + r) * a.qs.seq + ch * 8) =
            *reinterpret_cast<const uint4 *>(sq_ptr + swz<D>(r, ch));
    }
  } else {
    // split_k: warp w owns keys [w·KW, (w+1)·KW) of every K/V tile, for all BM rows.
    constexpr int MT = BM / 16, KW = BN / W, NT = KW / 8;
    constexpr int DC = splitk_chunk(BM, W), RS = splitk_red_stride(BM, W), NCH = D / DC;
    // Reduction layout: this warp owns rows [warp·RW, (warp+1)·RW) of O; LPR lanes cover a row's DC columns with
    // float4s, RPP rows per pass.
    constexpr int RW = BM / W, LPR = DC / 4, RPP = 32 / LPR, PASSES = RW / RPP;
    float *red = reinterpret_cast<float *>(smem + BM * D * 2 + stages * 2 * kTileBytes);
    float *maxb = red + W * BM * RS;
    float *lbuf = maxb + W * BM;
    const int kw0 = warp * KW;
    const int own_row0 = warp * RW + lane / LPR, own_col = (lane % LPR) * 4;

    float m[MT][2], l[MT][2], m_own[PASSES];
    float o[NCH][PASSES][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
      m_own[p] = -INFINITY;
#pragma unroll
      for (int c = 0; c < NCH; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          o[c][p][e] = 0.f;
    }

    int slot = 0, load_slot = stages - 1;
    for (int64_t j = 0; j < n_tiles; ++j) {
      if (j + stages - 1 < n_tiles)
        load_kv(j + stages - 1, load_slot);
      cp_async_commit();
      cp_async_wait_dynamic(stages - 1);
      __syncthreads();
      const uint32_t sK = sKV + slot * 2 * kTileBytes, sV = sK + kTileBytes;

      float s[MT][NT][4];
      qk_gemm<T, D, MT, NT, true>(s, sQ, 0, sK, kw0, lane);
      const int64_t kv0 = j * BN;
      if (needs_mask(kv0, q0))
        apply_mask(s, q0, kv0 + kw0, lane, sq, skv, a.causal);

        // The tile's row max is the max over the warps' key slices: exchanged through shared memory.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hh], s[mt][nt][2 * hh + 1]));
          mx = quad_max(mx);
          if (lane % 4 == 0)
            maxb[warp * BM + mt * 16 + lane / 4 + 8 * hh] = mx;
        }
      __syncthreads();
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = mt * 16 + lane / 4 + 8 * hh;
          float mx = -INFINITY;
#pragma unroll
          for (int w = 0; w < W; ++w)
            mx = fmaxf(mx, maxb[w * BM + r]);
          const float m_new = fmaxf(m[mt][hh], mx);
          const float off = softmax_offset(m_new * sl2);
          const float alpha = exp2f(m[mt][hh] * sl2 - off);
          m[mt][hh] = m_new;
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 2 * hh; e < 2 * hh + 2; ++e) {
              s[mt][nt][e] = exp2f(fmaf(s[mt][nt][e], sl2, -off));
              sum += s[mt][nt][e];
            }
          l[mt][hh] =
              l[mt][hh] * alpha + sum; // this warp's keys only; summed over warps at the end
        }
        // The same running max for the rows this warp owns in O (identical arithmetic, so identical values).
#pragma unroll
      for (int p = 0; p < PASSES; ++p) {
        const int r = own_row0 + p * RPP;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; ++w)
          mx = fmaxf(mx, maxb[w * BM + r]);
        const float m_new = fmaxf(m_own[p], mx);
        const float alpha = exp2f(m_own[p] * sl2 - softmax_offset(m_new * sl2));
        m_own[p] = m_new;
#pragma unroll
        for (int c = 0; c < NCH; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            o[c][p][e] *= alpha;
      }

      uint32_t pa[MT][NT / 2][4];
      pack_p<T>(pa, s);
#pragma unroll
      for (int c = 0; c < NCH; ++c) {
        float acc[MT][DC / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int dt = 0; dt < DC / 8; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              acc[mt][dt][e] = 0.f;
        pv_gemm<T, D, MT, NT / 2, DC / 8>(acc, pa, sV, kw0, c * (DC / 8), lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int dt = 0; dt < DC / 8; ++dt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
              *reinterpret_cast<float2 *>(red + (warp * BM + mt * 16 + lane / 4 + 8 * hh) * RS +
                                          dt * 8 + 2 * (lane % 4)) =
                  make_float2(acc[mt][dt][2 * hh], acc[mt][dt][2 * hh + 1]);
        __syncthreads();
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
          const int r = own_row0 + p * RPP;
#pragma unroll
          for (int w = 0; w < W; ++w) {
            const float4 x = *reinterpret_cast<const float4 *>(red + (w * BM + r) * RS + own_col);
            o[c][p][0] += x.x, o[c][p][1] += x.y, o[c][p][2] += x.z, o[c][p][3] += x.w;
          }
        }
        __syncthreads();
      }
      slot = slot + 1 == stages ? 0 : slot + 1;
      load_slot = load_slot + 1 == stages ? 0 : load_slot + 1;
    }

    // Row sums: each warp's part covers its keys; the owners of O add them up.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float lt = quad_sum(l[mt][hh]);
        if (lane % 4 == 0)
          lbuf[warp * BM + mt * 16 + lane / 4 + 8 * hh] = lt;
      }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
      const int r = own_row0 + p * RPP;
      float lt = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w)
        lt += lbuf[w * BM + r];
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      if (q0 + r >= sq)
        continue;
      if (lane % LPR == 0)
        lse[q0 + r] = lt > 0.f ? (m_own[p] * sl2 + log2f(lt)) * kLn2 : -INFINITY;
#pragma unroll
      for (int c = 0; c < NCH; ++c) {
        uint2 packed;
        packed.x = Mma<T>::pack(o[c][p][0] * inv, o[c][p][1] * inv);
        packed.y = Mma<T>::pack(o[c][p][2] * inv, o[c][p][3] * inv);
        *reinterpret_cast<uint2 *>(og + (q0 + r) * a.qs.seq + c * DC + own_col) = packed;
      }
    }
  }
}

template <class T, int D, int BM, int BN, int W, bool SQ>
void launch_tile(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
                 cudaStream_t stream) {
  KernelArgs<T> a{};
  a.q = static_cast<const T *>(args.q);
  a.k = static_cast<const T *>(args.k);
  a.v = static_cast<const T *>(args.v);
  a.o = static_cast<T *>(args.o);
  a.lse = args.lse;
  a.seqlen_q = p.seqlen_q;
  a.seqlen_kv = p.seqlen_kv;
  a.heads_q = p.heads_q;
  a.group = p.group_size();
  a.qs = p.q_strides();
  a.ks = p.kv_strides();
  a.scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
  a.stages = c.stages;
  a.num_q_tiles = static_cast<int>(num_q_tiles(p, c));
  a.causal = p.causal;

  void (*kernel)(const KernelArgs<T>);
  if constexpr (SQ)
    kernel = fa2_q_outer_kernel<T, D, BM, BN, W, true>;
  else
    kernel = fa2_split_k_kernel<T, D, BM, BN, W>;
  const int64_t smem = smem_bytes(D, c);
  if (smem > 48 * 1024)
    FB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(a.num_q_tiles), static_cast<unsigned>(p.heads_q),
                  static_cast<unsigned>(p.batch));
  kernel<<<grid, W * 32, static_cast<size_t>(smem), stream>>>(a);
  FB_CHECK_LAUNCH();
}

} // namespace detail

// The launch function of the compiled instantiation for (T, D, tile shape) of one warp layout, or nullptr when
// that shape is not compiled (tile_instantiated() false). Every structurally valid (block_m, block_n, warps,
// layout) is listed; one instantiation file compiles one (T, D, layout) slice so that slices build in parallel.
template <class T, int D, bool LAYOUT_SQ> LaunchFn pick_tile(const Params &c) {
#define FB_FA2_TILE(BM, BN, W, SQ)                                                                 \
  if constexpr (SQ == LAYOUT_SQ && tile_instantiated(D, BM, BN, W, SQ))                            \
    if (c.block_m == BM && c.block_n == BN && c.warps == W && split_q(c) == SQ)                    \
      return &detail::launch_tile<T, D, BM, BN, W, SQ>;
  FB_FA2_TILE(64, 32, 4, true)
  FB_FA2_TILE(64, 64, 4, true)
  FB_FA2_TILE(64, 128, 4, true)
  FB_FA2_TILE(128, 32, 4, true)
  FB_FA2_TILE(128, 64, 4, true)
  FB_FA2_TILE(128, 128, 4, true)
  FB_FA2_TILE(128, 32, 8, true)
  FB_FA2_TILE(128, 64, 8, true)
  FB_FA2_TILE(128, 128, 8, true)
  FB_FA2_TILE(64, 64, 4, false)
  FB_FA2_TILE(64, 128, 4, false)
  FB_FA2_TILE(64, 128, 8, false)
  FB_FA2_TILE(128, 64, 4, false)
  FB_FA2_TILE(128, 128, 4, false)
  FB_FA2_TILE(128, 128, 8, false)
#undef FB_FA2_TILE
  return nullptr;
}

} // namespace fb::fa2
