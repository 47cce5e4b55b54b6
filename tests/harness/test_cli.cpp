// CLI error paths: bad input gets one line on stderr, exit code 2 and no output file.
#include "flashbench/device.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace {

struct Outcome {
  int code = -1;
  std::string out, err;
};

Outcome run_cli(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / "fb_cli_test";
  fs::create_directories(dir);
  // Unique names: CTest runs these tests in parallel.
  static int counter = 0;
  const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const std::string out = (dir / ("stdout_" + tag)).string(), err = (dir / ("stderr_" + tag)).string();
  const std::string cmd = std::string(FLASHBENCH_BIN) + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  Outcome o;
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream a(out), b(err);
  std::stringstream sa, sb;
  sa << a.rdbuf();
  sb << b.rdbuf();
  o.out = sa.str();
  o.err = sb.str();
  return o;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / "fb_cli_test" / (std::to_string(::getpid()) + "_" + name);
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
  return p.string();
}

void expect_user_error(const std::string& args, const std::string& needle) {
  const std::string result =
      (fs::temp_directory_path() / "fb_cli_test" / ("never_" + std::to_string(::getpid()) + ".json")).string();
  fs::remove(result);
  const Outcome o = run_cli(args + " -o " + result);
  EXPECT_EQ(o.code, 2) << args << "\nstderr: " << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << "not one line: " << o.err;
  EXPECT_NE(o.err.find(needle), std::string::npos) << o.err;
  EXPECT_FALSE(fs::exists(result)) << "output file left behind for: " << args;
  EXPECT_FALSE(fs::exists(result + ".partial.jsonl"));
}

const char* kGood = "problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64}\nvariants: [naive]\n";

} // namespace

TEST(Cli, MalformedYamlNamesFileAndLine) {
  const std::string spec = write_temp("bad.yaml", "problems:\n  - {batch: 1, heads: 2\nvariants: [naive]\n");
  expect_user_error("run " + spec, spec + ":3:");
}

TEST(Cli, UnknownVariantAndParameter) {
  expect_user_error("run " + write_temp("v.yaml", "problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\n"
                                                  "variants: [nope]\n"),
                    "unknown variant 'nope'");
  expect_user_error("run --variant fa1_kv_outer --shape batch=1,heads=2,seqlen=64,head_dim=64 --config tile=3",
                    "unknown config parameter 'tile'");
  expect_user_error("run --variant nope --shape batch=1,heads=2,seqlen=64,head_dim=64", "unknown variant 'nope'");
  expect_user_error("run " + write_temp("f.yaml", "problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64, "
                                                  "wings: 2}\nvariants: [naive]\n"),
                    "unknown problem field 'wings'");
}

TEST(Cli, ImpossibleValues) {
  expect_user_error("run --variant naive --shape batch=1,heads=2,seqlen=0,head_dim=64", "seqlen_q = 0 is impossible");
  expect_user_error("run --variant naive --shape batch=1,heads_q=6,heads_kv=4,seqlen=8,head_dim=64",
                    "not a multiple of heads_kv");
  expect_user_error("run --frobnicate", "flashbench: error:");
  expect_user_error("run /nonexistent/spec.yaml", "cannot open sweep spec");
  // Sizes are checked before any device is looked for.
  expect_user_error("probe --read-floor 12x", "--read-floor: '12x' is not a size");
  expect_user_error("probe --read-floor 32M,-5", "--read-floor: '-5' is not a size");
}

TEST(Cli, ListAndDryRunNeedNoGpu) {
  Outcome o = run_cli("list");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("naive"), std::string::npos);
  EXPECT_NE(o.out.find("fa1_kv_outer"), std::string::npos);
  o = run_cli("run --dry-run " + std::string(FLASHBENCH_SOURCE_DIR) + "/sweeps/quick.yaml");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("points"), std::string::npos);
  o = run_cli("plan " + write_temp("good.yaml", kGood));
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("\"problems\""), std::string::npos);
}

TEST(Cli, RunWithoutDeviceSaysSoAndShowsThePlan) {
  if (fb::device_count() > 0) GTEST_SKIP() << "a CUDA device is present; this test covers machines without one";
  const std::string result = (fs::temp_directory_path() / "fb_cli_test" / "none.json").string();
  const Outcome o = run_cli("run " + write_temp("good.yaml", kGood) + " -o " + result);
  EXPECT_EQ(o.code, 3);
  EXPECT_NE(o.err.find("no CUDA device"), std::string::npos) << o.err;
  EXPECT_NE(o.out.find("points"), std::string::npos);
  EXPECT_FALSE(fs::exists(result));
}
