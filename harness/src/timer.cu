// The GPU half of the timing method in timing.hpp: L2 flush, the stream-holding kernel, CUDA events.
#include "flashbench/check.hpp"
#include "flashbench/nvtx.hpp"
#include "flashbench/options.hpp"
#include "flashbench/timing.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
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
__global__ void hold_stream(const volatile int *release, unsigned long long timeout_ns,
                            int *timed_out) {
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

__global__ void spin_kernel(unsigned long long ns) {
  const unsigned long long start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
}

// The "read" flush: every thread streams 16-byte words of the buffer. The sum is stored only if it equals a value
// the buffer cannot produce (the buffer is all 0x01 bytes), so the loads stay and nothing is written.
__global__ void read_flush(const uint4 *buf, size_t n, unsigned *sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(buf + i);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0xdeadbeefu)
    *sink = acc;
}

// Under Nsight Compute (and other tools that serialise launches) a launch blocks the host until the kernel has run,
// so a stream held by the spinning kernel would stall every sample until the hold's timeout. Probe it once: hold the
// stream for at most 200 ms and see whether a following launch returns at once. FLASHBENCH_NO_STREAM_HOLD=1 forces
// the hold off (flashbench/options.hpp).
bool launches_are_asynchronous(cudaStream_t stream, int *device_flags, volatile int *host_flags) {
  if (env_options().no_stream_hold)
    return false;
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

void gpu_spin(cudaStream_t stream, double ns) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(ns > 0 ? ns : 0));
  FB_CHECK_LAUNCH();
}

struct Timer::Impl {
  DeviceInfo dev;
  cudaStream_t stream = nullptr;
  void *l2_buffer = nullptr;
  size_t l2_bytes = 0;
  int *host_flags = nullptr; // [0] release, [1] timed_out; pinned and mapped
  int *device_flags = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  // queue back_to_back: two sets of events, one for the batch the GPU runs and one for the batch queued behind it.
  static constexpr int kMaxBatch = 64;
  std::vector<cudaEvent_t>
      batch_events; // [set][start|stop][sample], created at the first back_to_back point
  ClockReader clocks;
  bool hold = true; // hold the stream while a sample is queued (off where launches are synchronous)

  explicit Impl(const DeviceInfo &d, cudaStream_t s) : dev(d), stream(s), clocks(d.pci_bus_id) {
    // Twice the L2 so that a flush evicts every line even with the L2's partitioned (near/far) halves.
    l2_bytes = static_cast<size_t>(std::max<int64_t>(d.l2_bytes, 1 << 20)) * 2;
    FB_CUDA_CHECK(cudaMalloc(&l2_buffer, l2_bytes + 256));
    FB_CUDA_CHECK(cudaMemset(l2_buffer, 1, l2_bytes));
    FB_CUDA_CHECK(cudaDeviceSynchronize());
    FB_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&host_flags), 2 * sizeof(int),
                                cudaHostAllocMapped));
    FB_CUDA_CHECK(
        cudaHostGetDevicePointer(reinterpret_cast<void **>(&device_flags), host_flags, 0));
    FB_CUDA_CHECK(cudaEventCreate(&start));
    FB_CUDA_CHECK(cudaEventCreate(&stop));
    hold = launches_are_asynchronous(stream, device_flags, host_flags);
  }
  cudaEvent_t batch_event(int set, int which, int i) {
    return batch_events[(set * 2 + which) * kMaxBatch + i];
  }
  ~Impl() {
    for (cudaEvent_t e : batch_events)
      cudaEventDestroy(e);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFreeHost(host_flags);
    cudaFree(l2_buffer);
  }
};

Timer::Timer(const DeviceInfo &dev, cudaStream_t stream)
    : impl_(std::make_unique<Impl>(dev, stream)) {}
Timer::~Timer() = default;

void Timer::flush_l2() { flush_l2(policy_flush_); }

