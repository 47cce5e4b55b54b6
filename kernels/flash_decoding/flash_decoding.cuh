// Flash-decoding: split-KV attention for decode shapes, with a log-sum-exp combine.
//
// What it changes relative to FA2 (one CTA per Q tile, loop over all of K/V): in decode a Q tile is
// one token (or a few, for speculative decoding), so batch x heads gives far fewer CTAs than SMs and
// a CTA's loop over a long cache runs on one SM at a fraction of the memory bandwidth. Here the KV
// sequence of every (entry, KV head) is cut into `splits` ranges, one CTA each; every CTA writes a
// partial O (fp32, normalised) and its LSE, and a combine rescales each partial by exp(lse_i - lse)
// and sums. The work is bound by reading K and V, so everything serves that stream:
//   * the query heads of a GQA group and the seqlen_q tokens are packed into the 16 rows of one
//     m16n8k16 row block, so one K/V load serves the whole group (MHA uses 1 of 16 rows, MQA up to
//     all of them; the tensor cores have the spare rate);
//   * K/V tiles of block_n keys go global -> shared through cp.async (16 B per thread, coalesced
//     256 B rows) in a `stages`-deep ring, so several tiles per CTA are in flight; each byte is
//     read once, never through L1, and rows past a range's end are zero-filled, not read;
//   * the 4 warps split each tile's keys (split-K inside the CTA) and merge their (m, l, O) through
//     shared memory once, at the end;
//   * fused = 1 combines in the same launch: each CTA writes its partial, then takes a ticket on the
//     group's arrival counter (one acq_rel atomic by one thread), and the last one to arrive merges
//     the group. The counters live in the caller's semaphores (zero on entry); the last arrival
//     resets its group's counter to 0, so no memset runs in front of the launch (a memset node cost
//     0.8-1.2 us a call). A per-launch tag in the counter, taken with an atomicCAS loop, was slower:
//     when a group's 26-64 CTAs arrive together every failed CAS costs an L2 round trip, which
//     serialised the arrivals (~10 us at B=1 L=8k).
// A group whose keys fit one split writes its final O directly (no partials at all).
//
// Variable lengths (cache_seqlens) and causal alignment: row r of a group is query i = r / group of
// head hkv * group + r % group; it sees keys [0, i + 1 + len - seqlen_q) of its entry, clamped to
// [0, len]. An entry of length 0 (or rows that see no key) ends with O = 0 and LSE = -inf, never NaN:
// scores are kept in log2 units and a running max of -inf is replaced by 0 before it is subtracted.
//
// Paged caches: K/V are pools [pages, page_size, heads_kv, D] and row j of entry b lives in page
// page_table[b, j / page_size]; each thread looks the page up for the rows it copies.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/flash_decoding/traits.hpp"

#include "flashbench/check.hpp"

#include <cuda_runtime.h>

namespace fb::fdec {

// Diagnostics (off unless FDEC_TRACE is defined, as tools/dev/fdec_trace.cu does): thread 0 / lane 0
// stamp %globaltimer at fixed points of every CTA's life into fdec_trace[cta][32], so a launch's start,
// per-CTA progress, spread and combine tail can be read off one launch. Slots:
//   29 first instruction, 1 past the early exits, 30 before the first K/V copies, 0 the SM id,
//   2-9 warp FDEC_TRACE_WARP (0) at each eighth of its sub-tiles (FDEC_TRACE_NOLOOP leaves them out:
//   the stamps slow that warp's loop), 10+w warp w's loop end, 18 warps merged, 23 partial stored,
//   19/20 before/after the ticket, and in the CTA that combines: 24 start, 25 partial loads issued,
//   26 LSE pass done, 27 weights shared, 28 before the O stores, 21 end, 22 = 1.
#ifdef FDEC_TRACE
#ifndef FDEC_TRACE_WARP
#define FDEC_TRACE_WARP 0
#endif
__device__ unsigned long long fdec_trace[2048 * 32];
__device__ __forceinline__ unsigned long long fdec_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned fdec_smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
#define FDEC_MARK(slot, value)                                                                     \
  do {                                                                                             \
    const unsigned fdec_cta_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);     \
    if (fdec_cta_ < 2048) /* the first 2048 CTAs of a larger grid */                               \
      fdec_trace[fdec_cta_ * 32 + (slot)] = (value);                                               \
  } while (0)
#else
#define FDEC_MARK(slot, value) ((void)0)
#endif

