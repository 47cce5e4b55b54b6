// The current device's SM count and L2 size, each read once per process: launches size their persistent grid
// (fa3_pipelined, fa3_fp8) and their work order's L2 sections (fa3_pipelined, fa3_bwd) on every launch, and a timed
// launch should not pay a driver query each time. Host-only.
#pragma once

#include "flashbench/check.hpp"

#include <cstdint>
#include <cuda_runtime.h>

namespace fb::kernels {

template <cudaDeviceAttr A> int device_attribute() {
  static const int value = [] {
    int dev = 0, v = 0;
    FB_CUDA_CHECK(cudaGetDevice(&dev));
    FB_CUDA_CHECK(cudaDeviceGetAttribute(&v, A, dev));
    return v;
  }();
  return value;
}

inline int sm_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(); }
inline int64_t l2_bytes() { return device_attribute<cudaDevAttrL2CacheSize>(); }

} // namespace fb::kernels