void Timer::flush_l2(const std::string &how) {
  Impl &m = *impl_;
  if (how == "write") {
    FB_CUDA_CHECK(cudaMemsetAsync(m.l2_buffer, 1, m.l2_bytes, m.stream));
    return;
  }
  const int blocks = std::max(1, m.dev.sm_count) * 4;
  read_flush<<<blocks, 512, 0, m.stream>>>(
      static_cast<const uint4 *>(m.l2_buffer), m.l2_bytes / 16,
      reinterpret_cast<unsigned *>(static_cast<char *>(m.l2_buffer) + m.l2_bytes));
  FB_CHECK_LAUNCH();
}

double Timer::sample_us(const std::function<void(cudaStream_t)> &launch, bool cold) {
  Impl &m = *impl_;
  volatile int *flags = m.host_flags;
  flags[0] = 0;
  flags[1] = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const bool hold = m.hold;
  if (hold) {
    hold_stream<<<1, 1, 0, m.stream>>>(m.device_flags, 1'000'000'000ull, m.device_flags + 1);
    FB_CHECK_LAUNCH();
  }
  if (cold)
    flush_l2();
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

// queue back_to_back (timing.hpp): batches of k samples, each batch queued behind the one the GPU is running. The
// first batch, and the first after the pipeline broke, waits behind the stream hold until all of it is queued. A
// batch queued behind is void if the one ahead had already finished when the host was done queuing it: the GPU may
// then have reached one of its samples before its launch was queued. A host that falls behind twice in a row gets a
// hold before every batch (each batch then waits for the host, as one round trip per batch).
class BackToBack {
public:
  BackToBack(Timer &timer, Timer::Impl &m, const std::function<void(cudaStream_t)> &launch,
             bool cold, double period_us)
      : timer_(timer), m_(m), launch_(launch), cold_(cold) {
    k_next_ = period_us > 0 ? batch_size(period_us)
                            : 1; // no warm-up: the first batch measures the period
  }
  ~BackToBack() {
    cudaStreamSynchronize(m_.stream);
  } // the batch still queued behind the last one read
  SampleBatch next() {
    if (!ahead_) {
      enqueue(set_, true);
      ahead_ = true, ahead_void_ = false;
    }
    const bool pipelined = behind_voids_ < 2;
    if (pipelined)
      enqueue(1 - set_, false);
    const cudaError_t q = cudaEventQuery(m_.batch_event(set_, 1, k_[set_] - 1));
    if (q != cudaSuccess && q != cudaErrorNotReady)
      FB_CUDA_CHECK(q);
    const bool behind_void = pipelined && q == cudaSuccess;
    FB_CUDA_CHECK(cudaEventSynchronize(m_.batch_event(set_, 1, k_[set_] - 1)));
    SampleBatch b;
    b.is_void = ahead_void_;
    if (held_[set_] && m_.host_flags[1]) {
      // The hold gave up before the host released it: a launch blocked the host (a tool serialising launches).
      b.is_void = true;
      m_.hold = false;
    }
    for (int i = 0; i < k_[set_]; ++i) {
      float ms = 0;
      FB_CUDA_CHECK(
          cudaEventElapsedTime(&ms, m_.batch_event(set_, 0, i), m_.batch_event(set_, 1, i)));
      b.us.push_back(static_cast<double>(ms) * 1e3);
    }
    float span_ms = 0; // flush + sample, per sample: the next batch's size
    FB_CUDA_CHECK(cudaEventElapsedTime(&span_ms, m_.batch_event(set_, 0, 0),
                                       m_.batch_event(set_, 1, k_[set_] - 1)));
    k_next_ = batch_size(span_ms * 1e3 / k_[set_]);
    if (behind_void)
      ++behind_voids_;
    else if (pipelined)
      behind_voids_ =
          0; // once the host fell behind twice in a row, a hold before every batch for the rest
    if (pipelined) {
      set_ = 1 - set_;
      ahead_void_ = behind_void;
    } else {
      ahead_ = false;
    }
    return b;
  }
  bool hold_works() const { return m_.hold; }

private:
  static int batch_size(double period_us) {
    return std::clamp(static_cast<int>(10e3 / std::max(period_us, 1.0)), 1, Timer::Impl::kMaxBatch);
  }
  void enqueue(int set, bool hold) {
    volatile int *flags = m_.host_flags;
    held_[set] = hold && m_.hold;
    if (held_[set]) {
      flags[0] = 0;
      flags[1] = 0;
      std::atomic_thread_fence(std::memory_order_seq_cst);
      hold_stream<<<1, 1, 0, m_.stream>>>(m_.device_flags, 1'000'000'000ull, m_.device_flags + 1);
      FB_CHECK_LAUNCH();
    }
    k_[set] = k_next_;
    for (int i = 0; i < k_[set]; ++i) {
      if (cold_)
        timer_.flush_l2();
      FB_CUDA_CHECK(cudaEventRecord(m_.batch_event(set, 0, i), m_.stream));
      launch_(m_.stream);
      FB_CUDA_CHECK(cudaEventRecord(m_.batch_event(set, 1, i), m_.stream));
    }
    if (held_[set]) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      flags[0] = 1;
    }
  }
  Timer &timer_;
  Timer::Impl &m_;
  const std::function<void(cudaStream_t)> &launch_;
  bool cold_;
  int set_ = 0, k_[2] = {1, 1}, k_next_ = 1, behind_voids_ = 0;
  bool ahead_ = false, ahead_void_ = false, held_[2] = {false, false};
};

TimingStats Timer::measure(const std::function<void(cudaStream_t)> &launch,
                           const TimingPolicy &policy) {
  Impl &m = *impl_;
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
  double period_us = 0; // flush + sample, from the warm-up (back_to_back's first batch size)
  {
    ScopedRange r{"warmup"};
    FB_CUDA_CHECK(cudaEventRecord(m.start, m.stream));
    for (int i = 0; i < policy.warmup_runs; ++i) {
      if (policy.cold)
        flush_l2();
      launch(m.stream);
    }
    FB_CUDA_CHECK(cudaEventRecord(m.stop, m.stream));
    FB_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    float ms = 0;
    FB_CUDA_CHECK(cudaEventElapsedTime(&ms, m.start, m.stop));
    if (policy.warmup_runs > 0)
      period_us = ms * 1e3 / policy.warmup_runs;
  }
  ScopedRange r{"time"};
  // Without the hold (synchronous launches) nothing can be queued ahead: one sample per round trip.
  const bool back_to_back = policy.queue == "back_to_back" && m.hold;
  if (back_to_back && m.batch_events.empty()) {
    m.batch_events.resize(4 * Impl::kMaxBatch);
    for (cudaEvent_t &e : m.batch_events)
      FB_CUDA_CHECK(cudaEventCreate(&e));
  }
  std::unique_ptr<BackToBack> queue;
  if (back_to_back)
    queue = std::make_unique<BackToBack>(*this, m, launch, policy.cold, period_us);
  auto next = [&]() -> SampleBatch {
    if (queue && queue->hold_works())
      return queue->next();
    const double us = sample_us(launch, policy.cold);
    return us < 0 ? SampleBatch{{}, true} : SampleBatch{{us}, false};
  };
  const long long energy0 = m.clocks.available() ? m.clocks.energy_mj() : -1;
  std::function<int()> clock;
  if (m.clocks.available())
    clock = [&] { return m.clocks.sm_clock_mhz(); };
  TimingStats t = sample_loop(next, clock, m.dev.sm_clock_max_mhz, policy, now_s);
  const long long energy1 = energy0 >= 0 ? m.clocks.energy_mj() : -1;
  queue.reset(); // drains the batch queued behind the last one read
  // NVML's energy counter moves in steps of tens of ms (an H200 read 0 to 1000 W over 60-ms loops): shorter
  // loops get no power figure rather than a wrong one.
  if (energy0 >= 0 && energy1 >= energy0 && t.wall_s >= 0.5)
    t.power_w = (energy1 - energy0) * 1e-3 / t.wall_s;
  t.settle_wait_s = settle_wait;
  t.slowdown_at_start = slowdown;
  return t;
}

} // namespace fb
