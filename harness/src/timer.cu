// The GPU half of the timing method in timing.hpp: L2 flush, the stream-holding kernel, CUDA events.
#include "flashbench/check.hpp"
#include "flashbench/nvtx.hpp"
#include "flashbench/timing.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <stdexcept>
#include <thread>

namespace fb {

namespace {

__device__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Holds the stream until the host has queued a whole sample, so that host launch latency never falls between the
// two events. Gives up after `timeout_ns` (a variant that synchronises inside launch() would otherwise deadlock)
// and says so through `timed_out`.
__global__ void hold_stream(const volatile int* release, unsigned long long timeout_ns, int* timed_out) {
  const unsigned long long start = global_timer_ns();
  while (*release == 0) {
    if (global_timer_ns() - start > timeout_ns) {
      *timed_out = 1;
      return;
    }
    __nanosleep(500);
  }
}

__global__ void empty_kernel() {}

// The "read" flush: every thread streams 16-byte words of the buffer. The sum is stored only if it equals a value
// the buffer cannot produce (the buffer is all 0x01 bytes), so the loads stay and nothing is written.
__global__ void read_flush(const uint4* buf, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(buf + i);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0xdeadbeefu) *sink = acc;
}

// Under Nsight Compute (and other tools that serialise launches) a launch blocks the host until the kernel has run,
// so a stream held by the spinning kernel would stall every sample until the hold's timeout. Probe it once: hold the
// stream for at most 200 ms and see whether a following launch returns at once. FLASHBENCH_NO_STREAM_HOLD=1 forces
// the hold off.
bool launches_are_asynchronous(cudaStream_t stream, int* device_flags, volatile int* host_flags) {
  if (const char* off = std::getenv("FLASHBENCH_NO_STREAM_HOLD"); off && std::string(off) == "1") return false;
  host_flags[0] = 0;
  host_flags[1] = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // The clock starts before the hold: a tool that serialises launches blocks in the hold's own launch.
  const auto t0 = std::chrono::steady_clock::now();
  hold_stream<<<1, 1, 0, stream>>>(device_flags, 200'000'000ull, device_flags + 1);
  FB_CHECK_LAUNCH();
  empty_kernel<<<1, 1, 0, stream>>>();
  FB_CHECK_LAUNCH();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  host_flags[0] = 1;
  FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  return s < 0.1;
}

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

} // namespace

struct Timer::Impl {
  DeviceInfo dev;
  cudaStream_t stream = nullptr;
  void* l2_buffer = nullptr;
  size_t l2_bytes = 0;
  int* host_flags = nullptr;   // [0] release, [1] timed_out; pinned and mapped
  int* device_flags = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ClockReader clocks;
  bool hold = true; // hold the stream while a sample is queued (off where launches are synchronous)

  explicit Impl(const DeviceInfo& d, cudaStream_t s) : dev(d), stream(s), clocks(d.pci_bus_id) {
    // Twice the L2 so that a flush evicts every line even with the L2's partitioned (near/far) halves.
    l2_bytes = static_cast<size_t>(std::max<int64_t>(d.l2_bytes, 1 << 20)) * 2;
    FB_CUDA_CHECK(cudaMalloc(&l2_buffer, l2_bytes + 256));
    FB_CUDA_CHECK(cudaMemset(l2_buffer, 1, l2_bytes));
    FB_CUDA_CHECK(cudaDeviceSynchronize());
    FB_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_flags), 2 * sizeof(int), cudaHostAllocMapped));
    FB_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flags), host_flags, 0));
    FB_CUDA_CHECK(cudaEventCreate(&start));
    FB_CUDA_CHECK(cudaEventCreate(&stop));
    hold = launches_are_asynchronous(stream, device_flags, host_flags);
  }
  ~Impl() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFreeHost(host_flags);
    cudaFree(l2_buffer);
  }
};

Timer::Timer(const DeviceInfo& dev, cudaStream_t stream) : impl_(std::make_unique<Impl>(dev, stream)) {}
Timer::~Timer() = default;

void Timer::flush_l2() { flush_l2(policy_flush_); }

void Timer::flush_l2(const std::string& how) {
  Impl& m = *impl_;
  if (how == "write") {
    FB_CUDA_CHECK(cudaMemsetAsync(m.l2_buffer, 1, m.l2_bytes, m.stream));
    return;
  }
  const int blocks = std::max(1, m.dev.sm_count) * 4;
  read_flush<<<blocks, 512, 0, m.stream>>>(static_cast<const uint4*>(m.l2_buffer), m.l2_bytes / 16,
                                          reinterpret_cast<unsigned*>(static_cast<char*>(m.l2_buffer) + m.l2_bytes));
  FB_CHECK_LAUNCH();
}

