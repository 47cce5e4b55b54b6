// fa3_pipelined's consumer mainloop: a consumer warpgroup's 64 rows of every work tile against the
// tile's K/V tiles (both GEMMs on WGMMA, the softmax in between), its turns in the ping-pong ring
// and its ring slots handed back.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/hopper/ring.cuh"
#include "kernels/fa3_pipelined/block.cuh"
#include "kernels/fa3_pipelined/epilogue.cuh"
#include "kernels/fa3_pipelined/kernel_args.cuh"
#include "kernels/fa3_pipelined/softmax.cuh"
#include "kernels/fa3_pipelined/trace.cuh"

#include <cstdint>

namespace fb::fa3::detail {

// ---- consumer pieces
// --------------------------------------------------------------------------------------- S = Q K^T
// for this warpgroup's 64 rows and K/V slot s: D/16 k-steps, the first overwriting S.
template <class T, int D, int BN>
__device__ __forceinline__ void issue_qk(float (&sacc)[BN / 2], const Smem<D, BN> &sm, int wg,
                                         int q_slot, int s) {
  using Tag = typename TypeOps<T>::Tag;
  // Every operand of the descriptors (q_slot, wg, s, the Smem fields) is warp-uniform and known so
  // to ptxas (see broadcast_tile_state), so they are built with uniform instructions (UIADD3,
  // ULEA) straight into the uniform registers HGMMA reads, and Q's, the same for every K/V tile of
  // a work tile, stay there across the K/V loop. Kept in vector registers, they had to be moved
  // into uniform registers with two R2URs right before each HGMMA (and hoisted Q descriptors
  // spilled at d128 block_n 192).
  const uint32_t q_base = sm.q_tile(q_slot) + uint32_t(wg) * kRowsPerWarpgroup * 128;
  const DescBase dq = desc_base(q_base, 16), dk = desc_base(sm.k_tile(s), 16);
  const uint32_t q_chunk16 = sm.q_chunk_bytes() >> 4;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint64_t da = dq.plus16((kk / 4) * q_chunk16).at((kk % 4) * 32);
    const uint64_t db = dk.at((kk / 4) * Smem<D, BN>::kKvChunk + (kk % 4) * 32);
    wgmma_ss(sacc, da, db, kk > 0 ? 1 : 0, Tag{}, IntC<BN>{});
  }
}

// O += P V for K/V slot s: BN/16 k-steps of m64 x D x 16, P from registers.
template <class T, int D, int BN>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&pa)[BN / 16][4],
                                         const Smem<D, BN> &sm, int s) {
  using Tag = typename TypeOps<T>::Tag;
  const DescBase dv = desc_base(sm.v_tile(s), Smem<D, BN>::kKvChunk);
#pragma unroll
  for (int kt = 0; kt < BN / 16; ++kt)
    wgmma_rs(o, pa[kt], dv.at(kt * 16 * 128), Tag{}, IntC<D>{});
}

template <class T, int D, int BN>
__device__ __forceinline__ void recompute_s(float (&sacc)[BN / 2], const KernelArgs &a,
                                            const WorkTile &w, int row0, int j, int lane) {
  const T *q = static_cast<const T *>(a.q) + int64_t(w.b()) * a.o_batch + int64_t(w.h()) * a.o_head;
  const T *k = static_cast<const T *>(a.k) + int64_t(w.b()) * a.k_batch +
               int64_t(w.h() / a.group) * a.k_head;
  const int key0 = j * BN + 2 * (lane % 4);
  const T *qr[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = row0 + 8 * hh;
    qr[hh] = row < a.seqlen_q ? q + int64_t(row) * a.o_seq : nullptr;
  }
  // One key at a time in a loop that is not unrolled, each a loop over d, the result put in place
  // by compile-time-indexed selects: a handful of registers and one copy of the loop. Unrolled over
  // the keys (one d loop each) this path took uniform registers from the HGMMA descriptors of the
  // K/V loop around it and spilled at block_n 192.
#pragma unroll 1
  for (int kk = 0; kk < BN / 4; ++kk) {
    const int key = key0 + 8 * (kk / 2) + kk % 2;
    float s0 = 0.f, s1 = 0.f;
    if (key < a.seqlen_kv) {
      const T *kr = k + int64_t(key) * a.k_seq;
#pragma unroll 1
      for (int d = 0; d < D; ++d) {
        const float kv = fb::kernels::Elem<T>::to_float(kr[d]);
        if (qr[0] != nullptr)
          s0 = fmaf(fb::kernels::Elem<T>::to_float(qr[0][d]), kv, s0);
        if (qr[1] != nullptr)
          s1 = fmaf(fb::kernels::Elem<T>::to_float(qr[1][d]), kv, s1);
      }
    }
#pragma unroll
    for (int i = 0; i < BN / 4; ++i)
      if (i == kk) {
        sacc[4 * (i / 2) + i % 2] = s0;
        sacc[4 * (i / 2) + 2 + i % 2] = s1;
      }
  }
}

