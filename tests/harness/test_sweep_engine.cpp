// The fault-isolated sweep engine on the CPU: `flashbench run --fake-worker` runs the real supervisor and real
// worker processes, with the points simulated (no CUDA). test_faults configs misbehave the three ways a kernel can:
// a sticky error reported by the worker (illegal_access), a worker that dies with no record (trap: abort), and a
// hang (spin: sleeps forever, killed at the point deadline).
#include "flashbench/errors.hpp"
#include "flashbench/spec.hpp"
#include "flashbench/sweep.hpp"

#include "flashbench/tuner.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;

namespace {

fs::path test_dir(const std::string &name) {
  const fs::path d = fs::temp_directory_path() / ("fb_engine_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

struct Outcome {
  int code = -1;
  std::string out, err;
};

Outcome flashbench(const std::string &args, const fs::path &dir) {
  static int n = 0;
  const std::string tag = std::to_string(n++);
  const fs::path out = dir / ("stdout" + tag), err = dir / ("stderr" + tag);
  const std::string cmd = "FLASHBENCH_TEST_VARIANTS=1 " + std::string(FLASHBENCH_BIN) + " " + args +
                          " >" + out.string() + " 2>" + err.string();
  const int status = std::system(cmd.c_str());
  Outcome o;
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::stringstream a, b;
  a << std::ifstream(out).rdbuf();
  b << std::ifstream(err).rdbuf();
  o.out = a.str();
  o.err = b.str();
  return o;
}

nlohmann::json read_json(const fs::path &p) {
  std::ifstream is(p);
  nlohmann::json j;
  is >> j;
  return j;
}

std::string write(const fs::path &p, const std::string &text) {
  std::ofstream(p) << text;
  return p.string();
}

// fa1_kv_outer's first `n` configs as a YAML list.
std::string fa1_configs(int n) {
  std::string s;
  int i = 0;
  for (int bm : {16, 32, 64})
    for (int bn : {16, 32, 64})
      for (int t : {0, 1, 4, 16})
        for (int th : {128, 256})
          if (i++ < n)
            s += "      - {block_m: " + std::to_string(bm) + ", block_n: " + std::to_string(bn) +
                 ", q_tiles_per_cta: " + std::to_string(t) + ", threads: " + std::to_string(th) +
                 "}\n";
  return s;
}

// 50 points: naive (2 configs), the three faulty configs, then 45 FA1 configs; `faults` false leaves them out.
std::string fault_spec(bool faults) {
  std::string s =
      "name: faults\nproblems:\n  - {batch: 1, heads: 2, seqlen: 256, head_dim: 64}\nvariants:\n"
      "  naive:\n    configs: [{softmax_threads: 128}, {softmax_threads: 256}]\n";
  if (faults)
    s += "  test_faults:\n    configs: [{fault: illegal_access}, {fault: trap}, {fault: spin}]\n";
  return s + "  fa1_kv_outer:\n    configs:\n" + fa1_configs(45);
}

std::map<std::string, nlohmann::json> by_name(const nlohmann::json &doc) {
  std::map<std::string, nlohmann::json> m;
  for (const auto &r : doc["benchmarks"]) {
    EXPECT_TRUE(m.emplace(r["name"].get<std::string>(), r).second) << "duplicate " << r["name"];
  }
  return m;
}

std::vector<nlohmann::json> log_records(const fs::path &p) {
  std::vector<nlohmann::json> out;
  std::ifstream is(p);
  for (std::string line; std::getline(is, line);) {
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const std::exception &) { // a torn last line
    }
  }
  return out;
}

} // namespace

TEST(SweepEngine, FaultsCostOnlyTheirOwnPoints) {
  const fs::path d = test_dir("faults");
  const std::string faulty = write(d / "faulty.yaml", fault_spec(true)),
                    clean = write(d / "clean.yaml", fault_spec(false));
  const Outcome a =
      flashbench("run " + faulty + " --fake-worker --fake-delay-ms 1 --point-timeout 1 -o " +
                     (d / "faulty.json").string(),
                 d);
  EXPECT_EQ(a.code, 1) << a.err; // some points crashed or timed out
  const Outcome b = flashbench(
      "run " + clean + " --fake-worker --fake-delay-ms 1 -o " + (d / "clean.json").string(), d);
  ASSERT_EQ(b.code, 0) << b.err;
  const auto faulty_doc = read_json(d / "faulty.json"), clean_doc = read_json(d / "clean.json");
  const auto f = by_name(faulty_doc), c = by_name(clean_doc);
  ASSERT_EQ(f.size(), 50u);
  ASSERT_EQ(c.size(), 47u);
  int faults = 0;
  for (const auto &[name, rec] : f) {
    if (rec["variant"] == "test_faults") {
      ++faults;
      const std::string fault = rec["config"]["fault"], status = rec["status"],
                        reason = rec["reason"];
      if (fault == "illegal_access") {
        EXPECT_EQ(status, "crashed");
        EXPECT_NE(reason.find("cudaErrorIllegalAddress"), std::string::npos) << reason;
      } else if (fault == "trap") {
        EXPECT_EQ(status, "crashed");
        EXPECT_NE(reason.find("died with signal 6"), std::string::npos) << reason;
      } else {
        EXPECT_EQ(status, "timeout");
        EXPECT_NE(reason.find("no result after 1 s"), std::string::npos) << reason;
        EXPECT_NE(reason.find("killed"), std::string::npos) << reason;
      }
      continue;
    }
    ASSERT_TRUE(c.count(name)) << name;
    EXPECT_EQ(rec["status"], "ok") << name << ": " << rec["reason"];
    EXPECT_EQ(rec["status"], c.at(name)["status"]) << name;
    EXPECT_EQ(rec["median_us"], c.at(name)["median_us"])
        << name; // fake times depend only on the point
  }
  EXPECT_EQ(faults, 3);
  // One fresh worker after each of the three faults.
  EXPECT_EQ(faulty_doc["context"]["workers_started"], 4);
  EXPECT_FALSE(fs::exists(d / "faulty.json.partial.jsonl"));
}

TEST(SweepEngine, KillNineThenResumeLosesAndRepeatsNothing) {
  const fs::path d = test_dir("resume");
  const std::string spec =
      write(d / "s.yaml", "name: resume\nproblems:\n  - {batch: 1, heads: 2, seqlen: "
                          "{range: [16, 640, 16]}, head_dim: 64}\nvariants: [fa1_kv_outer]\n");
  const std::string out = (d / "r.json").string(), partial = out + ".partial.jsonl";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl(FLASHBENCH_BIN, FLASHBENCH_BIN, "run", spec.c_str(), "--fake-worker", "--fake-delay-ms",
          "40", "-o", out.c_str(), static_cast<char *>(nullptr));
    _exit(127);
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (log_records(partial).size() < 12 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_FALSE(fs::exists(out));
  const auto before = log_records(partial);
  ASSERT_GE(before.size(), 12u);
  ASSERT_LT(before.size(), 40u)
      << "the sweep finished before it was killed; slow the fake points down";

  const Outcome r =
      flashbench("run " + spec + " --fake-worker --fake-delay-ms 1 --resume -o " + out, d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("resume: " + std::to_string(before.size()) + " finished points kept"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(std::to_string(40 - before.size()) + " points to run"), std::string::npos)
      << r.out;
  const auto after = by_name(read_json(out));
  ASSERT_EQ(after.size(), 40u);
  for (const auto &rec : before) {
    const auto it = after.find(rec["name"].get<std::string>());
    ASSERT_NE(it, after.end());
    EXPECT_EQ(it->second["seed"], rec["seed"])
        << "re-run: " << rec["name"]; // each run draws a new seed
  }
}

TEST(SweepEngine, ShardsAndGpusGiveTheSamePointsOnce) {
  const fs::path d = test_dir("shards");
  const std::string spec =
      write(d / "s.yaml", "name: shards\nproblems:\n  - {batch: 1, heads: 2, seqlen: [64, "
                          "128, 256], head_dim: [64, 72, 300]}\nvariants:\n  naive: default\n"
                          "  fa1_kv_outer:\n    configs:\n" +
                              fa1_configs(3));
  auto run = [&](const std::string &extra, const std::string &out) {
    const Outcome o = flashbench("run " + spec + " --fake-worker --fake-delay-ms 1 " + extra +
                                     " -o " + (d / out).string(),
                                 d);
    EXPECT_EQ(o.code, 0) << o.err;
  };
  run("", "one.json");
  run("--shard 0/2", "s0.json");
  run("--shard 1/2", "s1.json");
  run("--gpus 0,1", "two.json");
  const Outcome m = flashbench("merge " + (d / "s1.json").string() + " " +
                                   (d / "s0.json").string() + " -o " + (d / "all.json").string(),
                               d);
  ASSERT_EQ(m.code, 0) << m.err;
  const auto one = read_json(d / "one.json"), all = read_json(d / "all.json"),
             two = read_json(d / "two.json");
  auto statuses = [](const nlohmann::json &doc) {
    std::vector<std::pair<std::string, std::string>> v;
    for (const auto &r : doc["benchmarks"])
      v.emplace_back(r["name"], r["status"]);
    return v;
  };
  EXPECT_EQ(one["benchmarks"].size(), 9u * 4u); // skipped points (head_dim 300) are points too
  EXPECT_EQ(statuses(all), statuses(one));      // same points, same order, no duplicates
  auto sorted = [&](const nlohmann::json &doc) {
    auto v = statuses(doc);
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(two), sorted(one));
  EXPECT_EQ(two["context"]["workers_started"], 2);
  by_name(all); // asserts no duplicates

  // A shard given twice, or shards of another plan, are refused with one line and exit code 2.
  Outcome bad = flashbench("merge " + (d / "s0.json").string() + " " + (d / "s0.json").string() +
                               " -o " + (d / "x.json").string(),
                           d);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("given twice"), std::string::npos) << bad.err;
  bad = flashbench("merge " + (d / "s0.json").string() + " -o " + (d / "x.json").string(), d);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("shard(s) 1 of 2 missing"), std::string::npos) << bad.err;
  const std::string other =
      write(d / "o.yaml", "name: other\nproblems:\n  - {batch: 1, heads: 2, seqlen: 64, "
                          "head_dim: 64}\nvariants: [naive]\n");
  const Outcome o1 =
      flashbench("run " + other + " --fake-worker --shard 1/2 -o " + (d / "o1.json").string(), d);
  ASSERT_EQ(o1.code, 0) << o1.err;
  bad = flashbench("merge " + (d / "s0.json").string() + " " + (d / "o1.json").string() + " -o " +
                       (d / "x.json").string(),
                   d);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("plan_hash"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(d / "x.json"));
}

TEST(SweepEngine, ShardRangesPartitionThePlan) {
  for (size_t n = 0; n < 30; ++n)
    for (int count = 1; count <= 7; ++count) {
      size_t next = 0;
      for (int i = 0; i < count; ++i) {
        const auto [b, e] = fb::shard_range(n, i, count);
        EXPECT_EQ(b, next);
        EXPECT_LE(b, e);
        next = e;
      }
      EXPECT_EQ(next, n);
    }
  EXPECT_EQ(fb::parse_shard("2/5"), std::make_pair(2, 5));
  for (const char *bad : {"5/5", "-1/3", "1", "a/b", "1/0", "1/2/3"})
    EXPECT_THROW(fb::parse_shard(bad), fb::UserError) << bad;
}

TEST(SweepEngine, RunFlagErrorsAreUserErrors) {
  const fs::path d = test_dir("flags");
  const std::string spec =
      write(d / "s.yaml", "problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64}\n"
                          "variants: [naive]\n");
  for (const std::string &args : {"--shard 3/2", "--gpus 0,x", "--configs best"}) {
    const Outcome o =
        flashbench("run " + spec + " --fake-worker " + args + " -o " + (d / "n.json").string(), d);
    EXPECT_EQ(o.code, 2) << args << ": " << o.err;
    EXPECT_FALSE(fs::exists(d / "n.json"));
  }
}

TEST(SweepEngine, TestVariantsOnlyWithTheirEnvVar) {
  const fs::path d = test_dir("env");
  const std::string list = std::string(FLASHBENCH_BIN) + " list > " + (d / "list").string();
  ASSERT_EQ(std::system(("env -u FLASHBENCH_TEST_VARIANTS " + list).c_str()), 0);
  std::stringstream hidden;
  hidden << std::ifstream(d / "list").rdbuf();
  EXPECT_EQ(hidden.str().find("test_faults"), std::string::npos);
  ASSERT_EQ(std::system(("FLASHBENCH_TEST_VARIANTS=1 " + list).c_str()), 0);
  std::stringstream shown;
  shown << std::ifstream(d / "list").rdbuf();
  EXPECT_NE(shown.str().find("test_faults"), std::string::npos);
}

// Issue #4's degradation path end to end on CPU: counters fail at the CUPTI boundary (simulated), and the sweep still
// writes a complete results file: every point timed, metrics null, the CUPTI reason in every record and the context.
TEST(SweepEngine, UnavailableCountersLeaveACompleteFileWithNullMetrics) {
  const fs::path d = test_dir("no_counters");
  const std::string spec = write(d / "s.yaml", fault_spec(false));
  const std::string env = "FLASHBENCH_SIMULATE_CUPTI_FAILURE=CUPTI_ERROR_INSUFFICIENT_PRIVILEGES ";
  const std::string cmd = env + "FLASHBENCH_TEST_VARIANTS=1 " + std::string(FLASHBENCH_BIN) +
                          " run " + spec + " --fake-worker --fake-delay-ms 1 -o " +
                          (d / "r.json").string() + " >" + (d / "out").string() + " 2>" +
                          (d / "err").string();
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::stringstream err;
  err << std::ifstream(d / "err").rdbuf();
  EXPECT_NE(err.str().find(
                "hardware counters unavailable (simulated: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)"),
            std::string::npos)
      << err.str();
  const auto doc = read_json(d / "r.json");
  EXPECT_FALSE(doc["context"]["counters"]["available"].get<bool>());
  ASSERT_EQ(doc["benchmarks"].size(), 47u);
  for (const auto &rec : doc["benchmarks"]) {
    EXPECT_EQ(rec["status"], "ok") << rec["name"];
    EXPECT_TRUE(rec["counters"].is_null()) << rec["name"];
    EXPECT_NE(rec.value("counters_reason", "").find("INSUFFICIENT_PRIVILEGES"), std::string::npos)
        << rec["name"];
    EXPECT_GT(rec["median_us"].get<double>(), 0.0);
  }
  EXPECT_FALSE(fs::exists(d / "r.json.partial.jsonl"));
}

// Shards of one source built on two machines have different binaries: merge matches them by source sha, build
// options and toolkit, records every input's binary, and refuses shards of another build configuration.
TEST(SweepEngine, MergeTakesOneSourceBuiltOnSeveralMachines) {
  const fs::path d = test_dir("machines");
  const std::string spec =
      write(d / "s.yaml", "name: machines\nproblems:\n  - {batch: 1, heads: 2, seqlen: [64, "
                          "128], head_dim: 64}\nvariants: [naive]\n");
  for (const char *shard : {"0/2", "1/2"}) {
    const std::string out = (d / (std::string("s") + shard[0] + ".json")).string();
    const Outcome o = flashbench(
        "run " + spec + " --fake-worker --fake-delay-ms 1 --shard " + shard + " -o " + out, d);
    ASSERT_EQ(o.code, 0) << o.err;
  }
  nlohmann::json s1 = read_json(d / "s1.json");
  const nlohmann::json build = s1["context"]["build"];
  ASSERT_TRUE(build.is_object());
  for (const char *f : {"source_sha", "options", "toolkit", "binary_hash"})
    EXPECT_TRUE(build.contains(f) && !build[f].get<std::string>().empty()) << f;
  // Each variant's kernel-source hash, so that two results files tell which variants' code differs.
  ASSERT_TRUE(build.contains("variant_sources") && build["variant_sources"].is_object());
  EXPECT_EQ(build["variant_sources"].value("naive", ""), fb::variant_source_hashes().at("naive"));
  // The other machine's binary.
  s1["context"]["build"]["binary_hash"] = "0123456789abcdef";
  s1["context"]["build_id"] = build["source_sha"].get<std::string>() + "+0123456789abcdef";
  std::ofstream(d / "s1.json") << s1.dump(1);
  const Outcome m = flashbench("merge " + (d / "s0.json").string() + " " +
                                   (d / "s1.json").string() + " -o " + (d / "all.json").string(),
                               d);
  ASSERT_EQ(m.code, 0) << m.err;
  const nlohmann::json all = read_json(d / "all.json");
  EXPECT_EQ(all["benchmarks"].size(), 2u);
  ASSERT_EQ(all["context"]["merged_build_ids"].size(), 2u);
  EXPECT_EQ(all["context"]["merged_build_ids"][1], s1["context"]["build_id"]);
  // Another build configuration (or source, or toolkit) is another build.
  for (const char *field : {"options", "toolkit", "source_sha"}) {
    nlohmann::json other = s1;
    other["context"]["build"][field] = "something else";
    std::ofstream(d / "other.json") << other.dump(1);
    const Outcome bad =
        flashbench("merge " + (d / "s0.json").string() + " " + (d / "other.json").string() +
                       " -o " + (d / "x.json").string(),
                   d);
    EXPECT_EQ(bad.code, 2) << field;
    EXPECT_NE(bad.err.find(std::string("build ") + field), std::string::npos) << bad.err;
    EXPECT_FALSE(fs::exists(d / "x.json"));
  }
}
