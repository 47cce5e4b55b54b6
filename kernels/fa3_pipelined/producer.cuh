// fa3_pipelined's producer: one thread of warpgroup 0 walks the CTA's work tiles (scheduler.cuh)
// and issues the TMA loads of each: Q into a Q slot, K and V through the K/V ring.
#pragma once

#include "kernels/fa3_pipelined/kernel_args.cuh"
#include "kernels/fa3_pipelined/scheduler.cuh"
#include "kernels/fa3_pipelined/trace.cuh"

namespace fb::fa3::detail {

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
  FA3_TRACE_ONLY(trace_stamp(kTraceProducerLane, q_use + 1, 8);)
  const int slot = take_q_slot(sm, q_use, w);
  FA3_TRACE_ONLY(trace_stamp(kTraceProducerLane, q_use + 1, 9);)
  mbar_arrive_expect_tx(sm.q_full(slot), uint32_t(sm.block_m) * D * 2);
#pragma unroll
  for (int c = 0; c < Smem<D, BN>::kChunks; ++c) {
    tma_load_4d(sm.q_tile(slot) + c * sm.q_chunk_bytes(), &a.tm_q, sm.q_full(slot), c * 64, w.q0,
                w.h(), w.b());
    FA3_TRACE_ONLY(if (c == 0) trace_stamp(kTraceProducerLane, q_use + 1, 10);)
  }
  FA3_TRACE_ONLY(trace_stamp(kTraceProducerLane, q_use + 1, 2);
                 trace_put(kTraceProducerLane, q_use + 1, 0, trace_meta(w.q0, w.hb));)
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
      tma_load_4d(sm.k_tile(s) + c * S::kKvChunk, &a.tm_k, sm.k_full(s), c * 64, j * BN, hkv,
                  w.b());
  };
  auto load_v = [&](int j) {
    const int g = kv_base + j, use = int(a.stages_div.div(uint32_t(g))), s = g - use * sm.stages;
    if (use > 0)
      mbar_wait(sm.v_empty(s), (use - 1) & 1);
    mbar_arrive_expect_tx(sm.v_full(s), S::kKvBytes);
#pragma unroll
    for (int c = 0; c < S::kChunks; ++c)
      tma_load_4d(sm.v_tile(s) + c * S::kKvChunk, &a.tm_v, sm.v_full(s), c * 64, j * BN, hkv,
                  w.b());
  };
  // Q before K(0). With two Q buffers the Q slot's last use was two tiles back, while K(0)'s slot
  // waits for Q K^T(n-2) of the tile before: with K(0) first, the trace build showed the next Q go
  // out ~0.35 us after the consumers' last P V of the tile before, and land
  // ~0.45 us after they were ready for it. With one buffer both wait for the tile's last Q K^T,
  // and the tile needs both before it can start.
  load_q(a, sm, q_use, w);
  FA3_TRACE_ONLY(trace_stamp(kTraceProducerLane, q_use + 1, 6);)
  load_k(j0);
  FA3_TRACE_ONLY(trace_stamp(kTraceProducerLane, q_use + 1, 7);)
  for (int j = j0 + 1; j < n_tiles; ++j) {
    load_k(j);
    load_v(j - 1);
  }
  // The next work tile is claimed here, about a K/V tile before the consumers finish this one (the
  // V slot's wait below): late enough that a CTA never holds a tile it could have left to an idle
  // one, early enough that the claim's round trip hides under that wait.
  claim_next();
  load_v(n_tiles - 1);
  FA3_TRACE_ONLY(trace_stamp(kTraceProducerLane, q_use + 1, 5);)
}

// Warpgroup 0's one thread: every tile, empty or not, and the end, go to the consumers through a Q
// slot (tile_info): an empty tile (no row sees a key) and the end come with a plain arrive and no
// load.
template <int D, int BN, int MODE>
__device__ __forceinline__ void producer(const KernelArgs &a, const Smem<D, BN> &sm) {
  tma_prefetch_desc(&a.tm_q);
  tma_prefetch_desc(&a.tm_k);
  tma_prefetch_desc(&a.tm_v);
  const TileScheduler<D, BN, MODE> sched(a);
  int t = sched.first(), kv_base = 0, q_use = 0; // K/V tiles and Q slots used before
  while (!sched.done(t)) {
    const WorkTile w = sched.work_at(t, sm.block_m);
    if (w.n_tiles > 0) {
      // Both cursors move back by j0 in place (0 for a whole tile), so that nothing more stays
      // live through the loads than for a whole tile: t + n_tiles is then the tail's next segment.
      if constexpr (mode_has_split(D, MODE)) {
        t -= w.j0();
        kv_base -= w.j0();
      }
      int next = -1;
      produce_tile<D, BN, MODE>(a, sm, w, kv_base, q_use, [&] {
        if (sched.ends_claim(t, w.n_tiles)) {
          next = sched.next(t);
          FA3_TRACE_ONLY(trace_stamp(kTraceProducerLane, q_use + 2, 4);)
        }
      });
      kv_base += w.n_tiles;
      ++q_use;
      t = next >= 0 ? next : t + w.n_tiles;
      continue;
    }
    mbar_arrive(sm.q_full(take_q_slot(sm, q_use, w))); // whole tiles only: segments have keys
    ++q_use;
    t = sched.next(t);
  }
  mbar_arrive(sm.q_full(take_q_slot(sm, q_use, WorkTile{.q0 = 0, .hb = 0, .n_tiles = -1})));
  FA3_TRACE_ONLY(const unsigned long long t_end = trace_now();
                 trace_close(kTraceProducerLane, t_end, t_end, q_use);)
  sched.retire();
}

} // namespace fb::fa3::detail
