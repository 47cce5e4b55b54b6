// Warp and block reductions for row statistics (max and sum of a softmax row).
#pragma once

#include <cuda_runtime.h>

namespace fb::kernels {

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Online-softmax merge of two partial (max, sum-of-exp) pairs; -inf maxima (nothing seen yet) merge
// without NaN.
__device__ __forceinline__ void merge_max_sum(float &m, float &l, float m2, float l2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY)
    return;
  l = l * expf(m - mn) + l2 * expf(m2 - mn);
  m = mn;
}

// Adds one element x to a running (max, sum-of-exp) with a single exp.
__device__ __forceinline__ void online_add(float &m, float &l, float x) {
  if (x > m) {
    l = l * expf(m - x) + 1.f; // m = -inf gives l * 0 + 1
    m = x;
  } else {
    l += expf(x - m);
  }
}

// All threads of the block get the block-wide (max, sum-of-exp). `scratch` holds 64 floats;
// blockDim.x is a multiple of 32. Ends with a barrier, so scratch may be reused afterwards.
__device__ __forceinline__ void block_max_sum(float &m, float &l, float *scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
    merge_max_sum(m, l, m2, l2);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0)
    scratch[warp] = m, scratch[32 + warp] = l;
  __syncthreads();
  m = -INFINITY, l = 0.f;
  for (int w = 0; w < warps; ++w)
    merge_max_sum(m, l, scratch[w], scratch[32 + w]);
  __syncthreads();
}

} // namespace fb::kernels
