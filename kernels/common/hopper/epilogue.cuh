// The output tile of one consumer warpgroup (64 rows, the m64nD WGMMA accumulator) through shared
// memory and TMA stores, as the Hopper attention kernels write O.
#pragma once

#include "kernels/common/hopper/tma.cuh"
#include "kernels/common/hopper/warpgroup.cuh"
#include "kernels/common/mma.cuh"

#include <cstdint>

namespace fb::hopper {

// A store_tile_tma hook that does nothing.
struct NoHook {
  __device__ __forceinline__ void operator()(int) const {}
};

// stmatrix puts the normalised accumulators, packed to T (bf16 or fp16), into the staging buffer in
// the 128B-swizzled layout of the output map's boxes (conflict free: the 8 rows of an 8x8 matrix
// land in 8 different 16-byte units); then one thread issues a TMA store per 64-column chunk and
// the warpgroup goes on while the copy engine writes; rows past the sequence end are clipped by the
// map. 4-byte stores straight from the accumulators cost fa3_pipelined ~18% of its consumer warps'
// time at d128 N512 (ncu: SHFL and register reuse stalled behind 32 queued STG a thread). Before
// rewriting the buffer, the issuing thread waits until its previous store has read it, and the
// warpgroup's named barrier `bar` passes that on.
//   buf, chunk_bytes: the staging buffer's column chunk 0 (rows of 128 bytes); chunk c starts
//     c * chunk_bytes further. The warpgroup's 64 rows start at row buf_row of each chunk.
//     (buf_row rather than a buf moved by it: with the offset folded into buf, fa3_pipelined's
//     PTX kept the moved base live across the stmatrix stores and differed from the code that was
//     measured.)
//   kGivenThread, given_t: with kGivenThread, the thread's index in the warpgroup (0..127) is the
//     caller's given_t rather than threadIdx.x % 128 here, so that the lane arithmetic below is the
//     caller's own values. fa3_fp8's consumer has int(threadIdx.x) % 128: with it, the stmatrix
//     addresses are hoisted out of its work-item loop and its K/V loop keeps the softmax scale
//     and the mask bounds in uniform registers, as its code before this function was shared did.
//     With threadIdx.x % 128 recomputed here, ptxas moved those to vector registers in that loop
//     (64 FFMA and ~70 ISETP reading them) and fa3_fp8 ran 1-4% slower at N = 4096-16384 on an
//     H100. Without kGivenThread the code is unchanged: any other way of passing t (an argument
//     or a functor, from the call site or a wrapper) changed fa3_pipelined's PTX.
//   o, inv: the accumulator (acc[4i + e] = row 16 warp + lane / 4 + 8 (e / 2), column 8i +
//     2 (lane % 4) + e % 2) and 1 / l of the thread's two rows.
//   (row, h, b): the output map's coordinates of the tile's first row.
//   hook(k): run by every thread after its stmatrix writes (k = 0) and after its proxy fence (k =
//   1).
template <class T, int D, class Hook = NoHook, bool kGivenThread = false>
__device__ __forceinline__ void store_tile_tma(const void *tmap, uint32_t buf, uint32_t chunk_bytes,
                                               int bar, int row, int h, int b,
                                               const float (&o)[D / 2], const float (&inv)[2],
                                               int buf_row = 0, Hook hook = {}, int given_t = 0) {
  using Pack = fb::kernels::Mma<T>;
  const int t = kGivenThread ? given_t : int(threadIdx.x % 128), warp = t / 32, lane = t % 32;
  if (t == 0)
    bulk_wait_read_all();
  named_sync(bar, 128);
  // Lane 8j + r addresses row r of matrix j: j % 2 = row half, j / 2 = second column block.
  const int mtx = lane / 8, r = lane % 8;
  const uint32_t row_addr = buf + uint32_t(buf_row + 16 * warp + 8 * (mtx % 2) + r) * 128;
#pragma unroll
  for (int i = 0; i < D / 8; i += 2) {
    const int ii = i + mtx / 2; // column block (8 columns) this lane addresses
    const uint32_t addr = row_addr + uint32_t(ii / 8) * chunk_bytes + uint32_t(((ii % 8) ^ r) * 16);
    stmatrix_x4(addr, Pack::pack(o[4 * i + 0] * inv[0], o[4 * i + 1] * inv[0]),
                Pack::pack(o[4 * i + 2] * inv[1], o[4 * i + 3] * inv[1]),
                Pack::pack(o[4 * i + 4] * inv[0], o[4 * i + 5] * inv[0]),
                Pack::pack(o[4 * i + 6] * inv[1], o[4 * i + 7] * inv[1]));
  }
  hook(0);
  fence_proxy_async_smem(); // this thread's stmatrix writes, visible to the TMA (the async proxy)
  hook(1);
  named_sync(bar, 128);
  if (t == 0) {
    const uint64_t evict_first = l2_policy_evict_first();
#pragma unroll
    for (int c = 0; c < D / 64; ++c)
      tma_store_4d(tmap, buf + uint32_t(c) * chunk_bytes + uint32_t(buf_row) * 128, c * 64, row, h,
                   b, evict_first);
    bulk_commit();
  }
}

} // namespace fb::hopper