template <class T> struct KArgs {
  const T *q;
  const T *k;
  const T *v;
  T *o;
  float *lse;
  float *o_part;   // [groups, splits, 16, D]
  float *lse_part; // [groups, splits, 16], log2 units
  unsigned int
      *counters;      // [groups]: arrivals; zero on entry, reset to zero by each group's last CTA
  const int *seqlens; // [batch] or null (every entry has seqlen_kv keys)
  const int *page_table;          // [batch, pages_per_seq] or null (contiguous)
  int64_t q_batch, q_seq, q_head; // element strides of Q and O
  int64_t k_batch, k_seq, k_head; // contiguous K/V strides
  int page_size, pages_per_seq;
  int seqlen_q, seqlen_kv, heads_q, heads_kv, group, rows, m_blocks;
  int splits, keys_per_split, stages;
  float scale_log2;
  bool causal, fused;
};

// Keys [0, kv_end) that row block mb of entry b reads (its last row's visible keys).
template <class T> __device__ __forceinline__ int group_kv_end(const KArgs<T> &a, int len, int mb) {
  if (!a.causal)
    return len;
  const int last_row = min(a.rows, (mb + 1) * kRowsPerCta) - 1;
  const int i = last_row / a.group;
  return max(0, min(len, i + 1 + len - a.seqlen_q));
}

// Final outputs of packed row r: O element offset of column 0 and the LSE index.
template <class T>
__device__ __forceinline__ void row_outputs(const KArgs<T> &a, int b, int hkv, int r,
                                            int64_t &o_off, int64_t &lse_idx) {
  const int i = r / a.group, h = hkv * a.group + r % a.group;
  o_off = b * a.q_batch + int64_t(i) * a.q_seq + int64_t(h) * a.q_head;
  lse_idx = (int64_t(b) * a.heads_q + h) * a.seqlen_q + i;
}

template <class T>
__device__ __forceinline__ void store4(T *dst, float x, float y, float z, float w) {
  using E = fb::kernels::Elem<T>;
  T t[4] = {E::from_float(x), E::from_float(y), E::from_float(z), E::from_float(w)};
  *reinterpret_cast<uint2 *>(dst) = *reinterpret_cast<const uint2 *>(t);
}

