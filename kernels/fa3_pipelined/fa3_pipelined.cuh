// FlashAttention-3-style forward for Hopper (sm_90a): TMA loads into a multi-stage shared-memory
// ring completed on mbarriers, both GEMMs on asynchronous WGMMA, a producer warpgroup and one to
// three consumer warpgroups.
//
// What it changes relative to FA2 (fa2_q_outer) and why:
//  - Loads: one thread of a producer warpgroup issues TMA box copies (cp.async.bulk.tensor) of Q
//    once and of K/V tiles into a `stages`-deep ring; completion is tracked by mbarrier
//    transaction counts (k_full/v_full), and the consumers hand K and V slots back separately
//    (k_empty/v_empty). No thread computes an address or a bounds check for a load: rows past the
//    sequence end arrive as zeros (TMA out-of-bounds fill) and are masked in S.
//  - GEMMs: S = Q K^T is WGMMA with both operands in shared memory (SS, m64 x block_n x 16 per
//    k-step); O += P V is WGMMA with P from registers (RS, m64 x head_dim x 16): the fp32 S
//    accumulators become bf16/fp16 A fragments in place, as in FA2, but the instruction is
//    warpgroup-wide and asynchronous.
//  - Warp specialization: the producer gives registers back (setmaxnreg.dec to 24), consumers take
//    them (setmaxnreg.inc to 240), so O (64 x head_dim), S (64 x block_n) and P fit in registers
//    at head_dim 128.
//  - pingpong (2 or 3 consumers): the consumers take turns to issue Q K^T (named barriers), so
//    one's softmax runs while the other's GEMMs occupy the tensor cores.
//  - One kernel per problem kind (traits.hpp kernel_mode): non-causal, causal and stream-K kernels
//    each compile only their own paths, so a short work tile's once-per-tile code does not jump
//    over the others' (the all-paths kernel missed the instruction cache at every such jump).
//  - intra_wg_overlap: tile j+1's Q K^T and tile j's P V are issued back to back; the softmax of
//    j+1 runs while P V of j is still in flight (FA3's two-stage pipelining inside a warpgroup).
//    Costs one more S-sized register set (P of tile j stays live).
//
// Register layouts (per consumer warpgroup of 128 threads; warp w = 0..3 of the warpgroup, lane =
// g*4 + c):
//  - WGMMA accumulator m64nN (S: N = block_n, O: N = head_dim), acc[N/2] fp32 per thread:
//      acc[4i + e] = element (row 16w + g + 8*(e/2), column 8i + 2c + e%2), i = 0..N/8-1.
//    Rows g and g+8 of each warp are "half" 0 and 1; a row's values are spread over the 4 lanes of
//    a quad.
//  - RS A fragment for k-step kt (keys 16kt..16kt+15), 4 x 32-bit (two 16-bit values, low half =
//    lower key):
//      a[0] = (row g, keys 16kt+2c, +1)    = S acc[4(2kt)+0], acc[4(2kt)+1]
//      a[1] = (row g+8, keys 16kt+2c, +1)  = S acc[4(2kt)+2], acc[4(2kt)+3]
//      a[2] = (row g, keys 16kt+8+2c, +1)  = S acc[4(2kt+1)+0], +1
//      a[3] = (row g+8, keys 16kt+8+2c,+1) = S acc[4(2kt+1)+2], +3
//  Shared-memory layouts and descriptors: kernels/common/hopper/tma.cuh and wgmma.cuh.
//
// Barriers (mbarriers in shared memory; parity of use n is n & 1):
//   q_full[q]    count 1 (producer's arrive.expect_tx) + Q bytes, once per work tile that uses Q
//                slot q; a plain arrive for an empty tile or the end, which load nothing. Either
//                way the arrive publishes the tile in tile_info(q).
//   q_empty[q]   count 4 * consumers: lane 0 of every consumer warp after its warpgroup's last
//                Q K^T of a work tile retired (the last tile it computes; it may pass over the
//                rest), or after writing an empty or idle tile; the producer waits on it before
//                reusing the slot (tile_info and Q).
//   k_full[s]    count 1 + K tile bytes; use n of slot s is K/V tile j = n*stages + s.
//   v_full[s]    count 1 + V tile bytes.
//   k_empty[s], v_empty[s]
//                count 4 * consumers: lane 0 of every consumer warp, after its warpgroup's
//                wgmma.wait_group retired the last GEMM reading slot s (K right after its Q K^T,
//                V after its P V, so that K refills while P V runs). The producer waits on use
//                n-1 before refilling.
// Named barriers (bar.sync / bar.arrive, 256 threads = two consumers): ids 1..3 are the turns of
// consumers 0..2. The last consumer opens consumer 0's first turn; each consumer, after issuing its
// Q K^T, opens the next one's turn, and consumer 0 takes one closing turn at the end, so every
// barrier ends with as many arrivals as syncs. Ids 4..6 are each consumer warpgroup's own (its O
// staging buffer, its stream-K partials).
//
// Work tiles: a work tile is one (Q tile, head, batch). They are numbered in one order for every
// scheduler (traits.hpp, tile_coord): (b, h) pairs are cut into L2 sections of whole GQA groups (as
// many as keep their K/V within half the L2, spread evenly over the sections, and at most two waves
// of tiles when causal, one group when not: section_tile_cap), and inside a section the Q tiles go
// heaviest first (causal: the last Q tiles see the most keys), the heads of a section interleaved.
// one_shot launches one CTA per work tile in that order; persistent, dynamic and stream_k launch as
// many CTAs as fit on the device at once. A persistent CTA walks tiles blockIdx.x, + gridDim.x, ...
// (a fixed round robin); a dynamic CTA takes blockIdx.x and then claims each next tile from a
// counter in global memory, so a CTA that drew short causal tiles takes more of them and all
// finish together; stream_k claims as dynamic does and shares the last, partial wave out by K/V
// tiles (traits.hpp, TailSplit). What they buy: the producer loads the next tile's Q and first K
// tile while the consumers still run the last P V and write O, so the pipeline fill of every tile
// but the first is hidden; the K/V ring and the turn ring run on across tiles. The producer decides
// the tiles and hands each to the consumers with its Q slot (tile_info, published before the
// arrive on q_full), so the consumers never decode a tile index.
//
// Causal: tiles past a Q tile's last visible key are never loaded; only tiles straddling the
// diagonal or the sequence end are masked. Rows that see no key keep m = -inf, l = 0 and give
// O = 0, LSE = -inf.
//
// The kernel by role, as FlashAttention's hopper/ splits it:
//   kernel_args.cuh  arguments, shared-memory map, work tile (what every role reads)
//   scheduler.cuh    which work tile or stream-K segment comes next
//   producer.cuh     the producer's TMA loads of Q, K and V
//   block.cuh        the part of a work tile one consumer warpgroup computes
//   softmax.cuh      mask, exact and optimistic softmax, O's rescale, P's packing
//   consumer.cuh     the consumer mainloop: GEMMs, softmax, ring and turns
//   epilogue.cuh     O and LSE out, stream-K partials
//   kernel.cuh       the __global__ function: setup and the role split
//   launch.cuh       host: instantiation, arguments, grid, shared memory, the compiled tiles
//   trace.cuh        the diagnostics build's timestamps (nothing in ordinary builds)
#pragma once

#include "kernels/fa3_pipelined/launch.cuh"
