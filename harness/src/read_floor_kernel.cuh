// The read floor's kernel, in a header so that the standalone probe tools/dev/read_probe.cu (which cannot link
// libflashbench_core) times the very same code as `flashbench probe --read-floor` (probe.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace fb {

// Read-only stream: U independent 16-byte loads per thread in flight per step (the strided layout keeps each warp's
// loads coalesced), folded into a value that is stored only if it equals one the data cannot give, so the loads stay.
template <int U>
__global__ void read_floor_kernel(const uint4 *__restrict__ src, size_t n, unsigned *sink) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + (U - 1) * stride < n; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      v[u] = __ldcs(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u)
      acc += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(src + i);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0xdeadbeefu)
    *sink = acc;
}

} // namespace fb
