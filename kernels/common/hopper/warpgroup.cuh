// Warp specialisation on Hopper (sm_90a): register reallocation between warpgroups (setmaxnreg) and
// named barriers (bar.sync / bar.arrive) among a subset of the CTA's warps.
#pragma once

namespace fb::hopper {

// A producer warpgroup that only issues loads gives registers back; the consumer warpgroups take
// them. R is a multiple of 8 in [24, 256], the same in every thread of the warpgroup.
template <int R> __device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R> __device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
// Barrier `id` (1..15; 0 is __syncthreads) completes once `threads` threads (a multiple of 32) have
// arrived: sync arrives and waits, arrive only arrives.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

} // namespace fb::hopper