// Positions in the CTA's K/V ring: RingPos (kernels/common/hopper/ring.cuh).
using fb::hopper::RingPos;

// Named barriers of the ping-pong turn ring (2 or 3 consumers): consumer wg waits on its own turn
// and opens the next one's (mod consumers).
__device__ __forceinline__ int turn_bar(int wg) { return kBarTurn0 + wg; }
__device__ __forceinline__ int next_turn_bar(int wg, int consumers) {
  return kBarTurn0 + (wg + 1 == consumers ? 0 : wg + 1);
}

// A K/V tile this warpgroup does not compute (rows past seqlen_q; keys right of its diagonal)
// still has its books kept, or the others would wait forever: its ping-pong turn, taken in the
// ring's order, and both ring slots handed back. A slot goes back only once it has filled: an
// arrive before the fill would count towards the phase of the slot's previous use.
template <int D, int BN>
__device__ __forceinline__ void pass_k(const KernelArgs &a, const Smem<D, BN> &sm, int wg,
                                       const RingPos &r) {
  mbar_wait(sm.k_full(r.s), r.use & 1);
  if (a.pingpong) {
    named_sync(turn_bar(wg), 256);
    named_arrive(next_turn_bar(wg, a.consumers), 256);
  }
  if (threadIdx.x % 32 == 0)
    mbar_arrive(sm.k_empty(r.s));
}
template <int D, int BN>
__device__ __forceinline__ void pass_v(const Smem<D, BN> &sm, const RingPos &r) {
  mbar_wait(sm.v_full(r.s), r.use & 1);
  if (threadIdx.x % 32 == 0)
    mbar_arrive(sm.v_empty(r.s));
}

// The CTA's next work tile with keys to visit, as the producer hands it over with Q slot use
// `q_use` (tile_info, after q_full: Q has landed too); empty tiles on the way are written here and
// their slot handed back. False at the end of the CTA's work.
//
// A tile in which all 64 rows of this warpgroup lie past seqlen_q (the last Q tile of a
// block_m 192 launch at N 512: rows 512-575) is passed over here too. Run, TMA's zero fill would
// make it do both GEMMs and the softmax for rows nobody reads: 11% of a d64 N512 launch's tensor
// and MUFU work (ncu: 17% more MUFU instructions than cuDNN's). It still keeps the books: per K/V
// tile it takes its ping-pong turn, and it hands each ring slot back only once the slot has filled
// (an arrive before the fill would count towards the phase of the slot's previous use), which
// moves the ring position r on. Here rather than in the consumer's loop, where the branch cost
// d128 block_n 192 a 4-byte spill.
template <class T, int D, int BN, int MODE>
__device__ __forceinline__ bool fetch_tile(const KernelArgs &a, const Smem<D, BN> &sm, int wg,
                                           int &q_use, TileCtx &c, RingPos &r) {
  while (true) {
    const int slot = q_use & (sm.q_bufs - 1), parity = (q_use >> (sm.q_bufs - 1)) & 1; // 1 or 2
    mbar_wait(sm.q_full(slot), parity);
    FA3_TRACE_ONLY(const unsigned long long t_q = trace_now();)
    // Lane 0 reads the slot and passes it on: lane 0 is also the lane that hands the slot back
    // (q_empty, release_k), so program order alone puts every read of use n before the producer's
    // write of use n + q_bufs (racecheck flagged the other lanes' reads, which nothing ordered
    // with lane 0's arrive).
    int4 info = make_int4(0, 0, 0, 0);
    if (threadIdx.x % 32 == 0)
      info = ld_shared_v4(sm.tile_info(slot));
    const WorkTile w{__shfl_sync(0xffffffffu, info.x, 0), __shfl_sync(0xffffffffu, info.y, 0),
                     __shfl_sync(0xffffffffu, info.z, 0), __shfl_sync(0xffffffffu, info.w, 0)};
    if (w.n_tiles < 0)
      return false;
    if (w.n_tiles > 0 && w.q0 + wg * kRowsPerWarpgroup < a.seqlen_q) {
      c = make_ctx<MODE>(a, w, wg, slot, BN);
      FA3_TRACE_ONLY(c.t_q = t_q;)
      return true;
    }
    if (w.n_tiles > 0) { // all rows past seqlen_q
      for (int j = w.j0(); j < w.n_tiles; ++j) {
        pass_k(a, sm, wg, r);
        pass_v(sm, r);
        r.next(sm.stages);
      }
    } else {
      write_empty_tile<T, D>(a, w, wg);
    }
    if (threadIdx.x % 32 == 0)
      mbar_arrive(sm.q_empty(slot));
    ++q_use;
  }
}

