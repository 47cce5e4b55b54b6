// The current device's SM count, read once per process: persistent-grid launches (fa3_pipelined, fa3_fp8) size
// their grid on every launch, and a timed launch should not pay a driver query each time. Host-only.
#pragma once

#include "flashbench/check.hpp"

#include <cuda_runtime.h>

namespace fb::kernels {

inline int sm_count() {
  static const int sms = [] {
    int dev = 0, v = 0;
    FB_CUDA_CHECK(cudaGetDevice(&dev));
    FB_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return sms;
}

} // namespace fb::kernels
