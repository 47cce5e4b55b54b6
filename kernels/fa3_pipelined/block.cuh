// The part of a work tile that one consumer warpgroup computes: its rows, the first K/V tile that
// needs a mask, how many K/V tiles it computes and how many it passes over (causal), and where a
// stream-K segment starts.
#pragma once

#include "kernels/fa3_pipelined/kernel_args.cuh"
#include "kernels/fa3_pipelined/trace.cuh"

namespace fb::fa3::detail {

// What a consumer warpgroup keeps about the work tile it is on: the tile, this thread's half-0 row,
// the first K/V tile that needs a mask, and the Q slot holding the tile's Q.
struct TileCtx {
  WorkTile w;
  int row0;       // this thread's half-0 row; half 1 is row0 + 8
  int first_mask; // first K/V tile whose keys need masking for some row of this warpgroup
  int n_wg;       // K/V tiles this warpgroup computes (the rest it passes over: pass_k, pass_v)
  int q_slot;
  FA3_TRACE_ONLY(unsigned long long t_q;)           // fetch_tile: q_full passed
  FA3_TRACE_ONLY(mutable unsigned long long tf[2];) // O's fence entered and passed
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
  // Causal: the tiles right of the diagonal of this warpgroup's last row hold no key any of
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
  FA3_TRACE_ONLY(c.tf[0] = c.tf[1] = 0;)
  return c;
}

// The work tile's first row, from this thread's row0: what follows the K/V loop reads q0 this way,
// so that nothing after the loop needs c.w.q0 next to row0 (three integer ops; on its own it did
// not keep the stream-K kernels from spilling, keeping `part` uniform did).
__device__ __forceinline__ int tile_q0(const TileCtx &c, int wg) {
  const int t = threadIdx.x % 128;
  return c.row0 - wg * kRowsPerWarpgroup - (t / 32) * 16 - (t % 32) / 4;
}

// K/V tiles of the work tile that this warpgroup passes over: n_tiles - n_wg, n_tiles
// recomputed as tile_at did (kv_tiles_for), from the CTA's last row.
// Non-causal (or wg_pass off): none, and n_wg is the segment's end, not n_tiles.
template <int MODE>
__device__ __forceinline__ int pass_count(const KernelArgs &a, const TileCtx &c, int wg, int bn) {
  if (!causal_of<MODE>(a) || !a.wg_pass)
    return 0;
  const int last_row = min(tile_q0(c, wg) + a.consumers * kRowsPerWarpgroup, a.seqlen_q) - 1;
  return kv_tiles_to_row(last_row, bn, a.seqlen_q, a.seqlen_kv, true) - c.n_wg;
}

// The half diagonal tile: causal, K/V tile j is this warpgroup's last and none of its rows
// sees a key in the tile's right half. With block_n 128 and seqlen_q = seqlen_kv that is every
// other 64-row block's diagonal tile (rows 128k .. 128k + 63): a quarter of the tiles a causal N512
// launch computes at block_m 192 or 128, a ninth at N1024. Any alignment: the test is on the
// warpgroup's last visible key. (Computing such a tile as m64n64 GEMMs as well was tried: a second,
// narrower copy of either GEMM in the loop serialised every WGMMA of the 3-consumer kernel
// (C7511) or spilled it.)
template <int BN, int MODE>
__device__ __forceinline__ bool half_diag_tile(const KernelArgs &a, const TileCtx &c, int wg,
                                               int j) {
  if (!causal_of<MODE>(a) || !a.half_diag || j != c.n_wg - 1)
    return false;
  const int last_row = min(tile_q0(c, wg) + (wg + 1) * kRowsPerWarpgroup, a.seqlen_q) - 1;
  return last_row + (a.seqlen_kv - a.seqlen_q) - j * BN < BN / 2;
}

// The first K/V tile of a work tile or of a stream-K segment of one.
template <int D, int MODE> __device__ __forceinline__ int j_first(const TileCtx &c) {
  return mode_has_split(D, MODE) ? c.w.j0() : 0;
}

} // namespace fb::fa3::detail
