// CLI error paths: bad input gets one line on stderr, exit code 2 and no output file.
#include "flashbench/device.hpp"
#include "flashbench/tuner.hpp"
#include "flashbench/variant.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

Outcome run_cli(const std::string &args) {
  const fs::path dir = fs::temp_directory_path() / "fb_cli_test";
  fs::create_directories(dir);
  // Unique names: CTest runs these tests in parallel.
  static int counter = 0;
  const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const std::string out = (dir / ("stdout_" + tag)).string(),
                    err = (dir / ("stderr_" + tag)).string();
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

std::string write_temp(const std::string &name, const std::string &text) {
  const fs::path p =
      fs::temp_directory_path() / "fb_cli_test" / (std::to_string(::getpid()) + "_" + name);
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
  return p.string();
}

void expect_user_error(const std::string &args, const std::string &needle) {
  const std::string result = (fs::temp_directory_path() / "fb_cli_test" /
                              ("never_" + std::to_string(::getpid()) + ".json"))
                                 .string();
  fs::remove(result);
  const Outcome o = run_cli(args + " -o " + result);
  EXPECT_EQ(o.code, 2) << args << "\nstderr: " << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << "not one line: " << o.err;
  EXPECT_NE(o.err.find(needle), std::string::npos) << o.err;
  EXPECT_FALSE(fs::exists(result)) << "output file left behind for: " << args;
  EXPECT_FALSE(fs::exists(result + ".partial.jsonl"));
}

const char *kGood =
    "problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64}\nvariants: [naive]\n";

} // namespace

TEST(Cli, MalformedYamlNamesFileAndLine) {
  const std::string spec =
      write_temp("bad.yaml", "problems:\n  - {batch: 1, heads: 2\nvariants: [naive]\n");
  expect_user_error("run " + spec, spec + ":3:");
}

TEST(Cli, UnknownVariantAndParameter) {
  expect_user_error(
      "run " + write_temp("v.yaml", "problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\n"
                                    "variants: [nope]\n"),
      "unknown variant 'nope'");
  expect_user_error(
      "run --variant fa1_kv_outer --shape batch=1,heads=2,seqlen=64,head_dim=64 --config tile=3",
      "unknown config parameter 'tile'");
  expect_user_error("run --variant nope --shape batch=1,heads=2,seqlen=64,head_dim=64",
                    "unknown variant 'nope'");
  expect_user_error(
      "run " + write_temp("f.yaml", "problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64, "
                                    "wings: 2}\nvariants: [naive]\n"),
      "unknown problem field 'wings'");
}

