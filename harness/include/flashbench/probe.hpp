// Measured ceilings of a device: a large bf16 GEMM through cuBLAS (random data) and a device-to-device copy
// (bytes read + written). Reports normalise by these, not by datasheet numbers.
#pragma once

#include "flashbench/counters.hpp"
#include "flashbench/device.hpp"

#include <nlohmann/json_fwd.hpp>

namespace fb {

struct Ceilings {
  double gemm_bf16_tflops = 0;       // sustained: median over >= 0.2 s of cold samples (the clock may drop)
  double gemm_bf16_tflops_burst = 0; // median of 10 back-to-back products right after warm-up
  int gemm_mnk = 0;            // square size used
  double copy_gbps = 0;        // read + write, SI GB/s
  double copy_bytes = 0;       // bytes read + written per copy
  double sm_clock_mhz = 0;     // median clock during the GEMMs
};

Ceilings measure_ceilings(const DeviceInfo& dev);

// A copy kernel of known traffic (bytes read + bytes written), timed and profiled: the counters' sanity check.
struct CopyProbe {
  size_t bytes = 0;
  double median_us = 0, gbps = 0;
  Occupancy occupancy;
  Counters counters;
};
CopyProbe run_copy_probe(const DeviceInfo& dev, size_t bytes, bool with_counters);
void to_json(nlohmann::json& j, const Ceilings& c);

} // namespace fb
