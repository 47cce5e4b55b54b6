#include "flashbench/timing.hpp"

#include <gtest/gtest.h>

#include <random>

using namespace fb;

TEST(Stopping, QuietSamplesStopOnNoiseAfterMinimums) {
  TimingPolicy p;
  p.min_samples = 10;
  p.min_time_s = 0.001; // 1 ms of GPU time = 10 samples of 100 us
  StoppingRule rule(p);
  int n = 0;
  while (!rule.add(100.0 + (n % 2) * 0.1, 0.01 * n)) ++n;
  EXPECT_EQ(rule.reason(), "noise");
  EXPECT_GE(rule.samples().size(), 10u);
}

TEST(Stopping, MinTimeIsRespected) {
  TimingPolicy p;
  p.min_samples = 10;
  p.min_time_s = 0.5;
  StoppingRule rule(p);
  int n = 0;
  while (!rule.add(1000.0, 0.001 * n)) ++n; // 1 ms samples: needs 500 of them
  EXPECT_EQ(rule.samples().size(), 500u);
}

TEST(Stopping, NoisySamplesStopAtTimeout) {
  TimingPolicy p;
  p.timeout_s = 1.0;
  StoppingRule rule(p);
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> u(50, 150);
  double wall = 0;
  while (!rule.add(u(rng), wall)) wall += 0.01;
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