// Merges the n_active partials of every row of one group into the final O and LSE, in two passes
// that keep many L2 reads in flight (the partials were written by other CTAs: ld.cg, through L2):
//   1. one warp per row reads all of the row's n_active LSEs at once (kMaxSplits / 32 per lane), and
//      leaves each split's weight exp2(lse_s - lse) in `wbuf` ([kMaxSplits][16] floats, shared);
//   2. every (row, 4 columns) item is summed by P adjacent threads (P = NTH / items, at most 8), each
//      over every P-th split, U = 16 (d 64: 8) partial loads in flight before the FMAs; a shuffle adds
//      the P sums.
// The partials do not depend on the weights, so each thread's first U are loaded before pass 1 and
// their round trip overlaps the LSE pass's: at 16 splits x 4 rows (B=1 GQA, 128 threads, P = 1) the
// whole merge is one L2 round trip after the ticket, where loading them after it took three.
template <class T, int D, int NTH>
__device__ void combine_group(const KArgs<T> &a, int b, int hkv, int mb, int n_active, int64_t grp,
                              float *wbuf) {
  // d 64 has half the items, so P doubles: 8 loads a thread already cover 16 splits (and 16 cost the
  // 32-key kernel a stack frame).
  constexpr int NW = NTH / 32, U = D == 64 ? 8 : 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows_here = min(kRowsPerCta, a.rows - mb * kRowsPerCta);
  const float *lp = a.lse_part + grp * a.splits * kRowsPerCta;
  const float *op = a.o_part + grp * a.splits * kRowsPerCta * D;
  const int items = rows_here * (D / 4);
  int P = 1;
  while (P < 8 && 2 * P * items <= NTH)
    P *= 2;
  // This thread's first item (base 0) and the first U of its splits, issued now.
  float4 first[U];
  {
    const int item = threadIdx.x / P, sub = threadIdx.x % P;
    const bool active = item < items;
    const float4 *src =
        reinterpret_cast<const float4 *>(op + int64_t(active ? item / (D / 4) : 0) * D) +
        item % (D / 4);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = sub + u * P;
      first[u] = active && s < n_active ? __ldcg(src + int64_t(s) * kRowsPerCta * (D / 4))
                                        : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  if (threadIdx.x == 0)
    FDEC_MARK(25, fdec_now());
  for (int rr = warp; rr < rows_here; rr += NW) {
    float l[kMaxSplits / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      const int s = lane + 32 * i;
      l[i] = s < n_active ? __ldcg(lp + s * kRowsPerCta + rr) : -INFINITY;
      mx = fmaxf(mx, l[i]);
    }
    mx = fb::kernels::warp_max(mx);
    const float mu = mx == -INFINITY ? 0.f : mx;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i)
      sum += exp2f(l[i] - mu);
    sum = fb::kernels::warp_sum(sum);
    const float lse2 = sum > 0.f ? mu + log2f(sum) : -INFINITY;
    const float lse_use = sum > 0.f ? lse2 : 0.f;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      const int s = lane + 32 * i;
      if (s < n_active)
        wbuf[s * kRowsPerCta + rr] = exp2f(l[i] - lse_use);
    }
    if (lane == 0) {
      int64_t o_off, lse_idx;
      row_outputs(a, b, hkv, mb * kRowsPerCta + rr, o_off, lse_idx);
      a.lse[lse_idx] = lse2 * 0.69314718055994531f;
    }
  }
  if (threadIdx.x == 0)
    FDEC_MARK(26, fdec_now());
  __syncthreads();
  if (threadIdx.x == 0)
    FDEC_MARK(27, fdec_now());
  for (int base = 0; base < items * P; base += NTH) { // block-uniform bounds: every lane shuffles
    const int idx = base + threadIdx.x;
    const int item = idx / P, sub = idx % P;
    const bool active = item < items;
    const int rr = active ? item / (D / 4) : 0, c4 = item % (D / 4);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (active) {
      const float4 *src = reinterpret_cast<const float4 *>(op + int64_t(rr) * D) + c4;
      for (int s0 = sub; s0 < n_active; s0 += U * P) {
        float4 x[U];
        float w[U];
        const bool prefetched = base == 0 && s0 == sub;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int s = s0 + u * P;
          const bool in = s < n_active;
          x[u] = prefetched ? first[u]
                 : in       ? __ldcg(src + int64_t(s) * kRowsPerCta * (D / 4))
                            : make_float4(0.f, 0.f, 0.f, 0.f);
          w[u] = in ? wbuf[s * kRowsPerCta + rr] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          acc.x = fmaf(w[u], x[u].x, acc.x);
          acc.y = fmaf(w[u], x[u].y, acc.y);
          acc.z = fmaf(w[u], x[u].z, acc.z);
          acc.w = fmaf(w[u], x[u].w, acc.w);
        }
      }
    }
    for (int o = 1; o < P; o <<= 1) {
      acc.x += __shfl_xor_sync(0xffffffffu, acc.x, o);
      acc.y += __shfl_xor_sync(0xffffffffu, acc.y, o);
      acc.z += __shfl_xor_sync(0xffffffffu, acc.z, o);
      acc.w += __shfl_xor_sync(0xffffffffu, acc.w, o);
    }
    if (threadIdx.x == 0)
      FDEC_MARK(28, fdec_now());
    if (active && sub == 0) {
      int64_t o_off, lse_idx;
      row_outputs(a, b, hkv, mb * kRowsPerCta + rr, o_off, lse_idx);
      store4(a.o + o_off + c4 * 4, acc.x, acc.y, acc.z, acc.w);
    }
  }
}

// Rows of a group that sees no key at all: O = 0, LSE = -inf.
template <class T, int D, int NTH>
__device__ void write_empty_group(const KArgs<T> &a, int b, int hkv, int mb) {
  const int rows_here = min(kRowsPerCta, a.rows - mb * kRowsPerCta);
  for (int e = threadIdx.x; e < rows_here * (D / 4); e += NTH) {
    const int rr = e / (D / 4), c4 = e % (D / 4);
    int64_t o_off, lse_idx;
    row_outputs(a, b, hkv, mb * kRowsPerCta + rr, o_off, lse_idx);
    store4(a.o + o_off + c4 * 4, 0.f, 0.f, 0.f, 0.f);
    if (c4 == 0)
      a.lse[lse_idx] = -INFINITY;
  }
}

