// The current device's L2 size in bytes, read once per process: launches that order their CTAs by what fits the
// L2 (fa3_bwd's sections) size that order on every launch, and a timed launch should not pay a driver query each
// time. Host-only. fa3_pipelined's launch.cuh has its own copy: moving it here changes that variant's source hash
// and so stales its tuning-table entries; it moves at its next re-tune.
#pragma once

#include "flashbench/check.hpp"

#include <cstdint>
#include <cuda_runtime.h>

namespace fb::kernels {

inline int64_t l2_bytes() {
  static const int64_t bytes = [] {
    int dev = 0, v = 0;
    FB_CUDA_CHECK(cudaGetDevice(&dev));
    FB_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev));
    return int64_t(v);
  }();
  return bytes;
}

} // namespace fb::kernels
