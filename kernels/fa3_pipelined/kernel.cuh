// The fa3_pipelined kernel: shared memory and barriers set up, then warpgroup 0 produces and the
// others consume.
#pragma once

#include "kernels/fa3_pipelined/consumer.cuh"
#include "kernels/fa3_pipelined/kernel_args.cuh"
#include "kernels/fa3_pipelined/producer.cuh"

namespace fb::fa3::detail {

// A CTA per work tile (one_shot) or per resident slot (persistent, walking the work tiles):
// warpgroup 0 produces, warpgroups 1..consumers consume. WIDE = false: 1 or 2
// consumers (384 threads at most, consumers get 240 registers); WIDE = true (head_dim 64): 3
// consumers, 512 threads, 24 x 128 + 160 x 384 = 64512 <= 65536 registers. MODE
// (traits.hpp): the paths compiled in (all, or only non-causal, causal or stream-K's).
template <class T, int D, int BN, bool OVERLAP, bool WIDE, int MODE>
__global__ void __launch_bounds__(WIDE ? 512 : 384, 1)
    fa3_kernel(const __grid_constant__ KernelArgs a) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const int block_m = kRowsPerWarpgroup * a.consumers;
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const Smem<D, BN> sm(base, block_m, a.stages, a.o_tma != 0, a.q_bufs);
  if (threadIdx.x == 0) {
    for (int slot = 0; slot < a.q_bufs; ++slot) {
      mbar_init(sm.q_full(slot), 1);
      mbar_init(sm.q_empty(slot), 4 * a.consumers);
    }
    for (int s = 0; s < a.stages; ++s) {
      mbar_init(sm.k_full(s), 1);
      mbar_init(sm.v_full(s), 1);
      mbar_init(sm.k_empty(s), 4 * a.consumers);
      mbar_init(sm.v_empty(s), 4 * a.consumers);
    }
    mbar_fence_init();
  }
  __syncthreads();

  // Warp-uniform by construction (a broadcast), so the role branch is uniform for the compiler too.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (wg == 0) {
    regs_dealloc<kProducerRegs>();
    if (threadIdx.x == 0)
      producer<D, BN, MODE>(a, sm);
    return;
  }
  regs_alloc<WIDE ? kConsumerRegsWide : kConsumerRegs>();
  consumer<T, D, BN, OVERLAP, MODE>(a, sm, wg - 1);
}

} // namespace fb::fa3::detail
