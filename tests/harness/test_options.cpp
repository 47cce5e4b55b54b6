// The documented environment options (flashbench/options.hpp) and the machine identity
// (flashbench/machine.hpp): parsed once, refused with a clear line when malformed, written into the
// results context.
#include "flashbench/device.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/machine.hpp"
#include "flashbench/options.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

namespace fs = std::filesystem;
using namespace fb;

namespace {

EnvOptions parse(const std::map<std::string, std::string> &env) {
  return parse_env_options([&](const char *n) -> const char * {
    const auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

} // namespace

TEST(Options, UnsetMeansDefaults) {
  const EnvOptions o = parse({});
  EXPECT_TRUE(o.tuning_dir.empty());
  EXPECT_FALSE(o.no_stream_hold);
  EXPECT_FALSE(o.test_variants);
  EXPECT_EQ(o.slowdown_for("fa2_q_outer"), 0.0);
  EXPECT_EQ(timing_options_key(o), "");
  const nlohmann::json j = o;
  for (const char *k : {"FLASHBENCH_TUNING_DIR", "FLASHBENCH_CACHE_DIR", "FLASHBENCH_TEST_SLOWDOWN",
                        "FLASHBENCH_NO_STREAM_HOLD", "FLASHBENCH_SIMULATE_CUPTI_FAILURE",
                        "FLASHBENCH_TEST_VARIANTS"})
    EXPECT_TRUE(j.contains(k)) << k; // every option is listed, set or not
  EXPECT_TRUE(j["FLASHBENCH_TEST_SLOWDOWN"].is_null());
}

TEST(Options, SlowdownTakesAFraction) {
  const EnvOptions o = parse({{"FLASHBENCH_TEST_SLOWDOWN", "fa2_q_outer:0.03"}});
  EXPECT_DOUBLE_EQ(o.slowdown_for("fa2_q_outer"), 0.03);
  EXPECT_EQ(o.slowdown_for("fa3_pipelined"), 0.0);
  const nlohmann::json j = o;
  EXPECT_EQ(j["FLASHBENCH_TEST_SLOWDOWN"]["variant"], "fa2_q_outer");
  EXPECT_DOUBLE_EQ(j["FLASHBENCH_TEST_SLOWDOWN"]["fraction"].get<double>(), 0.03);
  // it changes what a sample measures, so it keys the tune cache
  EXPECT_NE(timing_options_key(o).find("slowdown=fa2_q_outer:0.03"), std::string::npos);
  EXPECT_NE(timing_options_key(parse({{"FLASHBENCH_NO_STREAM_HOLD", "1"}})), "");
  // where only files move, the timings do not change: no key
  EXPECT_EQ(timing_options_key(
                parse({{"FLASHBENCH_CACHE_DIR", "/tmp/x"}, {"FLASHBENCH_TUNING_DIR", "/tmp/y"}})),
            "");
}

TEST(Options, MalformedValuesAreUserErrors) {
  for (const char *bad : {"fa2_q_outer", "fa2_q_outer:", ":0.03", "fa2_q_outer:2", "fa2_q_outer:0",
                          "fa2_q_outer:-0.1", "fa2_q_outer:3%", "fa2_q_outer:nan"}) {
    try {
      parse({{"FLASHBENCH_TEST_SLOWDOWN", bad}});
      ADD_FAILURE() << bad << " accepted";
    } catch (const UserError &e) {
      EXPECT_NE(std::string(e.what()).find("FLASHBENCH_TEST_SLOWDOWN="), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("fa2_q_outer:0.03"), std::string::npos)
          << e.what(); // what to do
    }
  }
  EXPECT_THROW(parse({{"FLASHBENCH_NO_STREAM_HOLD", "yes"}}), UserError);
  EXPECT_THROW(parse({{"FLASHBENCH_TEST_VARIANTS", "2"}}), UserError);
  EXPECT_FALSE(parse({{"FLASHBENCH_NO_STREAM_HOLD", "0"}}).no_stream_hold);
}

TEST(Options, SlowdownSpinCountsTheSpinsOwnOverhead) {
  EXPECT_DOUBLE_EQ(slowdown_spin_ns(1000.0, 0.0, 0.03), 30'000.0); // 3% of 1 ms
  EXPECT_DOUBLE_EQ(slowdown_spin_ns(1000.0, 2.0, 0.03),
                   28'000.0);                               // the launch gap is part of the 30 us
  EXPECT_DOUBLE_EQ(slowdown_spin_ns(50.0, 2.0, 0.03), 0.0); // the gap alone already exceeds 3%
}

TEST(Machine, HostIdFromMachineIdElseBootId) {
  const fs::path root = fs::temp_directory_path() / ("fb_machine_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "etc");
  fs::create_directories(root / "proc/sys/kernel/random");
  std::string src;
  EXPECT_EQ(read_host_id(root.string(), &src), "");
  EXPECT_EQ(src, "");
  std::ofstream(root / "proc/sys/kernel/random/boot_id") << "b0075e1d-0000\n";
  EXPECT_EQ(read_host_id(root.string(), &src), "b0075e1d-0000");
  EXPECT_EQ(src, "boot-id");
  std::ofstream(root / "etc/machine-id") << "0123456789abcdef\n";
  EXPECT_EQ(read_host_id(root.string() + "/", &src), "0123456789abcdef");
  EXPECT_EQ(src, "machine-id");
  fs::remove_all(root);
}

TEST(Machine, JsonNullsWhatIsUnknown) {
  MachineIdentity m = query_machine(nominal_device()); // no GPU: host facts only
  EXPECT_EQ(m.source, "none");
  EXPECT_FALSE(m.host_name.empty());
  const nlohmann::json j = m;
  for (const char *k : {"host_id", "gpu_uuid", "gpu_serial", "pci_bus_id", "driver", "vbios",
                        "power_limit_w", "ecc", "start", "end"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_TRUE(j["gpu_uuid"].is_null());
  EXPECT_TRUE(j["end"]["temperature_c"].is_null());
  EXPECT_EQ(j["reason"], "no GPU");
}

TEST(Options, RunRecordsOptionsAndMachineAndRefusesMalformedOnes) {
  const fs::path d = fs::temp_directory_path() / ("fb_opts_" + std::to_string(::getpid()));
  fs::create_directories(d);
  const std::string spec = std::string(FLASHBENCH_SOURCE_DIR) + "/sweeps/ci/nightly-smoke.yaml";
  const std::string out = (d / "r.json").string();
  const std::string run =
      std::string(FLASHBENCH_BIN) + " run " + spec + " --fake-worker --fake-delay-ms 1 -o ";
  ASSERT_EQ(std::system(
                ("FLASHBENCH_TEST_SLOWDOWN=naive:0.03 " + run + out + " >/dev/null 2>&1").c_str()),
            0);
  std::ifstream is(out);
  const nlohmann::json ctx = nlohmann::json::parse(is)["context"];
  EXPECT_EQ(ctx["options"]["FLASHBENCH_TEST_SLOWDOWN"]["variant"], "naive");
  EXPECT_TRUE(ctx["machine"].contains("host_id"));
  EXPECT_TRUE(ctx["machine"].contains("end"));
  const std::string bad = (d / "bad.json").string(), err = (d / "err.txt").string();
  const int st = std::system(
      ("FLASHBENCH_TEST_SLOWDOWN=naive:3% " + run + bad + " >/dev/null 2>" + err).c_str());
  EXPECT_EQ(WEXITSTATUS(st), 2);
  std::ifstream e(err);
  const std::string msg((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 1) << msg;
  EXPECT_NE(msg.find("FLASHBENCH_TEST_SLOWDOWN=naive:3%"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(bad));
  fs::remove_all(d);
}