// One CTA: keys [split * keys_per_split, ...) of group (entry b, KV head hkv, row block mb), W warps.
// Warp w owns keys [k_begin + t * BN + w * KW, + KW) of every step t and streams them through its own
// `stages`-deep cp.async ring (cp.async.wait_group + __syncwarp): no CTA barrier in the loop, so a
// warp refills a stage as soon as it has used it, and a slow warp never holds the others' copies.
template <class T, int D, int KW, int W>
__global__ void __launch_bounds__(W * 32) split_kernel(const KArgs<T> a) {
  using namespace fb::kernels;
#ifdef FDEC_TRACE
  if (threadIdx.x == 0)
    FDEC_MARK(29, fdec_now());
#endif
  constexpr int NTH = W * 32;
  constexpr int BN = KW * W;           // keys per CTA step
  constexpr int CH = D / 8;            // 16-byte chunks per row
  constexpr int SUB = KW * D;          // elements per warp sub-tile (K or V)
  constexpr int CPL = KW * CH / 32;    // chunks per lane per sub-tile (each of K and V)
  constexpr int NT = KW / 8;           // n-tiles of S per warp
  constexpr int KD = D / 16;           // k-steps over head_dim
  constexpr int SC = D <= 128 ? 2 : 1; // independent S accumulator chains over head_dim
  static_assert(KW * CH % 32 == 0 && KD % SC == 0, "tile shape");
  extern __shared__ __align__(128) unsigned char smem_raw[];

  const int split = blockIdx.x;
  const int mb = blockIdx.y % a.m_blocks, hkv = blockIdx.y / a.m_blocks, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int len = a.seqlens ? a.seqlens[b] : a.seqlen_kv;
  const int kv_end = group_kv_end(a, len, mb);
  const int kps = a.keys_per_split;
  const int n_active = (kv_end + kps - 1) / kps;
  if (n_active == 0) {
    if (split == 0)
      write_empty_group<T, D, NTH>(a, b, hkv, mb);
    return;
  }
  if (split >= n_active)
    return;
  if (threadIdx.x == 0) {
    FDEC_MARK(1, fdec_now());
    FDEC_MARK(0, fdec_smid());
  }
  const int64_t grp = (int64_t(b) * a.heads_kv + hkv) * a.m_blocks + mb;
  const int row0 = mb * kRowsPerCta;
  const int rows_here = min(kRowsPerCta, a.rows - row0);
  const int k_begin = split * kps, k_end = min(kv_end, k_begin + kps);
  const int kw_first = k_begin + warp * KW;                                // this warp's first key
  const int n_w = kw_first < k_end ? (k_end - kw_first + BN - 1) / BN : 0; // this warp's sub-tiles
  T *ring = reinterpret_cast<T *>(smem_raw) + int64_t(warp) * a.stages * 2 * SUB;

  // ---- K/V producer (this warp's lanes): lane copies chunks lane + 32 * it of the sub-tile's K and
  // V rows (row e / CH, chunk e % CH), XOR-swizzled by row so the ldmatrix reads are conflict-free.
  const T *kbase, *vbase;
  if (a.page_table) {
    kbase = a.k + int64_t(hkv) * D;
    vbase = a.v + int64_t(hkv) * D;
  } else {
    kbase = a.k + int64_t(b) * a.k_batch + int64_t(hkv) * a.k_head;
    vbase = a.v + int64_t(b) * a.k_batch + int64_t(hkv) * a.k_head;
  }
  const int *ptab = a.page_table ? a.page_table + int64_t(b) * a.pages_per_seq : nullptr;
  const int64_t pool_row = int64_t(a.heads_kv) * D; // elements per token in a page pool
  // Paged: lane l holds the page of row l % KW of a sub-tile, loaded one sub-tile ahead of its copies
  // (the page table is known), so a copy never waits on a page-table load; shuffled to the copier.
  auto page_of = [&](int t) -> int {
    const int j = kw_first + t * BN + lane % KW;
    return (ptab && t < n_w && j < k_end) ? __ldg(ptab + j / a.page_size) : 0;
  };
  auto load_sub = [&](int t, int st, int pg) {
    const int k0 = kw_first + t * BN;
    T *kd = ring + st * 2 * SUB, *vd = kd + SUB;
    if (ptab) {
#pragma unroll
      for (int it = 0; it < CPL; ++it) {
        const int e = lane + it * 32, r = e / CH, c = e % CH, j = k0 + r;
        const int page = __shfl_sync(0xffffffffu, pg, r % 32);
        const bool valid = j < k_end;
        const int64_t off =
            (valid ? (int64_t(page) * a.page_size + j % a.page_size) * pool_row : 0) + c * 8;
        const int dst = r * D + ((c ^ (r & 7)) * 8);
        cp_async_16(smem_u32(kd + dst), kbase + off, valid);
        cp_async_16(smem_u32(vd + dst), vbase + off, valid);
      }
    } else {
#pragma unroll
      for (int it = 0; it < CPL; ++it) {
        const int e = lane + it * 32, r = e / CH, c = e % CH, j = k0 + r;
        const bool valid = j < k_end;
        const int64_t off = (valid ? int64_t(j) * a.k_seq : 0) + c * 8;
        const int dst = r * D + ((c ^ (r & 7)) * 8);
        cp_async_16(smem_u32(kd + dst), kbase + off, valid);
        cp_async_16(smem_u32(vd + dst), vbase + off, valid);
      }
    }
  };

  // Start the copies before anything else: the ring's first stages are in flight while Q loads.
  if (threadIdx.x == 0)
    FDEC_MARK(30, fdec_now());
  for (int t = 0; t < a.stages - 1; ++t) {
    if (t < n_w)
      load_sub(t, t, page_of(t));
    cp_async_commit();
  }
  int pg_next = page_of(a.stages - 1);

  // ---- Q as m16n8k16 A fragments, once: rows lane/4 and lane/4 + 8, columns (lane%4)*2 (+8).
  uint32_t qa[KD][4];
  int lim[2]; // keys each of this thread's two rows sees, capped at the range's end
  {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = lane / 4 + 8 * h, r = row0 + rr;
      const T *qrow = nullptr;
      lim[h] = k_end;
      if (rr < rows_here) {
        const int i = r / a.group, hq = hkv * a.group + r % a.group;
        qrow = a.q + int64_t(b) * a.q_batch + int64_t(i) * a.q_seq + int64_t(hq) * a.q_head;
        if (a.causal)
          lim[h] = min(k_end, i + 1 + len - a.seqlen_q);
      }
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        const int col = kk * 16 + (lane % 4) * 2;
        qa[kk][h] = qrow ? *reinterpret_cast<const uint32_t *>(qrow + col) : 0u;
        qa[kk][h + 2] = qrow ? *reinterpret_cast<const uint32_t *>(qrow + col + 8) : 0u;
      }
    }
  }

  float oacc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    oacc[n][0] = oacc[n][1] = oacc[n][2] = oacc[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  for (int t = 0; t < n_w; ++t) {
    cp_async_wait_dynamic(a.stages - 2);
    __syncwarp(); // sub-tile t landed for every lane; every lane is done with sub-tile t-1's stage
#if defined(FDEC_TRACE) && !defined(FDEC_TRACE_NOLOOP)
    if (warp == FDEC_TRACE_WARP && lane == 0 && (t == 0 || (t * 8) / n_w != ((t - 1) * 8) / n_w))
      FDEC_MARK(2 + (t * 8) / n_w, fdec_now());
#endif
    {
      const int tn = t + a.stages - 1;
      if (tn < n_w)
        load_sub(tn, tn % a.stages, pg_next);
      cp_async_commit();
      pg_next = page_of(tn + 1); // in flight behind this sub-tile's math
    }
    const int kw0 = kw_first + t * BN; // the sub-tile's first key
    const T *kt = ring + (t % a.stages) * 2 * SUB, *vt = kt + SUB;

    // S = Q Kᵀ for the warp's KW keys (SC independent chains over head_dim, summed at the end).
    float sacc[SC][NT][4];
#pragma unroll
    for (int q = 0; q < SC; ++q)
#pragma unroll
      for (int n = 0; n < NT; ++n)
        sacc[q][n][0] = sacc[q][n][1] = sacc[q][n][2] = sacc[q][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        const int m = lane / 8;
        const int key = np * 16 + (m / 2) * 8 + lane % 8;
        const int chunk = kk * 2 + (m % 2);
        uint32_t r[4];
        ldmatrix_x4(r, smem_u32(kt + key * D + ((chunk ^ (key & 7)) * 8)));
        Mma<T>::run(sacc[kk % SC][2 * np], qa[kk], r[0], r[1]);
        Mma<T>::run(sacc[kk % SC][2 * np + 1], qa[kk], r[2], r[3]);
      }
    }
#pragma unroll
    for (int q = 1; q < SC; ++q)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          sacc[0][n][e] += sacc[q][n][e];

    // Mask, online softmax (log2 units), P in registers.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const int j = kw0 + n * 8 + (lane % 4) * 2 + (e & 1);
        const float s = j < lim[h] ? sacc[0][n][e] * a.scale_log2 : -INFINITY;
        sacc[0][n][e] = s;
        mx[h] = fmaxf(mx[h], s);
      }
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = quad_max(mx[h]);
      const float m_new = fmaxf(m_run[h], mx[h]);
      m_use[h] = softmax_offset(m_new);
      alpha[h] = exp2f(m_run[h] - m_use[h]);
      m_run[h] = m_new;
    }
    float psum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(sacc[0][n][e] - m_use[e / 2]);
        sacc[0][n][e] = p;
        psum[e / 2] += p;
      }