double Timer::sample_us(const std::function<void(cudaStream_t)>& launch, bool cold) {
  Impl& m = *impl_;
  volatile int* flags = m.host_flags;
  flags[0] = 0;
  flags[1] = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const bool hold = m.hold;
  if (hold) {
    hold_stream<<<1, 1, 0, m.stream>>>(m.device_flags, 1'000'000'000ull, m.device_flags + 1);
    FB_CHECK_LAUNCH();
  }
  if (cold) flush_l2();
  FB_CUDA_CHECK(cudaEventRecord(m.start, m.stream));
  launch(m.stream);
  FB_CUDA_CHECK(cudaEventRecord(m.stop, m.stream));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  flags[0] = 1;
  FB_CUDA_CHECK(cudaEventSynchronize(m.stop));
  if (flags[1]) {
    // The hold gave up before the host released it: this launch blocked the host (a tool serialising launches, or
    // a variant that synchronises). The sample is void; later samples run without the hold.
    m.hold = false;
    return -1.0;
  }
  float ms = 0;
  FB_CUDA_CHECK(cudaEventElapsedTime(&ms, m.start, m.stop));
  return static_cast<double>(ms) * 1e3;
}

TimingStats Timer::measure(const std::function<void(cudaStream_t)>& launch, const TimingPolicy& policy) {
  Impl& m = *impl_;
  // Re-checked per point: a profiler attached or initialised since the last point can make launches synchronous.
  m.hold = launches_are_asynchronous(m.stream, m.device_flags, m.host_flags);
  policy_flush_ = policy.flush;
  double settle_wait = 0;
  if (m.clocks.available() && policy.settle_s > 0) {
    const double s0 = now_s();
    while (m.clocks.slowdown_reasons() != 0 && now_s() - s0 < policy.settle_s)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    settle_wait = now_s() - s0;
  }
  const unsigned long long slowdown = m.clocks.available() ? m.clocks.slowdown_reasons() : 0;
  {
    ScopedRange r{"warmup"};
    for (int i = 0; i < policy.warmup_runs; ++i) {
      if (policy.cold) flush_l2();
      launch(m.stream);
    }
    FB_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  }
  ScopedRange r{"time"};
  StoppingRule rule(policy);
  std::vector<double> clocks;
  int dropped = 0;
  const int max_mhz = m.dev.sm_clock_max_mhz;
  double busy_us = 0; // every timed sample's GPU time, dropped ones included: the load the loop put on the GPU
  const long long energy0 = m.clocks.available() ? m.clocks.energy_mj() : -1;
  const double t0 = now_s();
  for (;;) {
    const double us = sample_us(launch, policy.cold);
    if (us < 0) continue; // void sample (see sample_us)
    busy_us += us;
    const int mhz = m.clocks.available() ? m.clocks.sm_clock_mhz() : 0;
    const double wall = now_s() - t0;
    if (mhz > 0 && max_mhz > 0 && mhz < policy.throttle_fraction * max_mhz) {
      ++dropped; // throttled: this sample says more about the clock than the kernel
      if (rule.timed_out(wall) && rule.samples().size() >= 3) break;
      if (rule.timed_out(wall * 0.5) && rule.samples().empty())
        throw std::runtime_error("every sample was throttled below " +
                                 std::to_string(static_cast<int>(policy.throttle_fraction * 100)) +
                                 "% of the maximum SM clock");
      continue;
    }
    if (mhz > 0) clocks.push_back(mhz);
    if (rule.add(us, wall)) break;
  }
  TimingStats t = summarize(rule.samples());
  t.dropped_throttled = dropped;
  t.stop_reason = rule.reason().empty() ? "timeout" : rule.reason();
  t.noisy = t.cv > policy.max_noise;
  t.wall_s = now_s() - t0;
  const long long energy1 = energy0 >= 0 ? m.clocks.energy_mj() : -1;
  if (t.wall_s > 0) {
    t.busy_fraction = busy_us * 1e-6 / t.wall_s;
    // NVML's energy counter moves in steps of tens of ms (an H200 read 0 to 1000 W over 60-ms loops): shorter
    // loops get no power figure rather than a wrong one.
    if (energy0 >= 0 && energy1 >= energy0 && t.wall_s >= 0.5) t.power_w = (energy1 - energy0) * 1e-3 / t.wall_s;
  }
  t.settle_wait_s = settle_wait;
  t.slowdown_at_start = slowdown;
  if (!clocks.empty()) {
    std::nth_element(clocks.begin(), clocks.begin() + clocks.size() / 2, clocks.end());
    t.sm_clock_mhz = clocks[clocks.size() / 2];
  }
  return t;
}

} // namespace fb
