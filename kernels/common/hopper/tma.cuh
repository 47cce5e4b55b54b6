// Hopper (sm_90a) bulk tensor copies (TMA) written against the PTX ISA: tile loads into shared
// memory completed on an mbarrier, tile stores from shared memory in bulk async-groups, the proxy
// fence between them and ordinary shared-memory writes, and stmatrix to fill a store's staging
// buffer. The tensor maps are encoded on the host (tensor_map.hpp).
//
// Shared-memory tile layout of every operand: TMA with CU_TENSOR_MAP_SWIZZLE_128B writes a box of
// 128 bytes x R rows as R rows of 128 bytes, the 16-byte chunk c of row r landing at chunk
// c ^ (r % 8) (the XOR takes address bits [7:9] into bits [4:6], so the tile base must be 1024-byte
// aligned). A head_dim row wider than 128 bytes is several such boxes ("column chunks"), each
// R x 128 bytes, placed one after another. WGMMA's 128B-swizzle mode applies the same XOR to the
// addresses it computes (wgmma.cuh).
//
// A row of 64 bytes (fa3_fp8's e4m3 head_dim 64) takes CU_TENSOR_MAP_SWIZZLE_64B: the XOR takes
// address bits [7:8] into bits [4:5], so the 16-byte chunk c (0..3) of row r lands at chunk
// c ^ ((r / 2) % 4); the pattern repeats every 8 rows (512 bytes), the tile base 512-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fb::hopper {

// Byte offset of (row, byte) in a tile of 128-byte rows as the 128B swizzle lays it out: the
// 16-byte chunk c of row r sits at chunk c ^ (r % 8).
__device__ __forceinline__ uint32_t swizzle_128b(uint32_t row, uint32_t byte) {
  return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15);
}
// Byte offset of (row, byte) in a tile of 64-byte rows as the 64B swizzle lays it out: two rows
// share a 128-byte line, and the 16-byte chunk c of row r sits at chunk c ^ ((r / 2) % 4) (address
// bits [7:8] of row * 64 into bits [4:5]).
__device__ __forceinline__ uint32_t swizzle_64b(uint32_t row, uint32_t byte) {
  return row * 64 + ((((byte >> 4) ^ (row >> 1)) & 3) << 4) + (byte & 15);
}

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

// An L2 eviction-priority policy for an output written once and not read back by the kernel (O).
// Measured on an H100 for fa3_pipelined's O: +0.7-1.3% at causal d128 N512, where the kernel is
// DRAM-bound, and neutral elsewhere; the DRAM reads did not drop, so why it helps is not known.
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// Shared -> global: the box of `tmap` at (c0, c1, c2, c3) from shared memory at src, in the
// issuing thread's bulk async-group, with the L2 policy `policy`. Out-of-bounds rows of the box
// (past the sequence end) are not written. The shared memory may be reused once wait_group.read
// says the group has been read.
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
// Generic-proxy writes to shared memory (st.shared, stmatrix) made visible to the async proxy (TMA,
// WGMMA).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Orders this thread's generic-proxy global accesses with its async-proxy (bulk) ones, both ways.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
// Adds `bytes` (a multiple of 16, both addresses 16-byte aligned) of fp32 from shared memory into global memory,
// element by element, as one bulk operation of this thread's bulk group (bulk_commit, then bulk_wait_read_all
// before the source is rewritten).
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}
// Four 8x8 16-bit matrices to shared memory: register i holds this thread's (row lane/4, columns
// 2 (lane%4), +1) of matrix i, and lane 8i + r gives the address of row r of matrix i.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// The same, each matrix transposed on the way: register i holds this thread's (row lane/4, columns 2 (lane%4),
// +1) of matrix i as the registers see it, and row r of the stored matrix (from lane 8i + r's address) is column
// r of that. An accumulator tile (rows = keys) goes to shared memory with the queries as rows.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1,
                                                  uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

} // namespace fb::hopper