#pragma unroll
    for (int h = 0; h < 2; ++h)
      l_run[h] = l_run[h] * alpha[h] + psum[h];
    // Once the running max settles (most sub-tiles of a long range) alpha is 1 in every lane: skip
    // the D / 2 multiplies (a warp-uniform branch).
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        oacc[n][0] *= alpha[0];
        oacc[n][1] *= alpha[0];
        oacc[n][2] *= alpha[1];
        oacc[n][3] *= alpha[1];
      }
    }

    // O += P V.
#pragma unroll
    for (int k2 = 0; k2 < KW / 16; ++k2) {
      uint32_t pa[4];
      pa[0] = Mma<T>::pack(sacc[0][2 * k2][0], sacc[0][2 * k2][1]);
      pa[1] = Mma<T>::pack(sacc[0][2 * k2][2], sacc[0][2 * k2][3]);
      pa[2] = Mma<T>::pack(sacc[0][2 * k2 + 1][0], sacc[0][2 * k2 + 1][1]);
      pa[3] = Mma<T>::pack(sacc[0][2 * k2 + 1][2], sacc[0][2 * k2 + 1][3]);
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        const int m = lane / 8;
        const int key = k2 * 16 + (m % 2) * 8 + lane % 8;
        const int chunk = dn * 2 + m / 2;
        uint32_t r[4];
        ldmatrix_x4_trans(r, smem_u32(vt + key * D + ((chunk ^ (key & 7)) * 8)));
        Mma<T>::run(oacc[2 * dn], pa, r[0], r[1]);
        Mma<T>::run(oacc[2 * dn + 1], pa, r[2], r[3]);
      }
    }
  }

  // ---- Merge the W warps' (m, l, O) through shared memory (the drained rings).
  if (lane == 0) {
    FDEC_MARK(10 + warp, fdec_now());
  }
  cp_async_wait<0>();
  __syncthreads();
  float *obuf = reinterpret_cast<float *>(smem_raw); // [W][16][D]
  float *mbuf = obuf + W * kRowsPerCta * D;          // [W][16]
  float *lbuf = mbuf + W * kRowsPerCta;              // [W][16]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] = quad_sum(l_run[h]);
    if (lane % 4 == 0) {
      mbuf[warp * kRowsPerCta + lane / 4 + 8 * h] = m_run[h];
      lbuf[warp * kRowsPerCta + lane / 4 + 8 * h] = l_run[h];
    }
  }
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = lane / 4 + 8 * h, col = n * 8 + (lane % 4) * 2;
      if (h == 0 || rows_here > 8) // rows 8-15 only where they exist (GQA 4 decode has 4 rows)
        *reinterpret_cast<float2 *>(obuf + (warp * kRowsPerCta + rr) * D + col) =
            make_float2(oacc[n][2 * h], oacc[n][2 * h + 1]);
    }
  __syncthreads();
  if (threadIdx.x == 0)
    FDEC_MARK(18, fdec_now());

  const bool direct = n_active == 1;
  float *opart = a.o_part + ((grp * a.splits + split) * kRowsPerCta) * D;
  float *lpart = a.lse_part + (grp * a.splits + split) * kRowsPerCta;
  for (int e = threadIdx.x; e < rows_here * (D / 4); e += NTH) {
    const int rr = e / (D / 4), c4 = e % (D / 4);
    float mw[W], M = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      mw[w] = mbuf[w * kRowsPerCta + rr];
      M = fmaxf(M, mw[w]);
    }
    const float Mu = softmax_offset(M);
    float L = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float cw = exp2f(mw[w] - Mu);
      L += cw * lbuf[w * kRowsPerCta + rr];
      const float4 x =
          *reinterpret_cast<const float4 *>(obuf + (w * kRowsPerCta + rr) * D + c4 * 4);
      acc.x = fmaf(cw, x.x, acc.x);
      acc.y = fmaf(cw, x.y, acc.y);
      acc.z = fmaf(cw, x.z, acc.z);
      acc.w = fmaf(cw, x.w, acc.w);
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
    acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
    const float lse2 = L > 0.f ? M + log2f(L) : -INFINITY;
    if (direct) {
      int64_t o_off, lse_idx;
      row_outputs(a, b, hkv, row0 + rr, o_off, lse_idx);
      store4(a.o + o_off + c4 * 4, acc.x, acc.y, acc.z, acc.w);
      if (c4 == 0)
        a.lse[lse_idx] = lse2 * 0.69314718055994531f;
    } else {
      __stcg(reinterpret_cast<float4 *>(opart + rr * D) + c4, acc);
      if (c4 == 0)
        __stcg(lpart + rr, lse2);
    }
  }
  if (threadIdx.x == 0)
    FDEC_MARK(23, fdec_now());
  if (direct || !a.fused)
    return;

  // ---- Fused combine: the last CTA of the group to arrive merges every split's partial.
  __shared__ int is_last;
  // Release and acquire in one atomic by one thread: the barrier orders every thread's partial
  // stores before thread 0's acq_rel atomic, whose release then covers them (cumulativity), and its
  // acquire covers the other CTAs' partials for the threads that read them after the next barrier.
  // It replaces a __threadfence() (fence.sc) in every thread and a second one in the last CTA.
  __syncthreads(); // also: every thread is done with obuf/mbuf/lbuf, which wbuf overwrites
  if (threadIdx.x == 0) {
    FDEC_MARK(19, fdec_now());
    unsigned arrived;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(arrived)
                 : "l"(a.counters + grp)
                 : "memory");
    is_last = arrived + 1 == unsigned(n_active);
    FDEC_MARK(20, fdec_now());
    if (is_last) // every CTA of the group has taken its ticket: the next launch finds 0
      a.counters[grp] = 0u;
  }
  __syncthreads();
  if (!is_last)
    return;
  if (threadIdx.x == 0)
    FDEC_MARK(24, fdec_now());
  combine_group<T, D, NTH>(a, b, hkv, mb, n_active, grp, reinterpret_cast<float *>(smem_raw));
