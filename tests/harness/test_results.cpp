#include "flashbench/errors.hpp"
#include "flashbench/results.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

using namespace fb;

namespace {
Result sample_ok() {
  Result r;
  r.variant = "fa1_kv_outer";
  r.config.set("block_m", 32);
  r.config_json = {{"block_m", 32}};
  r.config_str = "block_m=32";
  r.problem.batch = 2;
  r.problem.heads_q = 4;
  r.problem.heads_kv = 2;
  r.problem.seqlen_q = 77;
  r.problem.seqlen_kv = 131;
  r.problem.causal = true;
  r.status = Status::ok;
  r.flops = flops(r.problem);
  r.bytes_min = min_bytes(r.problem);
  r.bytes_model = 3 * r.bytes_min;
  r.seed = 12345;
  r.timing = summarize({10.0, 11.0, 12.0, 10.5, 11.5});
  r.timing->busy_fraction = 0.93;
  r.timing->power_w = 612.5;
  r.timing->void_batches = 2;
  VerifyResult v;
  v.pass = true;
  v.max_abs_error = 1e-3;
  v.rel_l2_error = 2e-4;
  v.reference = "cpu_f64";
  r.verification = v;
  return r;
}
} // namespace

TEST(Results, RecordCarriesGoogleBenchmarkAndFlashbenchFields) {
  const nlohmann::json j = to_json(sample_ok());
  for (const char *f : {"name", "run_name", "run_type", "iterations", "real_time", "cpu_time",
                        "time_unit", "variant", "config", "problem", "status", "reason", "tflops",
                        "median_us", "cv", "max_error", "samples_us"})
    EXPECT_TRUE(j.contains(f)) << f;
  EXPECT_EQ(j["status"], "ok");
  EXPECT_DOUBLE_EQ(j["real_time"].get<double>(), 11.0);
  EXPECT_EQ(j["time_unit"], "us");
  EXPECT_NEAR(j["tflops"].get<double>(), sample_ok().flops / 11e-6 / 1e12, 1e-9);
}

TEST(Results, StoredSamplesAreThinnedAndKeptToTheNanosecond) {
  Result r = sample_ok();
  std::vector<double> s;
  for (int i = 0; i < 3000; ++i)
    s.push_back(10.0 + i * 1e-4 + 1.23456e-5);
  r.timing = summarize(s);
  const nlohmann::json j = to_json(r);
  const auto kept = j["samples_us"].get<std::vector<double>>();
  ASSERT_EQ(kept.size(), 1000u);
  EXPECT_EQ(j["samples"], 3000);
  EXPECT_DOUBLE_EQ(kept[1], std::round(s[3] * 1e3) / 1e3);
  for (double x : kept)
    EXPECT_DOUBLE_EQ(x, std::round(x * 1e3) / 1e3);
  EXPECT_DOUBLE_EQ(j["median_us"].get<double>(), r.timing->median_us); // from the unrounded samples
  r.timing = summarize({10.0004, 11.0006});
  EXPECT_EQ(to_json(r)["samples_us"], nlohmann::json::array({10.0, 11.001}));
}

TEST(Results, NotTimedPointsUseErrorConventionAndNullTimes) {
  Result r = sample_ok();
  r.status = Status::incorrect;
  r.reason = "max error 0.5";
  r.timing.reset();
  const nlohmann::json j = to_json(r);
  EXPECT_TRUE(j["error_occurred"].get<bool>());
  EXPECT_TRUE(j["tflops"].is_null());
  EXPECT_TRUE(j["median_us"].is_null());
  EXPECT_EQ(j["real_time"].get<double>(), 0.0);
}

TEST(Results, FileRoundTripIsAtomicAndVersioned) {
  const auto dir = std::filesystem::temp_directory_path() / "fb_results_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "r.json").string();
  Result skipped = sample_ok();
  skipped.status = Status::skipped;
  skipped.reason = "head_dim 72 unsupported";
  skipped.timing.reset();
  write_results_file(path, {{"device", {{"name", "test"}}}}, {sample_ok(), skipped});
  for (const auto &e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), "r.json") << "temporary file left behind";
  const nlohmann::json doc = read_results_file(path);
  ASSERT_EQ(doc["benchmarks"].size(), 2u);
  const Result back = result_from_json(doc["benchmarks"][0]);
  EXPECT_EQ(back.problem, sample_ok().problem);
  EXPECT_EQ(back.status, Status::ok);
  EXPECT_DOUBLE_EQ(back.timing->median_us, 11.0);
  EXPECT_DOUBLE_EQ(back.timing->busy_fraction,
                   0.93); // the timed loop's load travels with the point
  EXPECT_DOUBLE_EQ(back.timing->power_w, 612.5);
  EXPECT_EQ(back.timing->void_batches, 2);
  EXPECT_EQ(back.config.get("block_m"), 32);
  EXPECT_EQ(result_from_json(doc["benchmarks"][1]).reason, "head_dim 72 unsupported");

  std::ofstream(path) << R"({"context": {"schema_version": 99}, "benchmarks": []})";
  EXPECT_THROW(read_results_file(path), UserError);
  std::ofstream(path) << "{not json";
  EXPECT_THROW(read_results_file(path), UserError);
  std::filesystem::remove_all(dir);
}
