// The consumers' online softmax of fa3_pipelined: the mask of a K/V tile, the exact and the
// optimistic softmax of one tile (S -> unnormalised P in place, the row offsets m and sums l), O's
// rescale and P's packing into WGMMA A fragments.
#pragma once

#include "kernels/common/mma.cuh"
#include "kernels/fa3_pipelined/kernel_args.cuh"

#include <cstdint>

namespace fb::fa3::detail {

// A wgmma accumulator row is held by the four lanes of a quad, as in mma.sync's m16n8 layout: the
// same quad reductions apply.
using fb::kernels::quad_max;
using fb::kernels::quad_sum;
// 2^x on the MUFU alone (kernels/common/mma.cuh): 1 instruction per score on the critical softmax
// path instead of exp2f's 4; P values below 2^-126 do not matter (rounded into bf16/fp16 P and
// summed into l next to values >= 1).
using fb::kernels::fast_exp2;
// exp2 offset of a row whose running max (scaled) is m: 0 while the row has seen no key, so that
// exp2(-inf - offset) = 0 rather than NaN.
using fb::kernels::softmax_offset;
// The tile's end (finish_tile): 1 / l and log2 l on the MUFU alone. IEEE 1.f / l and log2f
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

// Masks keys past the sequence end or (causal) right of the diagonal. row0 = this thread's half-0
// row. Key key0 + 2 (lane % 4) + c (c = 8 i + e % 2, a constant after unrolling) survives while
// c <= lim[half]: one compare with an immediate and one select a score (recomputing the key and
// comparing it twice took 2 ISETP a score: the d64 kernels are ALU bound and a causal N512 launch
// masks 40% of its K/V tiles).
//
// A causal tile that ends inside the sequence is cut by the diagonal alone, and there row
// g + 8 sees exactly 8 keys more than row g, so the score 8 columns right on the row 8 below has
// the same predicate: the compares fall from BN / 2 to BN / 4 + 2 a tile (34 instead of 64 at
// block_n 128; cuDNN's kernel does the same, ncu at d64 N512 causal: 16 ISETP per warp and K/V
// tile against our 47).
template <int BN>
__device__ __forceinline__ void apply_mask(float (&sacc)[BN / 2], int row0, int key0, int lane,
                                           int seqlen_q, int seqlen_kv, bool causal) {
  const int base = key0 + 2 * (lane % 4);
  if (causal && key0 + BN <= seqlen_kv) {                 // warp-uniform
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
// Lazy rescale: a row keeps the offset it has while its new maximum stays within `slack` (log2
// units) of it; P is then at most 2^slack (256 at slack 8: exact in bf16/fp16, and l and O are
// fp32), and the final O / l and LSE = (m scale_log2 + log2 l) ln 2 use the same offset, so the
// result is the same softmax. After a row's first tile its offset almost never moves, so the D / 2
// FMULs of O's rescale (one per score at d 128) leave the K/V loop and the ping-pong turn. The
// decision is warp-uniform (__any_sync): a lane that did not grow rescales by exactly 1. slack =
// -inf would move the offset on every new max and rescale O after every tile (the exact running
// max: 0.80-0.90 of the lazy rescale at N8192 when last measured).
//
// Both row reductions run as kReduceLanes independent chains folded by a tree at the end (the max
// here, the sum in exp2_sum_block as the exp2s come out): the softmax runs while the other consumer
// issues its GEMMs, one warp of this warpgroup per scheduler, so it is latency bound; single chains
// (x = max(x, ...), sum += ...) were 17 and 32 dependent steps per row half (ncu: the max phase
// alone 18% of the consumer warps' time at d 128, mostly `wait` stalls). A full tree needs a
// temporary per pair and spilled at block_n 128-192.
constexpr int kReduceLanes = 8;
template <int BN, class Op>
__device__ __forceinline__ float half_reduce(const float (&sacc)[BN / 2], int hh, Op op) {
  constexpr int kN = BN / 4,
                kLanes = kReduceLanes; // the BN / 4 scores of row half hh that this thread holds
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
// kReduceLanes chains per row half as it comes out (as half_reduce), both row halves in one stream
// (the MUFU queue never waits on a half's sum). The exp2s, FFMAs and FADDs are one basic block,
// so that ptxas fills the MUFU's issue gaps (a warp's MUFU.EX2 after MUFU.EX2 waits 8 cycles: 16
// lanes a clock per SM) with the scale FFMAs and the sums. With exp2s and sums in separate blocks
// (a branch on right_dead between the row halves' exp2s, the sums after the join) ptxas issued 32
// FFMAs, 32 MUFUs back to back (stall 8 each), the branch, the same again, then 62 FADDs: ~128
// issue cycles a tile and warp on top of the MUFU's 512 (one block: best configs +1-6% at
// N512-2048). kRightDead: no row of this warp sees a key in the tile's right half (the half
// diagonal tile, half_diag_tile), whose scores the mask made -inf: their P is 0 with no exp2: half
// the exp2s of such a tile (block_n 128: a quarter of a causal N512 launch's tiles are such).
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
  // (mx - m) sl2 > slack: true when m = -inf and the tile has a key; NaN (false) when both are
  // -inf.
  const bool grow =
      __any_sync(0xffffffffu, (mx[0] - m[0]) * sl2 > slack || (mx[1] - m[1]) * sl2 > slack);
  float off[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (grow) {
      const float m_new = fmaxf(m[hh], mx[hh]);
      alpha[hh] = fast_exp2(fmaf(m[hh], sl2, -softmax_offset(m_new * sl2)));
      m[hh] = m_new;
    } else {
      alpha[hh] = 1.f;
    }
    off[hh] = softmax_offset(m[hh] * sl2);
  }
  float sum[2];
  exp2_sum<BN>(sacc, off, sl2, right_dead, sum);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
    l[hh] = grow ? l[hh] * alpha[hh] + sum[hh]
                 : l[hh] + sum[hh]; // lane-partial; the quad's parts are summed once at the end
  return grow;
}

// Optimistic softmax of a tile, for a warp whose rows all have a finite offset (they saw a
// key in an earlier tile): P = exp2(S * scale_log2 - offset) from the offsets as they are, with no
// row max first. With the lazy rescale a row's offset almost never moves after its first tile, so
// the max phase in front of the exp2 stream (~16% of a consumer warp's time, ~450 cycles of
// latency a tile at d128 block_n 128) only ever confirmed it. The check comes after the exp2s and
// costs no extra pass: the lane-partial row sums that l needs anyway bound every P they contain, so
// P <= 2^slack holds while each sum is <= 2^slack (a sum can pass it with no P past it: then the
// slow path below runs for nothing, and it is still exact).
// Returns 0: P ready, offsets unchanged (alpha = 1). 1: some sum passed the bound; every row of the
// warp whose max grew moved its offset to that max, and P and l were multiplied by alpha (O follows
// before its next P V). 2: some P passed 2^100 or overflowed (a score passed its offset by > 100
// log2 units, e.g. keys whose scale grows along the sequence by orders of magnitude): S is lost, P
// overwrote it, and the caller recomputes S (recompute_s) and runs softmax_tile; m, l and alpha
// untouched.
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

// S of K/V tile j again, for the rare tile whose optimistic exp2 overflowed
// (softmax_tile_optimistic returned 2): each thread computes its own accumulator entries (the
// layout at the top of the file) as fp32 dot products of Q and K read from global memory, 0 past
// either sequence end as TMA's fill gives. Per warp, with no warpgroup-wide instruction, since only
// some warps of a warpgroup may need it; slow (D x block_n / 2 FMAs a thread) but off every path
// that ordinary inputs take.

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
    pa[kt][0] = fb::kernels::Mma<T>::pack(sacc[8 * kt + 0], sacc[8 * kt + 1]);
    pa[kt][1] = fb::kernels::Mma<T>::pack(sacc[8 * kt + 2], sacc[8 * kt + 3]);
    pa[kt][2] = fb::kernels::Mma<T>::pack(sacc[8 * kt + 4], sacc[8 * kt + 5]);
    pa[kt][3] = fb::kernels::Mma<T>::pack(sacc[8 * kt + 6], sacc[8 * kt + 7]);
  }
}

} // namespace fb::fa3::detail
