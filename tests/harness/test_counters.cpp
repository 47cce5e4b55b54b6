// Counters and occupancy host logic. CUPTI itself needs a GPU; here the failure path is exercised at the boundary:
// a session that cannot read counters (no device, or a simulated CUPTI error) must degrade to null metrics with a
// reason, never throw, and the results record must stay complete.
#include "flashbench/counters.hpp"
#include "flashbench/options.hpp"
#include "flashbench/results.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

using namespace fb;

TEST(Occupancy, LimiterFromResources) {
  const DeviceInfo h100 = nominal_device();
  // 256 threads, 128 registers, 91 KB shared: registers allow 2 blocks, shared memory 2, warps 8.
  Occupancy o = occupancy_from_resources(h100, 256, 128, 91 * 1024);
  EXPECT_EQ(o.blocks_per_sm, 2);
  EXPECT_EQ(o.limiter, "shared_memory");
  EXPECT_DOUBLE_EQ(o.theoretical_pct, 25.0);
  EXPECT_EQ(o.blocks_by_limit["registers"], 2);
  EXPECT_EQ(o.blocks_by_limit["warps"], 8);
  // Few registers, no shared memory, small blocks: the block-count limit binds.
  o = occupancy_from_resources(h100, 32, 16, 0);
  EXPECT_EQ(o.limiter, "blocks");
  EXPECT_EQ(o.blocks_per_sm, 32);
  EXPECT_DOUBLE_EQ(o.theoretical_pct, 50.0);
  // 255 registers round up to 256 per thread: 1 block of 256 threads.
  o = occupancy_from_resources(h100, 256, 255, 0);
  EXPECT_EQ(o.limiter, "registers");
  EXPECT_EQ(o.blocks_per_sm, 1);
}

TEST(Counters, UnavailableSessionDegradesWithAReason) {
  setenv("FLASHBENCH_SIMULATE_CUPTI_FAILURE", "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES", 1);
  reload_env_options();
  CounterSession s(nominal_device(), default_metrics());
  unsetenv("FLASHBENCH_SIMULATE_CUPTI_FAILURE");
  reload_env_options();
  EXPECT_FALSE(s.available());
  EXPECT_NE(s.reason().find("INSUFFICIENT_PRIVILEGES"), std::string::npos);
  bool launched = false;
  const Counters c = s.profile(
      "p", [&](cudaStream_t) { launched = true; }, [] {}, nullptr);
  EXPECT_FALSE(c.available);
  EXPECT_FALSE(launched) << "an unavailable session must not launch anything";
  EXPECT_EQ(c.reason, s.reason());

  Result r;
  r.variant = "naive";
  r.status = Status::ok;
  r.timing = summarize({1.0, 2.0, 3.0});
  r.counters = c;
  const nlohmann::json j = to_json(r);
  EXPECT_TRUE(j["counters"].is_null());
  EXPECT_NE(j["counters_reason"].get<std::string>().find("INSUFFICIENT_PRIVILEGES"),
            std::string::npos);
  EXPECT_EQ(j["status"], "ok") << "timings stay when counters are missing";
  EXPECT_DOUBLE_EQ(j["median_us"].get<double>(), 2.0);
}

TEST(Counters, NoDeviceIsAReasonNotAnError) {
  DeviceInfo none;
  CounterSession s(none, default_metrics());
  EXPECT_FALSE(s.available());
  EXPECT_FALSE(s.reason().empty());
}

TEST(Counters, SummaryNamesTheReportFields) {
  Counters c;
  c.available = true;
  c.values = {{"dram__bytes_read.sum", 1e9},
              {"dram__bytes_write.sum", 2e8},
              {"sm__warps_active.avg.pct_of_peak_sustained_active", 40.0}};
  const nlohmann::json s = summarize_counters(c);
  EXPECT_DOUBLE_EQ(s["dram_bytes"].get<double>(), 1.2e9);
  EXPECT_DOUBLE_EQ(s["achieved_occupancy_pct"].get<double>(), 40.0);
  EXPECT_FALSE(s.contains("tensor_active_pct"));
}
