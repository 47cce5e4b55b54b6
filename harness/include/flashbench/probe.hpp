// Measured ceilings of a device: a large bf16 GEMM through cuBLAS (random data) and a device-to-device copy
// (bytes read + written). Reports normalise by these, not by datasheet numbers.
#pragma once

#include "flashbench/device.hpp"

#include <nlohmann/json_fwd.hpp>

namespace fb {

struct Ceilings {
  double gemm_bf16_tflops = 0; // median over repetitions
  int gemm_mnk = 0;            // square size used
  double copy_gbps = 0;        // read + write, SI GB/s
  double copy_bytes = 0;       // bytes read + written per copy
  double sm_clock_mhz = 0;     // median clock during the GEMMs
};

Ceilings measure_ceilings(const DeviceInfo& dev);
void to_json(nlohmann::json& j, const Ceilings& c);

} // namespace fb
