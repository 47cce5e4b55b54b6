// The L2 physics the traffic models share (kernels/common/traffic.hpp), on small made-up schedules.
#include "kernels/common/traffic.hpp"

#include <gtest/gtest.h>

using namespace fb::kernels::traffic;

namespace {

// `groups` groups of `per_group` consecutive units each, every unit reading `bytes` of its group's K/V; the whole
// sequence `rounds` times over (a rank-major order: every group once per round).
KvDram cyclic(int64_t groups, int64_t per_group, int64_t rounds, double bytes, int64_t resident,
              double usable) {
  const int64_t per_round = groups * per_group;
  return kv_dram(
      per_round * rounds,
      [&](int64_t u) {
        return KvRead{(u % per_round) / per_group, bytes};
      },
      resident, usable);
}

TEST(Traffic, UnitsOfOneWaveReadTheirGroupOnce) {
  const KvDram kv = cyclic(4, 8, 1, 1e6, 32, 0.0); // one wave, no L2 to keep anything across waves
  EXPECT_DOUBLE_EQ(kv.bytes, 4e6);
  EXPECT_DOUBLE_EQ(kv.once, 4e6);
  EXPECT_DOUBLE_EQ(kv.max_wave_set, 4e6);
  EXPECT_DOUBLE_EQ(kv.ratio(), 1.0);
}

TEST(Traffic, AGroupComingBackIsReadAgainOnlyWhenTheWavesBetweenOverflowTheUsableL2) {
  // 8 groups of 1 MB, one unit each per round, 4 rounds, 4 units a wave: each wave streams 4 MB.
  EXPECT_DOUBLE_EQ(cyclic(8, 1, 4, 1e6, 4, 8e6).bytes, 8e6);  // two waves (8 MB) fit: once
  EXPECT_DOUBLE_EQ(cyclic(8, 1, 4, 1e6, 4, 7e6).bytes, 32e6); // they do not: every round again
  EXPECT_DOUBLE_EQ(cyclic(8, 1, 4, 1e6, 4, 7e6).ratio(), 4.0);
  // No device (usable 0): every wave reads its groups, the no-reuse bound.
  EXPECT_DOUBLE_EQ(cyclic(8, 1, 4, 1e6, 1, 0.0).bytes, 32e6);
}

TEST(Traffic, ALongerReadOfACachedGroupFetchesOnlyTheRest) {
  // Causal: one group, units reading 1, 2, 3, 4 MB prefixes, one a wave; the L2 keeps what was read.
  const KvDram kv = kv_dram(
      4,
      [](int64_t u) {
        return KvRead{0, 1e6 * double(u + 1)};
      },
      1, 100e6);
  EXPECT_DOUBLE_EQ(kv.bytes, 4e6);
  EXPECT_DOUBLE_EQ(kv.once, 4e6);
}

TEST(Traffic, WritesStayInL2InProportionAndAllOfThemWhenEverythingFits) {
  EXPECT_DOUBLE_EQ(in_l2_at_end(10e6, 5e6, 20e6), 5e6);  // 15 MB moved fits 20 MB: all still dirty
  EXPECT_DOUBLE_EQ(in_l2_at_end(75e6, 25e6, 20e6), 5e6); // a quarter of the last 20 MB
  EXPECT_DOUBLE_EQ(in_l2_at_end(75e6, 25e6, 0.0), 0.0);  // no device
  EXPECT_DOUBLE_EQ(in_l2_at_end(75e6, 0.0, 20e6), 0.0);  // nothing written
  const fb::TrafficModel m = settle(75e6, 25e6, 20e6, "regime");
  EXPECT_DOUBLE_EQ(m.bytes, 95e6);
  EXPECT_NE(m.reason.find("regime; 5.0 MB of the writes still in L2"), std::string::npos)
      << m.reason;
  EXPECT_FALSE(m.has_range());
  EXPECT_NE(settle(10e6, 5e6, 20e6, "r").reason.find("all 15.0 MB moved fits the usable L2"),
            std::string::npos);
}

TEST(Traffic, CyclicMissOfRandomReplacement) {
  EXPECT_EQ(cyclic_miss(0.5), 0.0);
  EXPECT_EQ(cyclic_miss(1.0), 0.0);
  EXPECT_NEAR(cyclic_miss(2.0), 0.797, 1e-3); // 1 - u = exp(-2u)
  EXPECT_NEAR(cyclic_miss(4.0), 0.980, 1e-3);
  double last = 0;
  for (double x = 1.05; x < 8; x += 0.25) {
    const double u = cyclic_miss(x);
    EXPECT_NEAR(1.0 - u, std::exp(-x * u), 1e-9) << x;
    EXPECT_GT(u, last) << x;
    last = u;
  }
}

TEST(Traffic, UsableL2IsHalfTheL2) {
  fb::DeviceInfo dev;
  EXPECT_EQ(usable_l2(dev), 0.0);
  dev.l2_bytes = 50 << 20;
  EXPECT_DOUBLE_EQ(usable_l2(dev), 25.0 * (1 << 20));
}

} // namespace