TEST(Cli, ImpossibleValues) {
  expect_user_error("run --variant naive --shape batch=1,heads=2,seqlen=0,head_dim=64",
                    "seqlen_q = 0 is impossible");
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

// `list --json` gives each variant's kernel-source hash (the one tuning tables record), which the paired nightly
// gate reads from both builds to say whether a flagged variant's code changed.
TEST(Cli, ListJsonGivesEachVariantsSourceHash) {
  const Outcome o = run_cli("list --json");
  ASSERT_EQ(o.code, 0) << o.err;
  const nlohmann::json list = nlohmann::json::parse(o.out);
  ASSERT_EQ(list.size(), fb::catalog().all().size());
  for (const auto &v : list) {
    const std::string h = v.value("source_hash", "");
    EXPECT_EQ(h.size(), 16u) << v["name"];
    EXPECT_EQ(h, fb::variant_source_hashes().at(v["name"].get<std::string>())) << v["name"];
  }
}

TEST(Cli, RunWithoutDeviceSaysSoAndShowsThePlan) {
  if (fb::device_count() > 0)
    GTEST_SKIP() << "a CUDA device is present; this test covers machines without one";
  const std::string result = (fs::temp_directory_path() / "fb_cli_test" / "none.json").string();
  const Outcome o = run_cli("run " + write_temp("good.yaml", kGood) + " -o " + result);
  EXPECT_EQ(o.code, 3);
  EXPECT_NE(o.err.find("no CUDA device"), std::string::npos) << o.err;
  EXPECT_NE(o.out.find("points"), std::string::npos);
  EXPECT_FALSE(fs::exists(result));
}

// Output paths are checked before any device is touched (these runs use fake workers, or fail before them): a bad
// path is one line and exit code 2 with nothing left behind, and an earlier run's file is never replaced unasked.
namespace {

fs::path fresh_dir(const std::string &name) {
  const fs::path d =
      fs::temp_directory_path() / "fb_cli_test" / (std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

size_t entries(const fs::path &d) {
  size_t n = 0;
  for ([[maybe_unused]] const auto &e : fs::directory_iterator(d))
    ++n;
  return n;
}

void expect_path_error(const std::string &args, const std::string &needle, const fs::path &dir) {
  const size_t before = entries(dir);
  const Outcome o = run_cli(args);
  EXPECT_EQ(o.code, 2) << args << "\nstderr: " << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << "not one line: " << o.err;
  EXPECT_NE(o.err.find(needle), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("internal error"), std::string::npos) << o.err;
  EXPECT_EQ(entries(dir), before) << "stray files after: " << args;
}

} // namespace

TEST(Cli, BadOutputPathsFailBeforeAnyWork) {
  const fs::path d = fresh_dir("paths");
  const std::string spec = write_temp("paths.yaml", kGood);
  const std::string run = "run " + spec + " --fake-worker --fake-delay-ms 1 -o ";
  expect_path_error(run + d.string(), "is a directory", d);
  expect_path_error(run + (d / "missing" / "r.json").string(),
                    "does not exist; create it (mkdir -p", d);
  expect_path_error(run + (d / "r.json" / "x.json").string(), "does not exist", d);
  // No permission: /proc takes no new files, even for root; a read-only directory for everyone else.
  expect_path_error(run + "/proc/flashbench-test.json", "cannot create files in /proc", d);
  if (::geteuid() != 0) {
    const fs::path ro = d / "ro";
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    expect_path_error(run + (ro / "r.json").string(), "cannot create files in", d);
    fs::permissions(ro, fs::perms::owner_all);
  }
  // Every command that writes: merge, tune (table and report) and probe check theirs the same way.
  expect_path_error("merge " + spec + " -o " + d.string(), "is a directory", d);
  expect_path_error("tune " + spec + " --fake-worker --no-cache --report " + d.string(), "--report",
                    d);
  expect_path_error("tune " + spec + " --fake-worker --no-cache -o " + d.string(), "is a directory",
                    d);
  expect_path_error("probe -o " + d.string(), "is a directory", d);
  expect_path_error("model " + spec + " -o " + d.string(), "is a directory", d);
}

TEST(Cli, ModelRecomputesEveryPointsTrafficModelOnTheRecordedDevice) {
  const fs::path d = fresh_dir("model");
  const std::string spec =
      write_temp("model.yaml", "problems:\n  - {batch: 2, heads: 4, seqlen: 512, head_dim: 64}\n"
                               "variants: [naive, fa2_q_outer]\n");
  const std::string results = (d / "r.json").string(), models = (d / "m.json").string();
  ASSERT_EQ(run_cli("run " + spec + " --fake-worker --fake-delay-ms 1 -o " + results).code, 0);
  {
    std::ifstream rs(results);
    std::stringstream run_text;
    run_text << rs.rdbuf(); // the run's records carry the model's regime too
    EXPECT_NE(run_text.str().find("\"bytes_model_reason\": \"K/V 1.00x from DRAM"),
              std::string::npos);
  }
  Outcome o = run_cli("model " + results + " -o " + models);
  ASSERT_EQ(o.code, 0) << o.err;
  std::ifstream is(models);
  std::stringstream text;
  text << is.rdbuf();
  EXPECT_NE(text.str().find("\"bytes_model_reason\": \"K/V 1.00x from DRAM"), std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("\"device\""), std::string::npos);
  o = run_cli("model " + results); // a table on stdout
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("fa2_q_outer/"), std::string::npos) << o.out;
  // Input it cannot model from: one line, exit 2, no output.
  expect_path_error("model " + (d / "missing.json").string() + " -o " + models + " --force",
                    "cannot open results file", d);
  const std::string no_device =
      write_temp("model_nodev.json", "{\"context\": {\"schema_version\": 1}, \"benchmarks\": []}");
  expect_path_error("model " + no_device, "no context.device", d);
}

TEST(Cli, AnExistingResultsFileIsReplacedOnlyWithForce) {
  const fs::path d = fresh_dir("force");
  const std::string spec = write_temp("force.yaml", kGood);
  const std::string out = (d / "r.json").string();
  const std::string run = "run " + spec + " --fake-worker --fake-delay-ms 1 -o " + out;
  std::ofstream(out) << "{\"earlier\": true}\n";
  expect_path_error(run, "already exists; pass --force to replace it, --resume to continue", d);
  std::stringstream kept;
  kept << std::ifstream(out).rdbuf();
  EXPECT_EQ(kept.str(), "{\"earlier\": true}\n");
  Outcome o = run_cli(run + " --force");
  ASSERT_EQ(o.code, 0) << o.err;
  std::stringstream now;
  now << std::ifstream(out).rdbuf();
  EXPECT_NE(now.str().find("\"benchmarks\""), std::string::npos);
  // An empty file (mktemp's) holds no results: it is written without --force.
  const std::string empty = (d / "empty.json").string();
  std::ofstream(empty).flush();
  o = run_cli("run " + spec + " --fake-worker --fake-delay-ms 1 -o " + empty);
  EXPECT_EQ(o.code, 0) << o.err;
  // merge refuses to replace its output the same way.
  const std::string merged = (d / "merged.json").string();
  std::ofstream(merged) << "x";
  expect_path_error("merge " + out + " -o " + merged, "already exists; pass --force", d);
  o = run_cli("merge " + out + " --force -o " + merged);
  EXPECT_EQ(o.code, 0) << o.err;
}

TEST(Cli, AnInterruptedRunsPointsAreKeptUnlessResumedOrForced) {
  const fs::path d = fresh_dir("partial");
  const std::string spec = write_temp("partial.yaml", kGood);
  const std::string out = (d / "r.json").string();
  std::ofstream(out + ".partial.jsonl") << "{\"name\": \"naive/x/y\", \"status\": \"ok\"}\n";
  expect_path_error("run " + spec + " --fake-worker -o " + out, "continue that run with --resume",
                    d);
  const Outcome o = run_cli("run " + spec + " --fake-worker --fake-delay-ms 1 --resume -o " + out);
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial.jsonl"));
}

TEST(Cli, HelpShowsTheDefaultOutput) {
  const Outcome o = run_cli("run --help");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("default ./results.json"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("--force"), std::string::npos) << o.out;
}

TEST(Cli, ResumingAFinishedRunKeepsItsPoints) {
  const fs::path d = fresh_dir("resume_done");
  const std::string spec = write_temp("resume_done.yaml", kGood);
  const std::string out = (d / "r.json").string();
  const std::string run = "run " + spec + " --fake-worker --fake-delay-ms 1 -o " + out;
  ASSERT_EQ(run_cli(run).code, 0);
  Outcome o = run_cli(run + " --resume");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("finished points kept from " + out), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("0 points to run"), std::string::npos) << o.out;
  // Another plan's results are not this run's to continue.
  const std::string other =
      write_temp("resume_other.yaml", "problems:\n  - {batch: 1, heads: 2, seqlen: 32, "
                                      "head_dim: 64}\nvariants: [naive]\n");
  expect_path_error("run " + other + " --fake-worker --resume -o " + out,
                    "holds the results of another plan", d);
}

TEST(Cli, ShapeTakesThePass) {
  const std::string shape = "--variant naive --shape batch=1,heads=2,seqlen=64,head_dim=64";
  Outcome o = run_cli("run --dry-run " + shape + ",pass=bwd");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("naive/"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("_d64_bf16_bwd"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("(naive computes the forward pass; this point is a backward (pass: bwd))"),
            std::string::npos)
      << o.out;
  o = run_cli("run --dry-run " + shape + ",pass=fwd");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out.find("_bwd"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("skip "), std::string::npos) << o.out;
  expect_user_error("run " + shape + ",pass=sideways", "unknown pass 'sideways'");
  expect_user_error("run " + shape + ",pass=bwd,dtype=e4m3", "use dtype bf16");
}

TEST(Cli, PlanGivesTheBackwardsKeyFlopsBytesAndGradientTolerance) {
  const Outcome o = run_cli(
      "plan " + write_temp("bwd.yaml", "problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: "
                                       "64, pass: [fwd, bwd]}\nvariants: [naive]\n"));
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("\"pass\": \"bwd\""), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("\"pass\": \"fwd\""), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("b1_hq2_hkv2_sq64_skv64_d64_bf16_bwd"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("\"term\""), std::string::npos) << o.out; // the gradients' bound
}

TEST(Cli, ShapeTakesTheQuantization) {
  const std::string shape =
      "--variant fa3_fp8 --shape batch=1,heads=2,seqlen=256,head_dim=128,dtype=e4m3";
  Outcome o = run_cli("run --dry-run " + shape + ",quant=block_hadamard");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("_d128_e4m3_hadamard"), std::string::npos) << o.out;
  o = run_cli("run --dry-run " + shape);
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out.find("_hadamard"), std::string::npos) << o.out;
  expect_user_error("run " + shape + ",quant=sideways", "unknown quant 'sideways'");
  expect_user_error("run --variant naive --shape batch=1,heads=2,seqlen=64,head_dim=64,"
                    "quant=block_hadamard",
                    "use dtype e4m3 or drop quant");
}

TEST(Cli, Fp8ErrorRefusesBadInputBeforeAnyDevice) {
  expect_user_error("fp8-error --outliers cauchy", "unknown outlier kind 'cauchy'");
  expect_user_error("fp8-error --shape batch=1,heads=2,seqlen=256,head_dim=128,dtype=bf16",
                    "fp8-error measures e4m3 inputs");
  expect_user_error("fp8-error --shape batch=1,heads=2,seqlen=256,head_dim=128 --variant nope",
                    "nope");
}
