// fa3_pipelined's tile scheduler: which work tile (Q tile, head, batch) or stream-K segment of one
// the producer hands over next. The order itself (L2 sections, heaviest Q tiles first) is decoded
// by traits.hpp's tile_coord; see fa3_pipelined.cuh for the schedulers.
#pragma once

#include "kernels/fa3_pipelined/kernel_args.cuh"

namespace fb::fa3::detail {

// Work tile t in the work order (traits.hpp: tile_order, tile_coord).
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

// The producer's walk over the CTA's work. Work tiles: blockIdx.x first; then blockIdx.x +
// gridDim.x, ... (one_shot, persistent) or, with the dynamic scheduler, whatever the claim counter
// gives: gridDim.x + (claims before this one).
// stream_k: claim u < split.first is whole tile u; the next split.ctas claims are the
// tail's chunks, last first; any later one ends the CTA's work. The cursor t is a whole tile, or
// total_tiles + the tail's K/V tile where the next segment starts (the chunk is recomputed from
// it: no register); after a chunk's last segment the CTA claims again. One cursor, one loop and
// one produce_tile: a second copy of the loop, or a second cursor, spilled the producer's 24
// registers. Without a split (split.first = total_tiles, ctas 0) every claim past the tiles ends.
template <int D, int BN, int MODE> struct TileScheduler {
  const KernelArgs &a;
  const bool dynamic;
  const int tail_end; // the cursor past the tail's last K/V tile

  __device__ __forceinline__ explicit TileScheduler(const KernelArgs &args)
      : a(args), dynamic(args.claims != nullptr),
        tail_end(args.total_tiles + args.split.lo(args.split.ctas)) {}

  // The claim that follows cursor t.
  __device__ __forceinline__ int claim(int t) const {
    return dynamic ? int(gridDim.x) + atomicAdd(a.claims, 1) : t + int(gridDim.x);
  }
  // The cursor of claim u.
  __device__ __forceinline__ int cursor_of(int u) const {
    const int k = a.split.ctas - 1 - (u - a.split.first);
    return u < a.split.first ? u : k >= 0 ? a.total_tiles + a.split.lo(k) : tail_end;
  }
  __device__ __forceinline__ int first() const { return cursor_of(int(blockIdx.x)); }
  __device__ __forceinline__ int next(int t) const { return cursor_of(claim(t)); }
  // Whether cursor t is past the CTA's work.
  __device__ __forceinline__ bool done(int t) const {
    const bool whole = t < a.split.first;
    return !whole && (!mode_has_split(D, MODE) || t >= tail_end);
  }
  // The work tile, or the stream-K segment of one, at cursor t.
  __device__ __forceinline__ WorkTile work_at(int t, int block_m) const {
    const bool whole = t < a.split.first;
    if (whole || !mode_has_split(D, MODE))
      return tile_at<BN, MODE>(a, t, block_m);
    const int g = t - a.total_tiles, chunk = a.split.chunk_of(g);
    const Segment seg = segment_at(a.split, chunk, g);
    WorkTile w = tile_at<BN, MODE>(a, a.split.first + seg.tile, block_m);
    w.n_tiles = seg.j1;
    w.part = pack_part(seg.j0, seg.split, chunk);
    return w;
  }
  // Whether the item at cursor t (moved back to its tile's K/V tile 0), n_tiles long, is the last
  // of its claim: a whole tile, or its chunk's last segment (the segment ending at the tail's K/V
  // tile g_end ends its chunk). From the parameter bank, not a live predicate.
  __device__ __forceinline__ bool ends_claim(int t, int n_tiles) const {
    const int g_end = t + n_tiles - a.total_tiles;
    return t < a.split.first || g_end == a.split.lo(a.split.chunk_of(g_end - 1) + 1);
  }
  // Dynamic: this CTA made its last claim. The last CTA to get here resets both counters, so the
  // next launch finds them zero (LaunchArgs::semaphores); every other CTA's last claim came before
  // its count (the fence), so nothing touches the claim counter after the reset.
  __device__ __forceinline__ void retire() const {
    if (dynamic) {
      __threadfence();
      if (atomicAdd(a.claims + 1, 1) == int(gridDim.x) - 1) {
        atomicExch(a.claims, 0);
        atomicExch(a.claims + 1, 0);
      }
    }
  }
};

} // namespace fb::fa3::detail
