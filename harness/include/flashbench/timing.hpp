// Timing method, after nvbench's cold measurement:
//  - the L2 is flushed before every sample, so each sample sees a cold cache. The default flush ("read") reads a
//    buffer of twice the L2's size that nothing writes, so the L2 is left full of clean lines: the timed kernel
//    pays for its own traffic only. nvbench and triton's do_bench flush by writing (a memset, "write"), which
//    leaves the L2 full of dirty lines that the next kernel must write back to DRAM before its own lines fit:
//    about 50-60 MB of write-back charged to whatever runs next, which dominates a 10-30 us decode kernel
//    (flash_decoding/HISTORY.md measured it). "write" is kept to reproduce those tools' numbers;
//  - while one sample's work is queued, the stream is held by a blocking kernel, so host launch overhead never
//    lands between the events;
//  - each sample is one pair of CUDA events around the variant's launches;
//  - the load (`queue`): "round_trip" (default) times one sample per host round trip, so the GPU idles while the
//    host syncs, reads the clock and queues the next; "back_to_back" queues batches of samples (~10 ms of GPU
//    work each) behind the one running, so the GPU idles only for the flushes, as in triton's do_bench (the
//    issue anchors' method) or a training step. Under a power cap the clock follows the load, so two harnesses
//    compare kernels fairly only under the same one: scripts/peers.py queues the same way;
//  - samples whose SM clock (NVML) fell under 75% of the maximum are dropped as throttled;
//  - sampling stops once there are >= min_samples, >= min_time of GPU time and the relative standard deviation
//    is <= max_noise; or at timeout, when the point is marked noisy if the noise target was not met.
#pragma once

#include "flashbench/device.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fb {

struct TimingPolicy {
  int min_samples = 10;
  double max_noise = 0.005; // relative standard deviation target
  double min_time_s = 0.5;  // GPU time summed over kept samples
  double timeout_s = 15.0;  // wall-clock cap for one point's sampling
  int max_samples = 100000;
  bool cold = true; // flush L2 before each sample
  std::string flush =
      "read"; // how: "read" (leaves clean lines) or "write" (memset, as nvbench / do_bench)
  int warmup_runs = 3;
  double throttle_fraction = 0.75;
  // Before a point's warm-up, wait (up to this long) until NVML reports no power or thermal slowdown: a point then
  // does not inherit the power cap that the previous point, or this point's float64 verification, ran into.
  double settle_s = 2.0;
  // Whole-point deadline (prepare + verify + time + counters), enforced by the sweep's supervisor: past it the
  // worker process is killed and the point is recorded as a timeout.
  double point_timeout_s = 120.0;
  // The load the timed loop puts on the GPU: "round_trip" or "back_to_back" (see the top of this file).
  std::string queue = "round_trip";
};

void to_json(nlohmann::json &j, const TimingPolicy &t);

struct TimingStats {
  std::vector<double> samples_us; // kept samples, in order
  int dropped_throttled = 0;
  double median_us = 0, min_us = 0, max_us = 0, mean_us = 0;
  double cv = 0;           // relative standard deviation of the kept samples
  double sm_clock_mhz = 0; // median SM clock over the samples (0 when unknown)
  bool noisy = false;      // stopped at the timeout above the noise target
  std::string stop_reason; // "noise", "timeout", "max_samples"
  double wall_s = 0;
  double settle_wait_s = 0; // waited before warm-up for power/thermal slowdown to clear
  unsigned long long slowdown_at_start = 0; // NVML reasons still set when sampling began (0: none)
  // The load the timed loop put on the GPU. Under a power cap the clock depends on it, so two harnesses compare
  // kernels fairly only at similar values (scripts/peers.py reports the same two fields).
  double busy_fraction =
      0; // GPU time inside the samples (kept and dropped) over the timed loop's wall time
  double power_w = 0; // mean board power over the timed loop (NVML energy counter; 0 when unknown)
  // Batches not kept because the load was not what `queue` asks for: back_to_back, the GPU had caught up with the
  // host (a launch's latency may be inside their samples); round_trip, the stream hold gave up (synchronous launches).
  int void_batches = 0;
};

