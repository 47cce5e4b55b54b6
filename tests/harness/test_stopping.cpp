#include "flashbench/timing.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <stdexcept>

using namespace fb;

TEST(Stopping, QuietSamplesStopOnNoiseAfterMinimums) {
  TimingPolicy p;
  p.min_samples = 10;
  p.min_time_s = 0.001; // 1 ms of GPU time = 10 samples of 100 us
  StoppingRule rule(p);
  int n = 0;
  while (!rule.add(100.0 + (n % 2) * 0.1, 0.01 * n))
    ++n;
  EXPECT_EQ(rule.reason(), "noise");
  EXPECT_GE(rule.samples().size(), 10u);
}

TEST(Stopping, MinTimeIsRespected) {
  TimingPolicy p;
  p.min_samples = 10;
  p.min_time_s = 0.5;
  StoppingRule rule(p);
  int n = 0;
  while (!rule.add(1000.0, 0.001 * n))
    ++n; // 1 ms samples: needs 500 of them
  EXPECT_EQ(rule.samples().size(), 500u);
}

TEST(Stopping, NoisySamplesStopAtTimeout) {
  TimingPolicy p;
  p.timeout_s = 1.0;
  StoppingRule rule(p);
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> u(50, 150);
  double wall = 0;
  while (!rule.add(u(rng), wall))
    wall += 0.01;
  EXPECT_EQ(rule.reason(), "timeout");
  EXPECT_GT(rule.relative_stddev(), p.max_noise);
}

TEST(Stopping, SummaryStatistics) {
  const TimingStats t = summarize({4, 1, 3, 2});
  EXPECT_DOUBLE_EQ(t.median_us, 2.5);
  EXPECT_DOUBLE_EQ(t.min_us, 1);
  EXPECT_DOUBLE_EQ(t.max_us, 4);
  EXPECT_DOUBLE_EQ(t.mean_us, 2.5);
  EXPECT_NEAR(t.cv, 1.2909944 / 2.5, 1e-6);
}

// The timed loop's bookkeeping (sample_loop), as Timer::measure runs it, with batches and a clock made up here.
namespace {
struct FakeWall {
  double t = 0;
  double operator()() const { return t; }
};
// Stops on noise once it has `min_samples`, whatever their GPU time.
TimingPolicy after_samples(int min_samples) {
  TimingPolicy p;
  p.min_samples = min_samples;
  p.min_time_s = 0;
  return p;
}
} // namespace

TEST(SampleLoop, KeepsBatchesAndCountsTheLoad) {
  const TimingPolicy p = after_samples(6);
  FakeWall wall;
  auto next = [&] {
    wall.t += 0.004; // 3 x 1 ms of GPU time in 4 ms of wall time
    return SampleBatch{{1000.0, 1000.0, 1000.0}, false};
  };
  const TimingStats t = sample_loop(
      next, [] { return 1980; }, 1980, p, std::ref(wall));
  EXPECT_EQ(t.samples_us.size(), 6u);
  EXPECT_EQ(t.stop_reason, "noise");
  EXPECT_NEAR(t.busy_fraction, 0.75, 1e-9);
  EXPECT_DOUBLE_EQ(t.sm_clock_mhz, 1980);
  EXPECT_EQ(t.void_batches, 0);
}

TEST(SampleLoop, VoidBatchesAreLoadButNotSamples) {
  const TimingPolicy p = after_samples(4);
  FakeWall wall;
  int n = 0;
  auto next = [&] {
    wall.t += 0.001;
    const bool is_void = n++ % 2 == 0; // every other batch: the GPU caught up with the host
    return SampleBatch{{is_void ? 900.0 : 100.0, is_void ? 900.0 : 100.0}, is_void};
  };
  const TimingStats t = sample_loop(next, nullptr, 0, p, std::ref(wall));
  ASSERT_EQ(t.samples_us.size(), 4u);
  for (double us : t.samples_us)
    EXPECT_EQ(us, 100.0) << "a void batch's samples were kept";
  EXPECT_EQ(t.void_batches, 2);
  EXPECT_NEAR(t.busy_fraction, (4 * 900.0 + 4 * 100.0) * 1e-6 / 0.004, 1e-9);
  EXPECT_EQ(t.sm_clock_mhz, 0) << "no clock, no median clock";
}

TEST(SampleLoop, ThrottledBatchesAreDropped) {
  const TimingPolicy p = after_samples(2);
  FakeWall wall;
  int calls = 0;
  auto clock = [&] {
    return calls <= 2 ? 900 : 1980;
  }; // the first two batches under 75% of 1980 MHz
  auto next = [&] {
    ++calls;
    wall.t += 0.001;
    return SampleBatch{{calls <= 2 ? 500.0 : 100.0}, false};
  };
  const TimingStats t = sample_loop(next, clock, 1980, p, std::ref(wall));
  EXPECT_EQ(t.dropped_throttled, 2);
  ASSERT_EQ(t.samples_us.size(), 2u);
  EXPECT_EQ(t.samples_us[0], 100.0);
}

TEST(SampleLoop, NothingButVoidBatchesIsAnError) {
  TimingPolicy p;
  p.timeout_s = 0.05;
  FakeWall wall;
  auto next = [&] {
    wall.t += 0.01;
    return SampleBatch{{}, true};
  };
  EXPECT_THROW(sample_loop(next, nullptr, 0, p, std::ref(wall)), std::runtime_error);
}
