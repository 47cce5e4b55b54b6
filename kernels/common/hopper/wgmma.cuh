// Hopper (sm_90a) warpgroup MMA (WGMMA) support written against the PTX ISA: shared-memory matrix
// descriptors, the fence / commit / wait of the asynchronous groups, and the register pins that
// keep ptxas from moving accumulator reads across them. The instruction wrappers themselves are in
// wgmma_f16.cuh (bf16, fp16) and wgmma_fp8.cuh (e4m3).
//
// Descriptors describe the unswizzled (logical) layout of a 128B-swizzled tile (tma.cuh), since
// WGMMA applies the swizzle to the addresses it computes:
//   K-major operand (rows = M or N, contiguous = the GEMM's K; e.g. Q as A and K as B of S = Q
//   K^T):
//     8-row core-matrix groups 1024 bytes apart (SBO = 1024); LBO unused for swizzled K-major
//     (encoded 1). A k-step of 32 bytes inside column chunk kc starts at chunk_base + (step % 4) *
//     32: the descriptor's start address advances inside the 128-byte swizzle row (the hardware
//     swizzles the sum).
//   MN-major operand (16-bit V as B of O = P V; K = keys = rows, N = head_dim contiguous),
//   tnspB = 1: 8 key rows are one 1024-byte group (SBO = 1024, the K direction); the next 64
//   head_dim columns are the next column chunk, R * 128 bytes further (LBO = R * 128, the N
//   direction). k-step kt (16 keys) starts at base + kt * 16 * 128.
//   K-major operand of 64-byte rows under the 64B swizzle (desc_base_64b; fa3_fp8's e4m3 Q and K
//   at head_dim 64): 8-row groups 512 bytes apart (SBO = 512), LBO unused (encoded 1), swizzle
//   mode 2. A k-step of 32 bytes starts at base + step * 32, inside the 64-byte row: the hardware
//   applies the 64B XOR (address bits [7:8] into [4:5]) to the sum, as TMA did when it wrote the
//   tile, so the tile base must be 512-byte aligned (base offset 0).
#pragma once

#include <cstdint>

namespace fb::hopper {

// Overload tags of the instruction wrappers: the input type and the instruction's N.
struct Bf16Tag {};
struct F16Tag {};
struct E4m3Tag {};
template <int N> struct IntC {};

// Descriptor bits: [0,14) start address >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4, [49,52) base
// offset (0: the tiles are aligned to their swizzle pattern's repeat), [62,64) swizzle mode
// (layout type: 0 none, 1 = 128B, 2 = 64B, 3 = 32B).
constexpr uint32_t kSwizzleMode128B = 1;
constexpr uint32_t kSwizzleMode64B = 2;
__device__ __forceinline__ uint64_t make_desc(uint32_t smem, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                              uint32_t swizzle_mode = kSwizzleMode128B) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16;
  d |= static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32;
  d |= static_cast<uint64_t>(swizzle_mode & 3u) << 62;
  return d;
}
// A descriptor split into the word that moves and the word that does not. The k-steps of one GEMM
// differ only in the start address, so the loop adds a constant to the low word: one integer add
// per descriptor. make_desc per k-step cost 5-6 ALU ops plus the moves into uniform registers, ~180
// instructions per warp and K/V tile at head_dim 128, issued inside the ping-pong turn (ncu: 24% of
// fa3_pipelined's consumer warps' time). A shared address is below 2^18, so start >> 4 stays within
// its 14 bits and the add never carries into LBO.
struct DescBase {
  uint32_t lo, hi;
  // The descriptor of the tile `byte_off` bytes past the base (byte_off a multiple of 16).
  __device__ __forceinline__ uint64_t at(uint32_t byte_off) const {
    return (static_cast<uint64_t>(hi) << 32) | (lo + (byte_off >> 4));
  }
  // The base moved by `units` of 16 bytes (a run-time stride, shifted once by the caller).
  __device__ __forceinline__ DescBase plus16(uint32_t units) const { return {lo + units, hi}; }
};
__device__ __forceinline__ DescBase desc_base(uint32_t smem, uint32_t lbo_bytes) {
  const uint64_t d = make_desc(smem, lbo_bytes, 1024);
  return {static_cast<uint32_t>(d), static_cast<uint32_t>(d >> 32)};
}
// A K-major tile of 64-byte rows under the 64B swizzle (tma.cuh's swizzle_64b): 8-row groups of
// 512 bytes (SBO), LBO unused for a swizzled K-major operand (16, encoded 1), swizzle mode 2. The
// k-steps move the start address inside the 64-byte row (at(32 * step)).
__device__ __forceinline__ DescBase desc_base_64b(uint32_t smem) {
  const uint64_t d = make_desc(smem, 16, 512, kSwizzleMode64B);
  return {static_cast<uint32_t>(d), static_cast<uint32_t>(d >> 32)};
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Pins registers in place across the asm statements around it: a read of an accumulator cannot move
// above the wait that makes it valid, and an A-fragment register stays live (unchanged) until the
// wait that retires its wgmma.
template <int N> __device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void fence_operands(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    asm volatile("" : "+r"(r[i])::"memory");
}
template <int M> __device__ __forceinline__ void fence_operands(uint32_t (&r)[M][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
    fence_operands(r[i]);
}

// Empty asm fences order nothing for ptxas, which hoisted `wgmma.wait_group 0` above the whole
// softmax of an overlapped consumer loop (in both fa3_pipelined and fa3_fp8: the SASS had
// WARPGROUP.DEPBAR.LE gsb0, 0x0 right after the mask branch, every MUFU.EX2 below it). ptxas keeps
// shared-memory stores ordered with WARPGROUP.DEPBAR (WGMMA reads shared memory), so one store per
// thread of a value that depends on every exp2 of the tile (the lane-partial row sums l) and on
// alpha pins the softmax above the wait. The slot is private to the thread and never read.
__device__ __forceinline__ void pin_softmax(uint32_t slot, const float (&l)[2],
                                            const float (&alpha)[2]) {
  const float v = (l[0] + l[1]) + (alpha[0] + alpha[1]);
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(slot), "f"(v) : "memory");
}

} // namespace fb::hopper
