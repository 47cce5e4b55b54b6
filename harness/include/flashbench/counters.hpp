// Hardware counters through CUPTI's range profiler (cupti_range_profiler.h + cupti_profiler_host.h, CUDA 12.6+),
// and theoretical occupancy through the occupancy API.
//
// Counters are read in a pass of their own, after timing and after an L2 flush, so DRAM bytes are cold-cache
// bytes. One user range covers the variant's whole launch (every kernel it queues), replayed by flashbench once per
// pass the metric set needs. When counters cannot be read (no privileges, virtualised device, another profiler
// attached, a build without CUPTI) nothing fails: every record gets counters = null and the reason.
#pragma once

#include "flashbench/device.hpp"
#include "flashbench/variant.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fb {

// The default metric set: all single-pass on GH100.
std::vector<std::string> default_metrics();

struct Counters {
  bool available = false;
  std::string reason;                   // why not available
  std::map<std::string, double> values; // metric name -> value, in the metric's own unit
  std::vector<std::string>
      untrusted; // "sm__warps_active...: 103.2% is over 100%", "1 range dropped"
  int passes = 0;
  double seconds = 0; // wall time spent collecting this point
};

void to_json(nlohmann::json &j, const Counters &c);

// Derived, report-ready fields from the raw values (DRAM bytes, occupancy %, ...); missing metrics stay absent.
nlohmann::json summarize_counters(const Counters &c);

class CounterSession {
public:
  // Never throws for an environment problem: check available()/reason(). Throws UserError when a requested metric
  // name is unknown on this chip (that is the user's to fix).
  CounterSession(const DeviceInfo &dev, std::vector<std::string> metrics);
  ~CounterSession();
  CounterSession(const CounterSession &) = delete;
  CounterSession &operator=(const CounterSession &) = delete;

  bool available() const { return available_; }
  const std::string &reason() const { return reason_; }
  const std::vector<std::string> &metrics() const { return metrics_; }
  int passes() const { return passes_; }

  // Profiles one point: for each pass, `flush` (outside the range), then the range around `launch`.
  Counters profile(const std::string &range_name, const std::function<void(cudaStream_t)> &launch,
                   const std::function<void()> &flush, cudaStream_t stream);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> metrics_;
  bool available_ = false;
  std::string reason_;
  int passes_ = 0;
};

// Theoretical occupancy of one kernel and what limits it.
struct Occupancy {
  std::string kernel;
  int block_threads = 0;
  int registers_per_thread = 0;
  int64_t smem_per_block = 0; // static + dynamic
  int blocks_per_sm = 0;
  double theoretical_pct = 0; // active warps / max warps per SM
  std::string limiter;        // "registers" | "shared_memory" | "warps" | "blocks"
  std::map<std::string, int> blocks_by_limit;
};

// Pure arithmetic (testable without a GPU): blocks per SM allowed by each resource, and the smallest one.
// reserved_smem_per_block is the runtime's per-block reservation (1 KB on sm_80/sm_90).
Occupancy occupancy_from_resources(const DeviceInfo &dev, int block_threads, int regs_per_thread,
                                   int64_t smem_per_block, int64_t reserved_smem_per_block = 1024);
// From the kernel's compiled attributes, cross-checked against cudaOccupancyMaxActiveBlocksPerMultiprocessor.
Occupancy theoretical_occupancy(const DeviceInfo &dev, const KernelDesc &k);

void to_json(nlohmann::json &j, const Occupancy &o);

} // namespace fb
