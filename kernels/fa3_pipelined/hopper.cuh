// Hopper (sm_90a) building blocks written against the PTX ISA: mbarriers, TMA tile loads, WGMMA
// shared-memory descriptors and fences, register reallocation (setmaxnreg) and named barriers. No
// CUTLASS/CuTe.
//
// Shared-memory tile layout used by every operand (Q, K, V): TMA with CU_TENSOR_MAP_SWIZZLE_128B
// writes a box of 64 elements (128 bytes) x R rows as R rows of 128 bytes, the 16-byte chunk c of
// row r landing at chunk c ^ (r % 8) (the XOR takes address bits [7:9] into bits [4:6], so the tile
// base must be 1024-byte aligned). A head_dim of D is D/64 such boxes ("column chunks"), each R x
// 128 bytes, placed one after another. WGMMA's 128B-swizzle mode applies the same XOR to the
// addresses it computes, so the descriptors below describe the unswizzled (logical) layout:
//   K-major operand (Q as A, K as B of S = Q K^T; rows = M or N, contiguous = head_dim = the GEMM's
//   K):
//     8-row core-matrix groups 1024 bytes apart (SBO = 1024); LBO unused for swizzled K-major
//     (encoded 1). k-step kk (16 elements = 32 bytes) of column chunk kk/4 starts at chunk_base +
//     (kk % 4) * 32: the descriptor's start address advances by 32 bytes inside the 128-byte
//     swizzle row (the hardware swizzles the sum).
//   MN-major operand (V as B of O = P V; K = keys = rows, N = head_dim contiguous), tnspB = 1:
//     8 key rows are one 1024-byte group (SBO = 1024, the K direction); the next 64 head_dim
//     columns are the next column chunk, R * 128 bytes further (LBO = R * 128, the N direction).
//     k-step kt (16 keys) starts at base + kt * 16 * 128.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fb::fa3::detail {

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers
// ----------------------------------------------------------------------------------------------
// Phase parity: a fresh barrier is in phase 0. wait(parity) returns once the phase with that parity
// has completed, so the n-th completion (n = 0, 1, ...) is awaited with parity n & 1.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the inits visible to the async proxy (TMA's complete_tx) and to the other threads after a
// __syncthreads.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// One arrival plus `bytes` of expected transaction count (the TMA loads that complete on this
// barrier).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 "
               "%0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// Two waits whose try_waits go out back to back, so their round trips overlap (v8: the consumer's
// K and V waits at the top of the K/V loop, 7% of its time in ncu, one after the other before).
__device__ __forceinline__ void mbar_wait2(uint32_t bar0, uint32_t parity0, uint32_t bar1,
                                           uint32_t parity1) {
  const bool ok0 = mbar_try_wait(bar0, parity0);
  const bool ok1 = mbar_try_wait(bar1, parity1);
  if (!(ok0 && ok1)) {
    mbar_wait(bar0, parity0);
    mbar_wait(bar1, parity1);
  }
}

// 16 bytes in shared memory, written by one thread and read by others after an mbarrier wait (the
// arrive releases, the wait acquires): the work tile a producer hands to its consumers.
__device__ __forceinline__ void st_shared_v4(uint32_t addr, int4 v) {
  asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
__device__ __forceinline__ int4 ld_shared_v4(uint32_t addr) {
  int4 v;
  asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// ---- TMA
// ------------------------------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_desc(const void *tmap) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}
// A 4-D box (c0 = head_dim column, c1 = sequence row, c2 = head, c3 = batch) into shared memory at
// dst; completes `box bytes` of transactions on `bar`. Out-of-bounds elements (rows past the
// sequence end) are written as zeros and still count toward the transaction bytes.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *tmap, uint32_t bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
               "[%0], [%1, {%2, %3, %4, %5}], "
               "[%6];" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
               : "memory");
}

// An L2 eviction-priority policy for O's stores (v41): O is written once and not read back by this kernel.
// Measured on an H100 (session 31, c162): +0.7-1.3% at causal d128 N512, where the kernel is DRAM-bound, and
// neutral elsewhere; the DRAM reads did not drop, so why it helps is not known.
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// Shared -> global: the box of `tmap` at (c0, c1, c2, c3) from shared memory at src, in the
// issuing thread's bulk async-group, with the L2 policy `policy`. Out-of-bounds rows of the box (past the
// sequence end) are not written. The shared memory may be reused once wait_group.read says the group has been
// read.
__device__ __forceinline__ void tma_store_4d(const void *tmap, uint32_t src, int c0, int c1, int c2,
                                             int c3, uint64_t policy) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group.L2::cache_hint "
               "[%0, {%2, %3, %4, %5}], [%1], %6;" ::"l"(reinterpret_cast<uint64_t>(tmap)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// This thread's bulk stores have finished reading shared memory (the buffer may be rewritten).
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// This thread's bulk stores are complete (before the CTA exits and its shared memory goes).
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// Generic-proxy writes to shared memory (st.shared, stmatrix) made visible to the async proxy (TMA).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Four 8x8 16-bit matrices to shared memory: register i holds this thread's (row lane/4, columns
// 2 (lane%4), +1) of matrix i, and lane 8i + r gives the address of row r of matrix i.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---- WGMMA
// ------------------------------------------------------------------------------------------------------
// Descriptor bits: [0,14) start address >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4, [49,52) base
// offset (0: the tiles are 1024-byte aligned), [62,64) swizzle mode (1 = 128B).
__device__ __forceinline__ uint64_t make_desc(uint32_t smem, uint32_t lbo_bytes,
                                              uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16;
  d |= static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}
// A descriptor split into the word that moves and the word that does not (v8). The k-steps of one
// GEMM differ only in the start address, so the loop adds a constant to the low word: one integer
// add per descriptor. make_desc per k-step cost 5-6 ALU ops plus the moves into uniform registers,
// ~180 instructions per warp and K/V tile at d 128, issued inside the ping-pong turn (ncu, v7: 24%
// of the consumer warps' time). A shared address is below 2^18, so start >> 4 stays within its 14
// bits and the add never carries into LBO.
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

// Empty asm fences order nothing for ptxas, which hoisted (fa3_pipelined v2; fa3_fp8 v2 the same, c170) `wgmma.wait_group 0` above the whole
// softmax (the SASS of v1 and of a v2 with only the fences: WARPGROUP.DEPBAR.LE gsb0, 0x0 right
// after the mask branch, every MUFU.EX2 below it). ptxas keeps shared-memory stores ordered with
// WARPGROUP.DEPBAR (WGMMA reads shared memory), so one store per thread of a value that depends
// on every exp2 of the tile (the lane-partial row sums l) and on alpha pins the softmax above the
// wait. The slot is private to the thread and never read.
__device__ __forceinline__ void pin_softmax(uint32_t slot, const float (&l)[2],
                                            const float (&alpha)[2]) {
  const float v = (l[0] + l[1]) + (alpha[0] + alpha[1]);
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(slot), "f"(v) : "memory");
}

// ---- warp specialization
// -------------------------------------------------------------------------------------
template <int R> __device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R> __device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- flags between CTAs (v15, the stream-K tail)
// ---------------------------------------------------------------------------------------
// A flag raised with release semantics at GPU scope: a barrier before it orders the other threads'
// stores first, and the release covers them (cumulativity). Its reader polls with acquire, then a
// barrier passes what it saw on to its own threads.
__device__ __forceinline__ void st_release_gpu(int *p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_acquire_gpu(const int *p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

} // namespace fb::fa3::detail