#ifdef FDEC_TRACE
  __syncthreads();
  if (threadIdx.x == 0) {
    FDEC_MARK(21, fdec_now());
    FDEC_MARK(22, 1);
  }
#endif
}

// Non-fused path: one CTA per group with at least two active splits.
template <class T, int D>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const KArgs<T> a) {
  __shared__ float wbuf[kMaxSplits * kRowsPerCta];
  const int mb = blockIdx.x % a.m_blocks, hkv = blockIdx.x / a.m_blocks, b = blockIdx.y;
  const int len = a.seqlens ? a.seqlens[b] : a.seqlen_kv;
  const int kv_end = group_kv_end(a, len, mb);
  const int n_active = (kv_end + a.keys_per_split - 1) / a.keys_per_split;
  if (n_active < 2)
    return; // written by the split kernel
  const int64_t grp = (int64_t(b) * a.heads_kv + hkv) * a.m_blocks + mb;
  combine_group<T, D, kCombineThreads>(a, b, hkv, mb, n_active, grp, wbuf);
}

template <class T, int D, int KW, int W> const void *split_kernel_ptr() {
  return reinterpret_cast<const void *>(&split_kernel<T, D, KW, W>);
}

template <class T>
KArgs<T> make_args(const AttentionProblem &p, const Params &c, const SplitPlan &plan,
                   const LaunchArgs &args) {
  KArgs<T> a{};
  a.q = static_cast<const T *>(args.q);
  a.k = static_cast<const T *>(args.k);
  a.v = static_cast<const T *>(args.v);
  a.o = static_cast<T *>(args.o);
  a.lse = args.lse;
  const WorkspaceLayout w = workspace_layout(p, plan);
  char *ws = static_cast<char *>(args.workspace);
  a.o_part = reinterpret_cast<float *>(ws + w.o_offset);
  a.lse_part = reinterpret_cast<float *>(ws + w.lse_offset);
  a.counters = static_cast<unsigned int *>(args.semaphores);
  a.seqlens = p.kv_lens.empty() ? nullptr : args.cache_seqlens;
  a.page_table = p.paged() ? args.page_table : nullptr;
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  a.q_batch = qs.batch, a.q_seq = qs.seq, a.q_head = qs.head;
  a.k_batch = ks.batch, a.k_seq = ks.seq, a.k_head = ks.head;
  a.page_size = static_cast<int>(p.page_size);
  a.pages_per_seq = static_cast<int>(p.pages_per_seq());
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.seqlen_kv = static_cast<int>(p.seqlen_kv);
  a.heads_q = static_cast<int>(p.heads_q);
  a.heads_kv = static_cast<int>(p.heads_kv);
  a.group = static_cast<int>(p.group_size());
  a.rows = static_cast<int>(packed_rows(p));
  a.m_blocks = static_cast<int>(row_blocks(p));
  a.splits = plan.splits;
  a.keys_per_split = static_cast<int>(plan.keys_per_split);
  a.stages = plan.stages;
  a.scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
  a.causal = p.causal;
  a.fused = c.fused != 0;
  return a;
}

