// Measured ceilings of a device: a large bf16 GEMM through cuBLAS (random data) and a device-to-device copy
// (bytes read + written). Reports normalise by these, not by datasheet numbers.
#pragma once

#include "flashbench/counters.hpp"
#include "flashbench/device.hpp"

#include <nlohmann/json_fwd.hpp>

#include <vector>

namespace fb {

struct Ceilings {
  double gemm_bf16_tflops =
      0; // sustained: median over >= 0.2 s of cold samples (the clock may drop)
  double gemm_bf16_tflops_burst = 0; // median of 10 back-to-back products right after warm-up
  int gemm_mnk = 0;                  // square size used
  double copy_gbps = 0;              // read + write, SI GB/s
  double copy_bytes = 0;             // bytes read + written per copy
  double sm_clock_mhz = 0;           // median clock during the GEMMs
};

Ceilings measure_ceilings(const DeviceInfo &dev);

// A copy kernel of known traffic (bytes read + bytes written), timed and profiled: the counters' sanity check.
struct CopyProbe {
  size_t bytes = 0;
  double median_us = 0, gbps = 0;
  Occupancy occupancy;
  Counters counters;
};
CopyProbe run_copy_probe(const DeviceInfo &dev, size_t bytes, bool with_counters);

// The read floor: the shortest time in which this device, timed the way every point is (cold L2 by the policy's
// flush, CUDA events around one launch behind a held stream), reads `bytes` from HBM. A read-only streaming kernel is
// tried at several shapes (blocks per SM x independent 16-byte loads per thread) and the fastest is kept. bytes = 0
// times an empty kernel: the floor of any point. This is what a memory-bound kernel of that size can hope for
// (flash_decoding at B = 1, for example), measured rather than taken from the datasheet.
struct ReadFloor {
  size_t bytes = 0;
  double median_us = 0, gbps = 0, sm_clock_mhz = 0;
  int blocks_per_sm = 0, loads_in_flight = 0; // the fastest shape
};
std::vector<ReadFloor> measure_read_floor(const DeviceInfo &dev, const std::vector<size_t> &sizes);
void to_json(nlohmann::json &j, const ReadFloor &r);
void to_json(nlohmann::json &j, const Ceilings &c);

} // namespace fb