// A consumer warpgroup: its place in the ping-pong turn ring, the softmax state of its 64 rows (O,
// the row offsets m, the lane-partial row sums l, the factors alpha by which O must be rescaled),
// S and P of the K/V tile in flight, and the steps that the K/V loops of a work tile are made of:
// overlapped_tile (intra_wg_overlap on) and serial_tile (off).
template <class T, int D, int BN, int MODE> struct Consumer {
  // Once every row of the warp has an offset (after the tile in which all its rows saw a key),
  // tiles go through softmax_tile_optimistic; not with the exact rescale (slack -inf).
  // In the non-causal kernels (plain, split) every row sees the first key of its work tile's first
  // K/V tile, so after the tile start's exact softmax the warp is settled, and the overlapped loop
  // runs the optimistic softmax at every step: it holds no copy of the exact one but the overflow's
  // redo. So does the causal kernel, which starts every work tile at key 0 and runs only problems
  // whose every row sees key 0 (traits.hpp kernel_mode). Launches always pass the lazy slack.
  static constexpr bool kSettledLoop =
      MODE == kModePlain || MODE == kModeSplit || MODE == kModeCausal;

  const KernelArgs &a;
  const Smem<D, BN> &sm;
  const int wg, lane;
  // Read once here: loaded by the mask where it runs, they moved in the PTX of the K/V loop.
  const int sq, skv;
  const bool causal, pp;
  const float sl2;
  // Turn ring over the consumers (2 or 3): consumer w waits on turn w, opens turn w+1 (mod C).
  const int my_turn, other_turn;
  bool lazy;
  float p_bound;

  // The register tiles and the softmax state are the caller's locals, one array each (Regs), and
  // this object holds references to them, as lambdas capturing by reference would. Held here as
  // members, they made the whole object one alloca that SROA could not split until the loops
  // indexing them were unrolled, so every scalar member and the references to a and sm stayed in
  // memory through the early optimisations; the PTX came out different and ptxas spilled 12 bytes
  // at d64 block_n 128 with three consumers.
  struct Regs {
    float (&o)[D / 2];
    float (&m)[2], (&l)[2], (&alpha)[2];
    float (&sacc)[BN / 2];
    uint32_t (&pa)[BN / 16][4];
  };
  float (&o)[D / 2];
  float (&m)[2], (&l)[2], (&alpha)[2];
  bool grew = true;     // the last softmax moved an offset: O needs `alpha` before its next P V
  bool settled = false; // warp-uniform
  float (&sacc)[BN / 2];
  uint32_t (&pa)[BN / 16][4];
  FA3_TRACE_ONLY(ConsumerTrace tr;)

  __device__ __forceinline__ Consumer(const KernelArgs &args, const Smem<D, BN> &smem, int w,
                                      const Regs &regs)
      : a(args), sm(smem), wg(w), lane(threadIdx.x % 32), sq(args.seqlen_q), skv(args.seqlen_kv),
        causal(causal_of<MODE>(args)), pp(args.pingpong != 0), sl2(args.scale_log2),
        my_turn(turn_bar(w)), other_turn(next_turn_bar(w, args.consumers)), o(regs.o), m(regs.m),
        l(regs.l), alpha(regs.alpha), sacc(regs.sacc), pa(regs.pa) FA3_TRACE_ONLY(, tr(w)) {
    // The last consumer opens consumer 0's first turn, before the rescale slack is read: read in
    // the initialiser list, its parameter load moved above the arrive in the PTX.
    if (pp && wg == args.consumers - 1)
      named_arrive(kBarTurn0, 256);
    lazy = kSettledLoop || args.rescale_slack > 0.f;
    p_bound = lazy ? exp2f(args.rescale_slack) : 0.f;
  }

  __device__ __forceinline__ void qk_turn_begin() const {
    if (pp)
      named_sync(my_turn, 256);
  }
  __device__ __forceinline__ void qk_turn_end() const {
    if (pp)
      named_arrive(other_turn, 256);
  }
  // Q K^T(j) of tile c retired: the producer may refill this K slot while we do softmax; after this
  // warpgroup's last one of the tile, its Q slot too (n_wg = n_tiles in the ablation path).
  __device__ __forceinline__ void release_k(int s, int j, const TileCtx &c) const {
    if (lane == 0) {
      mbar_arrive(sm.k_empty(s));
      if (j == c.n_wg - 1)
        mbar_arrive(sm.q_empty(c.q_slot));
    }
  }
  __device__ __forceinline__ void release_v(int s) const {
    if (lane == 0)
      mbar_arrive(sm.v_empty(s));
  }

  // A work tile's start: no key seen, O = 0.
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      m[hh] = -INFINITY, l[hh] = 0.f;
    settled = false;
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
      o[i] = 0.f;
  }
  __device__ __forceinline__ void exact_softmax(bool right_dead) {
    grew = softmax_tile<BN>(sacc, m, l, alpha, sl2, a.rescale_slack, right_dead);
    settled = lazy && __all_sync(0xffffffffu, m[0] > -INFINITY && m[1] > -INFINITY);
  }
  // The mask of K/V tile j where it needs one; true when its right half holds no key for this warp.
  __device__ __forceinline__ bool mask_tile(const TileCtx &c, int j) {
    if (j < c.first_mask)
      return false;
    apply_mask<BN>(sacc, c.row0, j * BN, lane, sq, skv, causal);
    return half_diag_tile<BN, MODE>(a, c, wg, j);
  }
  // The softmax of K/V tile j, optimistic where `optimistic` (the warp is settled), else exact.
  // True when S was lost to an overflowing exp2 (warp-uniform): the caller then runs redo_softmax
  // before packing P. In the overlap loop it does so after P V(j-1) retired, so that P of j-1 is
  // no longer live: with O, S and that P live the recompute's few registers spilled (bn192).
  __device__ __forceinline__ bool mask_and_softmax(const TileCtx &c, int j, bool optimistic) {
    const bool right_dead = mask_tile(c, j);
    if (optimistic) {
      const int r = softmax_tile_optimistic<BN>(sacc, m, l, alpha, sl2, p_bound, right_dead);
      grew = r == 1;
      return r == 2;
    }
    exact_softmax(right_dead);
    return false;
  }
  __device__ __forceinline__ void redo_softmax(const TileCtx &c, int j) {
    recompute_s<T, D, BN>(sacc, a, c.w, c.row0, j, lane);
    exact_softmax(mask_tile(c, j));
  }
  __device__ __forceinline__ void rescale_o() {
    if (grew) // warp-uniform
      rescale<D>(o, alpha);
  }

  // S = Q K^T of K slot s alone, in this consumer's turn, waited for.
  __device__ __forceinline__ void compute_s(int q_slot, int s) {
    qk_turn_begin();
    wgmma_fence();
    issue_qk<T, D, BN>(sacc, sm, wg, q_slot, s);
    wgmma_commit();
    qk_turn_end();
    wgmma_wait<0>();
    fence_operands(sacc);
  }
  // P V of V slot s retired: O is valid, P's registers are free and the slot goes back.
  __device__ __forceinline__ void retire_pv(int s) {
    wgmma_wait<0>();
    fence_operands(o);
    fence_operands(pa);
    release_v(s);
  }

  // intra_wg_overlap off: one K/V tile at a time, each GEMM waited for (the ablation).
  __device__ __forceinline__ void serial_tile(const TileCtx &c, RingPos &r) {
    reset();
    for (int j = j_first<D, MODE>(c); j < c.n_wg; ++j) {
      mbar_wait(sm.k_full(r.s), r.use & 1);
      compute_s(c.q_slot, r.s);
      release_k(r.s, j, c);
      if (mask_and_softmax(c, j, settled))
        redo_softmax(c, j);
      rescale_o();
      pack_p<T, BN>(pa, sacc);
      mbar_wait(sm.v_full(r.s), r.use & 1);
      wgmma_fence();
      issue_pv<T, D, BN>(o, pa, sm, r.s);
      wgmma_commit();
      retire_pv(r.s);
      r.next(sm.stages);
    }
    for (int j = 0, n = pass_count<MODE>(a, c, wg, BN); j < n; ++j) { // as in overlapped_tile
      pass_k(a, sm, wg, r);
      pass_v(sm, r);
      r.next(sm.stages);
    }
    end_tile<T, D, BN, MODE>(a, sm, wg, c, o, m, l);
  }

  // The ring position and the Q slot are the same in every lane, but ptxas does not prove it for
  // values carried around the work-tile loop (whose exit goes through fetch_tile), and then builds
  // every HGMMA descriptor from them in vector registers, with two R2URs per HGMMA right before it
  // (44 R2URs in the d128 block_n 128 K/V loop's issue, the HGMMAs waiting on them). A broadcast
  // from lane 0 at each tile start makes them uniform for the compiler (one R2UR left there). Not
  // in serial_tile: its SASS got worse with it.
  __device__ __forceinline__ void broadcast_tile_state(TileCtx &c, RingPos &r) const {
    r.s = __shfl_sync(0xffffffffu, r.s, 0);
    r.use = __shfl_sync(0xffffffffu, r.use, 0);
    c.q_slot = __shfl_sync(0xffffffffu, c.q_slot, 0);
    c.w.part = __shfl_sync(0xffffffffu, c.w.part, 0); // kept in a uniform register
  }
  // Q K^T into S (Q from q_slot, K from ring slot r) and, on top, O *= alpha then P V (V from the
  // slot before r, whose P is in pa): both GEMMs in flight, in this consumer's turn. O is not an
  // operand of Q K^T, so the rescale runs while it does.
  __device__ __forceinline__ void issue_qk_and_pv(int q_slot, const RingPos &r) {
    qk_turn_begin();
    wgmma_fence();
    issue_qk<T, D, BN>(sacc, sm, wg, q_slot, r.s);
    wgmma_commit();
    rescale_o();
    wgmma_fence();
    issue_pv<T, D, BN>(o, pa, sm, r.prev(sm.stages).s);
    wgmma_commit();
    qk_turn_end();
  }
  // Pin the softmax results above the wait that follows: without these the compiler sinks the
  // whole softmax (max, exp2, row sums) below `wait_group 0` (the SASS had every MUFU.EX2 after
  // WARPGROUP.DEPBAR.LE gsb0, 0x0), which serializes it behind the P V in flight and made
  // overlap ~15% slower than no overlap on the first GPU run.
  __device__ __forceinline__ void pin_above_wait() {
    fence_operands(sacc);
    fence_operands(alpha);
    fence_operands(l);
    fence_operands(m);
    pin_softmax(sm.pin_slot(int(threadIdx.x)), l, alpha);
  }

  // intra_wg_overlap on. Inside a tile, Q K^T(j) and P V(j-1) are issued together and softmax(j)
  // runs while P V(j-1) is in flight. A tile starts on its own (Q K^T(0), wait, softmax(0)) and
  // ends with its last P V alone, then O. (Issuing the next work tile's Q K^T(0) with this
  // tile's last P V was tried: no gain, up to 7% lost at d64.)
  // The K/V tile whose P is in pa is always the one before r: derived rather than carried (a copy
  // of r carried in the loop was kept in a vector register and its V descriptors with it).
  __device__ __forceinline__ void overlapped_tile(TileCtx &c, RingPos &r) {
    FA3_TRACE_ONLY(tr.stamp(3);)
    // The tile's start on its own: S(0), softmax, P; its P V is issued with the next Q K^T.
    broadcast_tile_state(c, r);
    reset();
    mbar_wait(sm.k_full(r.s), r.use & 1);
    FA3_TRACE_ONLY(tr.put(7, c.t_q); tr.stamp(8);)
    compute_s(c.q_slot, r.s);
    FA3_TRACE_ONLY(tr.stamp(9);)
    release_k(r.s, j_first<D, MODE>(c), c);
    mask_and_softmax(c, j_first<D, MODE>(c), false); // the exact softmax, never a redo
    pack_p<T, BN>(pa, sacc);
    r.next(sm.stages);
    FA3_TRACE_ONLY(tr.stamp(4);)
    // The overflow's redo leaves the K/V loop (break) and re-enters it after the step, so that
    // its code (recompute + exact softmax) lies outside the loop a step runs through. In the plain
    // kernel at head_dim 64 only: there an A/B gained 0.5-3% at N >= 1024, at d128 it lost
    // 0.5-1%; the all-paths and split kernels of d64 with three consumers and d128 block_n 192
    // spilled 8-20 bytes with it, head_dim 256 36-44.
    constexpr bool kRedoExit = MODE == kModePlain && D == 64;
    for (int j = j_first<D, MODE>(c) + 1; j < c.n_wg;) {
      bool redo = false;
      for (; j < c.n_wg; ++j) {
        // Both waits come before the first issue: nothing that may spin sits between the two
        // GEMMs in flight.
        mbar_wait2(sm.k_full(r.s), r.use & 1, sm.v_full(r.prev(sm.stages).s),
                   r.prev(sm.stages).use & 1);
        issue_qk_and_pv(c.q_slot, r); // Q K^T(j), P V(j-1)
        wgmma_wait<1>();              // S of tile j is ready; P V of tile j-1 may still run
        fence_operands(sacc);
        release_k(r.s, j, c);
        redo = mask_and_softmax(c, j, kSettledLoop || settled);
        pin_above_wait();
        retire_pv(r.prev(sm.stages).s);
        if (redo) {
          if constexpr (kRedoExit)
            break;
          redo_softmax(c, j);
          redo = false;
        }
        pack_p<T, BN>(pa, sacc);
        r.next(sm.stages);
      }
      if (!redo)
        break;
      redo_softmax(c, j);
      pack_p<T, BN>(pa, sacc);
      r.next(sm.stages);
      ++j;
    }
    // The last P V alone, then the tile's O.
    mbar_wait(sm.v_full(r.prev(sm.stages).s), r.prev(sm.stages).use & 1);
    rescale_o();
    wgmma_fence();
    issue_pv<T, D, BN>(o, pa, sm, r.prev(sm.stages).s);
    wgmma_commit();
    // The K/V tiles right of this warpgroup's diagonal: their turns and K slots now, in the
    // place of the Q K^T that is not issued, so the other consumers' turns are not held up by
    // this one's O; their V slots after it (the producer needs them only for the next tile's
    // second V).
    const int n_pass = pass_count<MODE>(a, c, wg, BN);
    RingPos rk = r;
    for (int j = 0; j < n_pass; ++j) {
      pass_k(a, sm, wg, rk);
      rk.next(sm.stages);
    }
    retire_pv(r.prev(sm.stages).s);
    FA3_TRACE_ONLY(tr.stamp(5);)
    end_tile<T, D, BN, MODE>(a, sm, wg, c, o, m, l);
    FA3_TRACE_ONLY(tr.end_item(c);)
    for (int j = 0; j < pass_count<MODE>(a, c, wg, BN); ++j) {
      pass_v(sm, r);
      r.next(sm.stages);
    }
    FA3_TRACE_ONLY(tr.stamp(2);)
  }
};

