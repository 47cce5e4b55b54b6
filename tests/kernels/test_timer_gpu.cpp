// The GPU half of the timer (harness/src/timer.cu): the two loads of timing.queue on a launch of known cost, a
// device memset of 256 MB (~85 us on an H100, no L2 flush between samples).
#include "gpu_test_util.hpp"

#include "flashbench/timing.hpp"

using namespace fb;

namespace {

TimingPolicy quick(const char *queue) {
  TimingPolicy p;
  p.cold = false; // the flush would be idle time between samples in both loads
  p.min_samples = 20;
  p.min_time_s = 0.2;
  p.max_noise = 0.02;
  p.timeout_s = 5;
  p.settle_s = 0;
  p.queue = queue;
  return p;
}

} // namespace

// back_to_back keeps the GPU busy but for the events between samples, and its samples are the launch's own time
// (no host latency inside them): the same median as one sample per round trip, which leaves the GPU idle while the
// host syncs, reads the clock and queues the next.
TEST(TimerGpu, BackToBackQueuesWithoutIdleOrLaunchLatency) {
  FB_SKIP_WITHOUT_GPU();
  const DeviceInfo dev = query_device(0);
  cudaStream_t stream = nullptr;
  FB_CUDA_CHECK(cudaStreamCreate(&stream));
  {
    DeviceBuffer buf(size_t(256) << 20);
    Timer timer(dev, stream);
    auto launch = [&](cudaStream_t s) {
      FB_CUDA_CHECK(cudaMemsetAsync(buf.get(), 1, buf.bytes(), s));
    };
    const TimingStats rt = timer.measure(launch, quick("round_trip"));
    const TimingStats bb = timer.measure(launch, quick("back_to_back"));
    EXPECT_EQ(bb.void_batches, 0);
    EXPECT_GT(bb.busy_fraction, 0.9) << "round_trip " << rt.busy_fraction;
    EXPECT_GT(bb.busy_fraction, rt.busy_fraction);
    EXPECT_NEAR(bb.median_us / rt.median_us, 1.0, 0.05)
        << bb.median_us << " us against " << rt.median_us;
    EXPECT_GE(bb.samples_us.size(), 20u);
  }
  FB_CUDA_CHECK(cudaStreamDestroy(stream));
}