template <class T, int D, int KW, int W>
void launch_split(const KArgs<T> &a, const AttentionProblem &p, const Params &c,
                  cudaStream_t stream) {
  Params fit = c;
  fit.stages = a.stages;
  const int64_t smem = smem_bytes(D, fit);
  // Always: the 48 KB default counts the kernel's static shared memory too, so exactly 48 KB of
  // dynamic memory already needs the opt-in.
  FB_CUDA_CHECK(cudaFuncSetAttribute(split_kernel<T, D, KW, W>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned(a.splits), unsigned(p.heads_kv * a.m_blocks), unsigned(p.batch));
  split_kernel<T, D, KW, W><<<grid, W * 32, size_t(smem), stream>>>(a);
  FB_CHECK_LAUNCH();
}

// The (keys a warp, warps) shapes that exist: 16x4, 32x4 and 16x8 at head_dim 64 and 128; 16x4 at 256
// (head_dim_problem() turns the others down).
template <class T, int D> const void *split_ptr(const Params &c) {
  if constexpr (D == 256) {
    return split_kernel_ptr<T, D, 16, 4>();
  } else {
    if (c.warps == 8)
      return split_kernel_ptr<T, D, 16, 8>();
    return keys_per_warp(c) == 32 ? split_kernel_ptr<T, D, 32, 4>()
                                  : split_kernel_ptr<T, D, 16, 4>();
  }
}

template <class T, int D>
void launch_d(const KArgs<T> &a, const AttentionProblem &p, const Params &c, cudaStream_t stream) {
  if constexpr (D == 256) {
    launch_split<T, D, 16, 4>(a, p, c, stream);
  } else {
    if (c.warps == 8)
      launch_split<T, D, 16, 8>(a, p, c, stream);
    else if (keys_per_warp(c) == 32)
      launch_split<T, D, 32, 4>(a, p, c, stream);
    else
      launch_split<T, D, 16, 4>(a, p, c, stream);
  }
  if (a.splits > 1 && !a.fused) {
    const dim3 grid(unsigned(p.heads_kv * a.m_blocks), unsigned(p.batch));
    combine_kernel<T, D><<<grid, kCombineThreads, 0, stream>>>(a);
    FB_CHECK_LAUNCH();
  }
}

template <class T>
void launch_typed(const AttentionProblem &p, const Params &c, const SplitPlan &plan,
                  const LaunchArgs &args, cudaStream_t stream) {
  const KArgs<T> a = make_args<T>(p, c, plan, args);
  // The group counters are zero on entry (LaunchArgs::semaphores): the last arrival of a launch
  // resets them, so no memset node runs in front of the kernel.
  switch (p.head_dim) {
  case 64:
    launch_d<T, 64>(a, p, c, stream);
    break;
  case 128:
    launch_d<T, 128>(a, p, c, stream);
    break;
  default:
    launch_d<T, 256>(a, p, c, stream);
    break;
  }
}

template <class T>
std::vector<KernelDesc> kernel_descs_typed(const AttentionProblem &p, const Params &c,
                                           const SplitPlan &plan) {
  const void *f = nullptr;
  switch (p.head_dim) {
  case 64:
    f = split_ptr<T, 64>(c);
    break;
  case 128:
    f = split_ptr<T, 128>(c);
    break;
  default:
    f = split_ptr<T, 256>(c);
    break;
  }
  std::vector<KernelDesc> out;
  Params fit = c;
  fit.stages = plan.stages;
  out.push_back(KernelDesc{"flash_decoding_split", f, threads_of(c),
                           size_t(smem_bytes(p.head_dim, fit)),
                           int64_t(plan.splits) * num_groups(p)});
  return out;
}

} // namespace fb::fdec
