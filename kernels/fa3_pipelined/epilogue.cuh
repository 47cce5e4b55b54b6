// The end of a work tile in fa3_pipelined: O / l and LSE out (through shared memory and TMA stores,
// or from registers), the stream-K partials written and folded, and the rows of an empty tile.
#pragma once

#include "kernels/common/hopper/epilogue.cuh"
#include "kernels/fa3_pipelined/block.cuh"
#include "kernels/fa3_pipelined/softmax.cuh"
#include "kernels/fa3_pipelined/trace.cuh"

namespace fb::fa3::detail {

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
    // O through shared memory and TMA stores (o_staged): the staging buffer holds the CTA's rows,
    // this warpgroup's from row wg * 64 of each column chunk.
    const int q0 = tile_q0(c, wg);
    store_tile_tma<T, D>(&a.tm_o, sm.o + uint32_t(wg * kRowsPerWarpgroup) * 128, sm.q_chunk_bytes(),
                         kBarEpi0 + wg, q0 + wg * kRowsPerWarpgroup, c.w.h(), c.w.b(), o,
                         inv FA3_TRACE_ONLY(, [&](int k) {
                           if (threadIdx.x % 128 == 0)
                             c.tf[k] = trace_now();
                         }));
    return;
  }
  // Direct: 4-byte stores from the accumulators (a quad writes 16 contiguous bytes per row and
  // column block): for configs whose ring leaves no room for the staging buffer.
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
          fb::kernels::Mma<T>::pack(o[4 * i + 2 * hh] * inv[hh], o[4 * i + 2 * hh + 1] * inv[hh]);
  }
}

// stream_k: a segment that does not start its tile leaves this thread's O accumulators, m and
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
      f[hh] = fast_exp2(fmaf(m[hh], a.scale_log2, -softmax_offset(mx * a.scale_log2)));
      fp[hh] = fast_exp2(fmaf(mp, a.scale_log2, -softmax_offset(mx * a.scale_log2)));
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
// The end of a work tile, or of a stream-K segment of one: a later part leaves a partial; the
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

} // namespace fb::fa3::detail
