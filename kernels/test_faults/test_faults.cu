// Kernels that fail on purpose, for the sweep engine's fault-isolation tests (registered only with
// FLASHBENCH_TEST_VARIANTS=1). Each one fails the way a buggy attention kernel would:
//   illegal_access: a store to an unmapped address -> cudaErrorIllegalAddress, a sticky error;
//   trap:           __trap() -> cudaErrorLaunchFailure, sticky;
//   spin:           never returns (a hang: only killing the process ends it).
#include "kernels/test_faults/test_faults.hpp"
#include <cstdint>

#include "flashbench/check.hpp"

#include <cuda_runtime.h>

namespace fb::test_faults {
namespace {

__global__ void illegal_access_kernel(int *p) {
  // An address no allocation ever gets; volatile so that the store is not optimised away.
  *reinterpret_cast<volatile int *>(p) = threadIdx.x;
}

__global__ void trap_kernel() { __trap(); }

__global__ void spin_kernel(long long never) {
  // clock64() never equals `never` (-1), but the compiler cannot know that, so the loop stays.
  for (;;) {
    if (clock64() == never)
      break;
    __nanosleep(1000);
  }
}

} // namespace

void launch_fault(Fault f, cudaStream_t stream) {
  switch (f) {
  case Fault::illegal_access:
    illegal_access_kernel<<<1, 32, 0, stream>>>(reinterpret_cast<int *>(uintptr_t{0x10}));
    break;
  case Fault::trap:
    trap_kernel<<<1, 32, 0, stream>>>();
    break;
  case Fault::spin:
    spin_kernel<<<1, 32, 0, stream>>>(-1);
    break;
  case Fault::none:
    return;
  }
  FB_CHECK_LAUNCH();
}

} // namespace fb::test_faults