// A consumer warpgroup's share of every work tile of the CTA: its 64 rows of each Q tile against
// the tile's K/V tiles, then O and LSE. The work tiles come from the producer (fetch_tile),
// whatever the scheduler.
template <class T, int D, int BN, bool OVERLAP, int MODE>
__device__ __forceinline__ void consumer(const KernelArgs &a, const Smem<D, BN> &sm, int wg) {
  float o[D / 2], m[2], l[2], alpha[2], sacc[BN / 2];
  uint32_t pa[BN / 16][4];
  Consumer<T, D, BN, MODE> cs(a, sm, wg, {o, m, l, alpha, sacc, pa}); // opens the first turn
  int q_use = 0; // Q slot uses (work tiles, empty ones included) before the current tile
  RingPos r;     // K/V tile j of the current work tile
  TileCtx c;
  if (fetch_tile<T, D, BN, MODE>(a, sm, wg, q_use, c, r)) {
    do {
      if constexpr (OVERLAP)
        cs.overlapped_tile(c, r);
      else
        cs.serial_tile(c, r);
    } while (fetch_tile<T, D, BN, MODE>(a, sm, wg, ++q_use, c, r));
  }
  // The last consumer opened consumer 0's turn after its last Q K^T (and at the start): consumer 0
  // takes that turn here, so every named barrier ends with as many arrivals as waits.
  if (cs.pp && wg == 0)
    named_sync(kBarTurn0, 256);
  // The last O copies must have read the staging buffer before the CTA's shared memory goes.
  if (a.o_tma && threadIdx.x % 128 == 0)
    bulk_wait_all();
  FA3_TRACE_ONLY(cs.tr.finish();)
}

} // namespace fb::fa3::detail