// The stopping rule alone, host-only so it is testable: feed samples, ask whether to stop.
class StoppingRule {
public:
  explicit StoppingRule(const TimingPolicy &p) : policy_(p) {}
  // Returns true once sampling should stop; `wall_s` is the wall-clock time since sampling began.
  bool add(double sample_us, double wall_s);
  bool timed_out(double wall_s) const { return wall_s >= policy_.timeout_s; }
  const std::vector<double> &samples() const { return samples_; }
  double relative_stddev() const;
  std::string reason() const { return reason_; }

private:
  TimingPolicy policy_;
  std::vector<double> samples_;
  double sum_ = 0, sum_sq_ = 0, gpu_time_s_ = 0;
  std::string reason_;
};

// Summary statistics of kept samples (median, min, max, mean, cv).
TimingStats summarize(std::vector<double> samples_us);

// One step of the timed loop: samples in microseconds, timed back to back or one per round trip. A void batch's
// samples count towards the load (busy_fraction) but are not kept.
struct SampleBatch {
  std::vector<double> us;
  bool is_void = false;
};
// The timed loop's bookkeeping without the GPU (Timer::measure runs it; scripts/peers.py's sample_loop is the same):
// takes batches from `next` until the stopping rule says stop. `clock_mhz` (0: unknown) is read once per batch;
// a batch taken under throttle_fraction of `max_mhz` is dropped, and still counts towards busy_fraction. `now_s` is
// the wall clock. Fills samples_us and the statistics, dropped_throttled, stop_reason, noisy, wall_s,
// busy_fraction, sm_clock_mhz and void_batches.
TimingStats sample_loop(const std::function<SampleBatch()> &next,
                        const std::function<int()> &clock_mhz, int max_mhz,
                        const TimingPolicy &policy, const std::function<double()> &now_s);

// Reads the SM clock of one device through NVML, loaded at run time (a missing driver library is not an error:
// clocks are then reported as 0 and no sample is dropped).
class ClockReader {
public:
  explicit ClockReader(const std::string &pci_bus_id);
  ~ClockReader();
  bool available() const { return device_ != nullptr; }
  int sm_clock_mhz() const;     // current
  int sm_clock_max_mhz() const; // maximum
  // NVML clock-slowdown reasons that come from power or heat (0 when none, or NVML cannot say).
  unsigned long long slowdown_reasons() const;
  // Energy the board has used since the driver loaded, in millijoules (-1 when NVML cannot say).
  long long energy_mj() const;
  std::string driver_version() const;

private:
  void *device_ = nullptr;
};

// Queues a one-thread kernel that spins for `ns` nanoseconds of the GPU's global timer (0: returns at once) on
// `stream`. The test slowdown (FLASHBENCH_TEST_SLOWDOWN) adds it to a variant's timed samples.
void gpu_spin(cudaStream_t stream, double ns);

class BackToBack; // timer.cu: the queue of policy queue back_to_back

// GPU timer for one device: owns the L2 flush buffer, the blocking kernel's flag and the events.
class Timer {
public:
  Timer(const DeviceInfo &dev, cudaStream_t stream);
  ~Timer();
  Timer(const Timer &) = delete;
  Timer &operator=(const Timer &) = delete;

  // Runs warmups, then samples `launch` until the policy says stop.
  TimingStats measure(const std::function<void(cudaStream_t)> &launch, const TimingPolicy &policy);
  // One cold sample in microseconds (flush, hold, record, launch, record, release, sync); -1 when the sample is
  // void because the launch blocked the host while the stream was held (the hold is then switched off).
  double sample_us(const std::function<void(cudaStream_t)> &launch, bool cold);
  // Flushes with the last measured policy's method ("read" before any measure()), or with `how`.
  void flush_l2();
  void flush_l2(const std::string &how);

private:
  friend class BackToBack;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string policy_flush_ = "read";
};

} // namespace fb
