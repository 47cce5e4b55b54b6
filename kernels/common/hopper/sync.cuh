// Hopper (sm_90a) synchronisation written against the PTX ISA: mbarriers in shared memory (the
// producer/consumer hand-off of TMA loads and ring slots), 16-byte shared-memory hand-offs
// published by an mbarrier arrive, and release/acquire flags between CTAs. No CUTLASS/CuTe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fb::hopper {

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers
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
// Two waits whose try_waits go out back to back, so that their round trips overlap: a consumer's K
// and V waits at the top of its K/V loop, one after the other, took 7% of its time in ncu.
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
// 8 bytes (two floats) in shared memory: per-row vectors written by one warp and read by others after a
// barrier (the backward's LSE and D rows).
__device__ __forceinline__ void st_shared_f2(uint32_t addr, float2 v) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v.x), "f"(v.y) : "memory");
}
__device__ __forceinline__ float2 ld_shared_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// ---- flags between CTAs
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

} // namespace fb::hopper
