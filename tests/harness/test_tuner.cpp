// The autotuner's search, tie-breaking, tables, cache and dispatcher, on the CPU: the search runs against a
// synthetic evaluator; the command runs with fake workers.
#include "flashbench/dispatch.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/spec.hpp"
#include "flashbench/sweep.hpp"
#include "flashbench/tuner.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

using namespace fb;
namespace fs = std::filesystem;

namespace {

fs::path test_dir(const std::string &name) {
  const fs::path d = fs::temp_directory_path() / ("fb_tuner_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

AttentionProblem prefill(int64_t seqlen, int64_t d, bool causal) {
  AttentionProblem p;
  p.batch = 16384 / seqlen;
  p.heads_q = p.heads_kv = 2048 / d;
  p.seqlen_q = p.seqlen_kv = seqlen;
  p.head_dim = d;
  p.causal = causal;
  return p;
}

std::vector<Config> candidates(const Variant &v, const AttentionProblem &p) {
  std::vector<Config> out;
  for (const auto &e : v.space().expand())
    if (!e.invalid_reason && v.supports(p, e.config, nominal_device()))
      out.push_back(e.config);
  return out;
}

// A synthetic landscape over a config space: each axis value scales the time by a factor in [1, 1.6], plus a
// pairwise interaction; measurements at fidelity f carry multiplicative noise of 0.5%/sqrt(f).
struct Landscape {
  const ConfigSpace &space;
  uint64_t seed;
  std::map<std::string, double> factor;
  std::mt19937_64 noise_rng{1};

  double truth(const Config &c) {
    double t = 100;
    std::string prev;
    for (const auto &[name, value] : c.params()) {
      const std::string k = name + "=" + std::to_string(value);
      t *= f(k);
      if (!prev.empty())
        t *= 1 + 0.1 * (f(prev + "&" + k) - 1);
      prev = k;
    }
    return t;
  }
  double f(const std::string &k) {
    auto it = factor.find(k);
    if (it != factor.end())
      return it->second;
    std::mt19937_64 r(seed ^ std::hash<std::string>{}(k));
    return factor[k] = 1 + 0.6 * std::uniform_real_distribution<double>(0, 1)(r);
  }
  std::vector<Measurement> operator()(const std::vector<Trial> &trials) {
    std::vector<Measurement> out;
    for (const auto &t : trials) {
      Measurement m;
      m.config = t.config;
      m.fidelity = t.fidelity;
      m.status = Status::ok;
      std::normal_distribution<double> n(0, 0.005 / std::sqrt(t.fidelity));
      m.median_us = truth(t.config) * (1 + n(noise_rng));
      m.tflops = 1e4 / m.median_us;
      out.push_back(m);
    }
    return out;
  }
};

} // namespace

TEST(Tuner, HalvingFindsNearBestWithThirtyPercentOfTheEvaluations) {
  const Variant &v = catalog().get("fa2_q_outer");
  int shapes = 0;
  for (int64_t d : {64, 128})
    for (int64_t s : {1024, 4096})
      for (bool causal : {false, true})
        for (uint64_t seed : {1, 2, 3, 4, 5}) {
          const auto cands = candidates(v, prefill(s, d, causal));
          ASSERT_GE(cands.size(), 10u);
          Landscape land{v.space(), seed * 1000 + static_cast<uint64_t>(d + s + causal)};
          double best = INFINITY;
          for (const auto &c : cands)
            best = std::min(best, land.truth(c));
          const SearchResult r =
              search_configs(v.space(), cands, "halving", 0.3, 0,
                             [&](const std::vector<Trial> &t) { return land(t); });
          ASSERT_TRUE(r.winner);
          EXPECT_LE(r.evaluations, 0.3 * static_cast<double>(cands.size()) + 1e-9);
          EXPECT_LE(land.truth(r.measurements[*r.winner].config), best * 1.02)
              << "shape " << d << "/" << s;
          ++shapes;
        }
  EXPECT_EQ(shapes, 40);
}

TEST(Tuner, ExhaustiveAndRandomAndFailuresNeverAbort) {
  const Variant &v = catalog().get("fa2_q_outer");
  const auto cands = candidates(v, prefill(2048, 128, true));
  Landscape land{v.space(), 7};
  int calls = 0;
  // Every third config "crashes": recorded, never eligible, never stops the search.
  auto eval = [&](const std::vector<Trial> &t) {
    auto ms = land(t);
    for (auto &m : ms)
      if (calls++ % 3 == 0) {
        m.status = Status::crashed;
        m.reason = "launch rejected";
      }
    return ms;
  };
  const SearchResult ex = search_configs(v.space(), cands, "exhaustive", 0.3, 0, eval);
  EXPECT_EQ(ex.measurements.size(), cands.size());
  EXPECT_DOUBLE_EQ(ex.evaluations, static_cast<double>(cands.size()));
  ASSERT_TRUE(ex.winner);
  EXPECT_EQ(ex.measurements[*ex.winner].status, Status::ok);
  const SearchResult r1 = search_configs(v.space(), cands, "random", 5, 42, land);
  const SearchResult r2 = search_configs(v.space(), cands, "random", 5, 42, land);
  ASSERT_EQ(r1.measurements.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_EQ(r1.measurements[i].config, r2.measurements[i].config); // seeded
  EXPECT_THROW(search_configs(v.space(), cands, "psychic", 1, 0, land), UserError);
}

TEST(Tuner, TiesWithinOnePercentGoToFewerResources) {
  const Variant &v = catalog().get("fa2_q_outer");
  const Config big =
      v.space().make({{"block_m", "128"}, {"block_n", "128"}, {"warps", "8"}, {"stages", "3"}});
  const Config small =
      v.space().make({{"block_m", "64"}, {"block_n", "64"}, {"warps", "4"}, {"stages", "2"}});
  auto m = [](const Config &c, double us) {
    Measurement x;
    x.config = c;
    x.status = Status::ok;
    x.median_us = us;
    return x;
  };
  // Within 1%: the smaller config wins whichever is faster and in whichever order they come.
  for (const auto &ms : {std::vector<Measurement>{m(big, 100.0), m(small, 100.8)},
                         std::vector<Measurement>{m(small, 100.8), m(big, 100.0)},
                         std::vector<Measurement>{m(small, 100.0), m(big, 100.9)}}) {
    const auto w = pick_winner(v.space(), ms);
    ASSERT_TRUE(w);
    EXPECT_EQ(ms[*w].config, small);
  }
  // Within 1% at equal resources (the same axis positions summed): the faster, in either order.
  const Config wide =
      v.space().make({{"block_m", "64"}, {"block_n", "128"}, {"warps", "4"}, {"stages", "2"}});
  const Config tall =
      v.space().make({{"block_m", "128"}, {"block_n", "64"}, {"warps", "4"}, {"stages", "2"}});
  for (const auto &ms : {std::vector<Measurement>{m(wide, 100.5), m(tall, 100.0)},
                         std::vector<Measurement>{m(tall, 100.0), m(wide, 100.5)}}) {
    const auto w = pick_winner(v.space(), ms);
    ASSERT_TRUE(w);
    EXPECT_EQ(ms[*w].config, tall);
  }
  // Beyond 1%: the faster one.
  const std::vector<Measurement> far = {m(small, 102.0), m(big, 100.0)};
  EXPECT_EQ(far[*pick_winner(v.space(), far)].config, big);
  // Only full-fidelity ok measurements are eligible.
  std::vector<Measurement> partial = {m(big, 50.0), m(small, 100.0)};
  partial[0].fidelity = 0.1;
  EXPECT_EQ(partial[*pick_winner(v.space(), partial)].config, small);
  partial[1].status = Status::incorrect;
  EXPECT_FALSE(pick_winner(v.space(), partial));
}

// c157 (fa3_pipelined/HISTORY.md, session 31): at d128 N4096 the config fastest by median had been timed at 1980 MHz and the
// others at ~1700 MHz. Such a margin is flagged by the spread of the two points' clocks, kept in the table.
TEST(Tuner, ClockSpreadFlagsMarginsBetweenPointsTimedAtDifferentClocks) {
  Measurement a, b;
  EXPECT_EQ(clock_spread(a, b), 0.0); // unknown clocks: nothing to flag
  a.sm_clock_mhz = 1980;
  EXPECT_EQ(clock_spread(a, b), 0.0);
  b.sm_clock_mhz = 1695;
  EXPECT_NEAR(clock_spread(a, b), 285.0 / 1980.0, 1e-12);
  EXPECT_EQ(clock_spread(a, b), clock_spread(b, a));
  EXPECT_GT(clock_spread(a, b), kClockSpreadFlag);
  b.sm_clock_mhz = 1965; // one NVML step apart: not flagged
  EXPECT_LT(clock_spread(a, b), kClockSpreadFlag);

  TuningTable t;
  TuningEntry e = make_entry_key("fa2_q_outer", prefill(4096, 128, false));
  e.config = Config({{"block_m", 128}});
  e.clock_spread = 0.144;
  t.upsert(e);
  const fs::path d = test_dir("clock_spread");
  save_tuning_table((d / "t.json").string(), t);
  EXPECT_DOUBLE_EQ(load_tuning_table((d / "t.json").string()).entries.at(0).clock_spread, 0.144);
}

TEST(Tuner, TableBucketsLookupAndRoundTrip) {
  EXPECT_EQ(bucket_of(1), 1);
  EXPECT_EQ(bucket_of(1000), 1024);
  EXPECT_EQ(bucket_of(1024), 1024);
  TuningTable t;
  TuningEntry a = make_entry_key("fa2_q_outer", prefill(1024, 128, true));
  a.config = Config({{"block_m", 64}});
  a.tflops = 100;
  TuningEntry b = make_entry_key("fa2_q_outer", prefill(8192, 128, true));
  b.config = Config({{"block_m", 128}});
  t.upsert(a);
  t.upsert(b);
  a.tflops = 120;
  t.upsert(a); // same bucket: replaced
  ASSERT_EQ(t.entries.size(), 2u);
  bool exact = false;
  const AttentionProblem p =
      prefill(1000, 128, true); // seqlen bucket 1024, batch*heads 16*16: a's bucket
  const TuningEntry *e = t.lookup("fa2_q_outer", p, &exact);
  ASSERT_TRUE(e);
  EXPECT_TRUE(exact);
  EXPECT_EQ(e->tflops, 120);
  e = t.lookup("fa2_q_outer", prefill(4096, 128, true),
               &exact); // log2 distance 3 to b's bucket, 6 to a's
  ASSERT_TRUE(e);
  EXPECT_FALSE(exact);
  EXPECT_EQ(e->seqlen_q_bucket, 8192);
  EXPECT_EQ(t.lookup("fa2_q_outer", prefill(1024, 64, true)), nullptr); // other head_dim: no entry
  EXPECT_EQ(t.lookup("fa1_kv_outer", prefill(1024, 128, true)), nullptr);

  const fs::path d = test_dir("table");
  save_tuning_table((d / "x.json").string(), t);
  const TuningTable back = load_tuning_table((d / "x.json").string());
  ASSERT_EQ(back.entries.size(), 2u);
  EXPECT_EQ(back.entries[0].config, t.entries[0].config);
  EXPECT_EQ(back.entries[1].seqlen_q_bucket, 8192);
  std::ofstream(d / "bad.json") << "{\"schema_version\": 7}";
  EXPECT_THROW(load_tuning_table((d / "bad.json").string()), UserError);
}

TEST(Tuner, GqaGroupIsPartOfTheKey) {
  // Decode: GQA 32/8 and MHA 32/32 at the same batch and length share every other bucket; each keeps its own
  // entry, and a table written before the group key (no group_bucket) reads as group 1.
  AttentionProblem gqa;
  gqa.batch = 1, gqa.heads_q = 32, gqa.heads_kv = 8, gqa.seqlen_q = 1, gqa.seqlen_kv = 32768,
  gqa.head_dim = 128;
  AttentionProblem mha = gqa;
  mha.heads_kv = 32;
  TuningTable t;
  TuningEntry g = make_entry_key("flash_decoding", gqa);
  g.config = Config({{"stages", 3}});
  TuningEntry m = make_entry_key("flash_decoding", mha);
  m.config = Config({{"stages", 2}});
  t.upsert(g);
  t.upsert(m);
  ASSERT_EQ(t.entries.size(), 2u);
  EXPECT_EQ(g.group_bucket, 4);
  EXPECT_EQ(m.group_bucket, 1);
  bool exact = false;
  ASSERT_TRUE(t.lookup("flash_decoding", gqa, &exact));
  EXPECT_TRUE(exact);
  EXPECT_EQ(t.lookup("flash_decoding", gqa)->config, g.config);
  EXPECT_EQ(t.lookup("flash_decoding", mha)->config, m.config);
  AttentionProblem gqa6 = gqa; // 48/8: group 6, bucket 8, nearest is the group-4 entry
  gqa6.heads_q = 48;
  EXPECT_EQ(t.lookup("flash_decoding", gqa6, &exact)->config, g.config);
  EXPECT_FALSE(exact);

  nlohmann::json j = to_json(t);
  for (auto &e : j["entries"])
    e.erase("group_bucket");
  const TuningTable old = tuning_table_from_json(j, "old.json");
  ASSERT_EQ(old.entries.size(), 2u);
  EXPECT_EQ(old.entries[0].group_bucket, 1);
  EXPECT_EQ(old.entries[1].group_bucket, 1);
}

TEST(Tuner, DispatcherUsesTheTableThenTheHeuristic) {
  const DeviceInfo dev = nominal_device();
  const AttentionProblem p = prefill(2048, 128, true);
  // No table: the documented preference order, fa3_pipelined on Hopper (the nominal device is an H100) and
  // fa2_q_outer elsewhere.
  const KernelChoice h = choose_kernel(p, dev, "auto", nullptr);
  ASSERT_TRUE(h.variant);
  EXPECT_EQ(h.variant->name(), "fa3_pipelined");
  EXPECT_NE(h.source.find("heuristic"), std::string::npos);
  DeviceInfo ampere = dev;
  ampere.cc_major = 8;
  ampere.present = true;
  EXPECT_EQ(choose_kernel(p, ampere, "auto", nullptr).variant->name(), "fa2_q_outer");
  EXPECT_EQ(choose_kernel(p, dev, "fa1_kv_outer", nullptr).config,
            catalog().get("fa1_kv_outer").space().default_config());
  EXPECT_THROW(choose_kernel(p, dev, "nope", nullptr), UserError);

  TuningTable t;
  TuningEntry fa1 = make_entry_key("fa1_kv_outer", p);
  fa1.config = Config({{"block_m", 32}, {"block_n", 32}, {"q_tiles_per_cta", 1}, {"threads", 128}});
  fa1.tflops = 300; // pretend: faster than FA2 here
  TuningEntry fa2 = make_entry_key("fa2_q_outer", p);
  fa2.config = catalog()
                   .get("fa2_q_outer")
                   .space()
                   .make({{"block_m", "64"}, {"block_n", "64"}, {"warps", "4"}});
  fa2.tflops = 200;
  t.upsert(fa1);
  t.upsert(fa2);
  KernelChoice c = choose_kernel(p, dev, "auto", &t);
  EXPECT_EQ(c.variant->name(), "fa1_kv_outer");
  EXPECT_EQ(c.config, fa1.config);
  EXPECT_NE(c.source.find("table"), std::string::npos);
  c = choose_kernel(p, dev, "fa2_q_outer", &t);
  EXPECT_EQ(c.config, fa2.config);
  // A shape the table has nothing for (another head_dim) falls back to the heuristic.
  EXPECT_NE(choose_kernel(prefill(2048, 64, true), dev, "auto", &t).source.find("heuristic"),
            std::string::npos);
}

namespace {
struct Cli {
  int code;
  std::string out, err;
};
Cli cli(const std::string &args, const fs::path &dir, const std::string &env = "") {
  const std::string cmd = env + " " + FLASHBENCH_BIN + " " + args + " >" + (dir / "o").string() +
                          " 2>" + (dir / "e").string();
  const int st = std::system(cmd.c_str());
  std::stringstream a, b;
  a << std::ifstream(dir / "o").rdbuf();
  b << std::ifstream(dir / "e").rdbuf();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, a.str(), b.str()};
}
} // namespace

TEST(Tuner, ATuneCutShortKeepsTheEntriesItFinished) {
  // The table is saved after every (variant, problem): stopped mid-run by SIGTERM, as a job's time limit stops it,
  // the tune leaves a table that loads and holds the problems it finished (before, the table was written once, at
  // the end).
  const fs::path d = test_dir("cut");
  fs::create_directories(d / "tuning");
  std::ofstream(d / "t.yaml")
      << "name: t\nproblems:\n  - {tokens: 16384, hidden: 2048, seqlen: [1024, 2048, 4096, "
         "8192], head_dim: 128, causal: true}\nvariants: [fa2_q_outer]\n";
  const fs::path table = d / "tuning" / (nominal_device().slug() + ".json");
  const std::string cmd = "exec " + std::string(FLASHBENCH_BIN) + " tune " +
                          (d / "t.yaml").string() +
                          " --fake-worker --fake-delay-ms 25 --no-cache -o " + table.string() +
                          " >" + (d / "o").string() + " 2>&1";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setpgid(0, 0); // its own group, so that its workers stop with it
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char *>(nullptr));
    _exit(127);
  }
  size_t first_seen = 0;
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 6000 && first_seen == 0 && !exited; ++i) { // up to 60 s
    if (fs::exists(table))
      first_seen = load_tuning_table(table.string()).entries.size();
    else if (waitpid(pid, &status, WNOHANG) == pid)
      exited = true;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!exited) {
    kill(-pid, SIGTERM);
    waitpid(pid, &status, 0);
  }
  std::stringstream out;
  out << std::ifstream(d / "o").rdbuf();
  ASSERT_GT(first_seen, 0u) << (exited ? "the tune ended before writing a table:\n" : "")
                            << out.str();
  EXPECT_LT(first_seen, 4u) << "the first table seen already held every problem";
  const TuningTable t = load_tuning_table(table.string());
  EXPECT_GE(t.entries.size(), first_seen);
  EXPECT_LE(t.entries.size(), 4u);
}

TEST(Tuner, CommandWritesTableCachesAndFeedsConfigsTuned) {
  const fs::path d = test_dir("cmd");
  // The dry run below looks up the table of the GPU it plans for: the real one where there is a GPU.
  const std::string table =
      (device_count() > 0 ? query_device(0).slug() : nominal_device().slug()) + ".json";
  fs::create_directories(d / "tuning"); // tune checks its output's folder before measuring
  std::ofstream(d / "t.yaml")
      << "name: t\nproblems:\n  - {tokens: 16384, hidden: 2048, seqlen: [1024, 4096], "
         "head_dim: 128, causal: true}\nvariants: [fa2_q_outer]\n";
  const std::string args =
      "tune " + (d / "t.yaml").string() + " --fake-worker --strategy halving -o " +
      (d / "tuning" / table).string() + " --cache " + (d / "cache.jsonl").string() + " --report " +
      (d / "report.json").string();
  Cli r = cli(args, d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("0 served from the cache"), std::string::npos) << r.out;
  nlohmann::json report;
  std::ifstream(d / "report.json") >> report;
  ASSERT_EQ(report["results"].size(), 2u);
  for (const auto &item : report["results"]) {
    EXPECT_LE(item["evaluations"].get<double>(), 0.3 * item["candidates"].get<double>() + 1e-9);
    EXPECT_TRUE(item.contains("winner"));
  }
  // The second run is served entirely from the cache: no worker, no measurement.
  r = cli(args, d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\n0 measurements made"), std::string::npos) << r.out;
  const TuningTable t = load_tuning_table((d / "tuning" / table).string());
  ASSERT_EQ(t.entries.size(), 2u);

  // configs: tuned picks the table's configs for this GPU.
  std::ofstream(d / "run.yaml")
      << "problems:\n  - {tokens: 16384, hidden: 2048, seqlen: [1024, 4096, 512], "
         "head_dim: 128, causal: true}\nvariants:\n  fa2_q_outer: {configs: tuned}\n";
  r = cli("run --dry-run " + (d / "run.yaml").string(), d,
          "FLASHBENCH_TUNING_DIR=" + (d / "tuning").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[tuned: bucket sq<=1024"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[tuned: nearest bucket"), std::string::npos)
      << r.out; // 512: no exact bucket
  EXPECT_NE(r.out.find(t.entries[0].config_str), std::string::npos) << r.out;
  r = cli("run --dry-run " + (d / "run.yaml").string(), d,
          "FLASHBENCH_TUNING_DIR=" + (d / "none").string());
  EXPECT_NE(r.out.find("[default: no tuning table"), std::string::npos) << r.out;
}

// The tune cache's build key: a clean commit with the same options and toolkit keys the same on any machine (a
// rebuild elsewhere differs only in the paths baked into the binary); a dirty or unknown source keys on the binary.
TEST(Tuner, CacheBuildKeyIsPortableForACleanCommitOnly) {
  const std::string a =
      portable_build_id("0123456789ab", "type=Release", "13.0", "0123456789ab+aaaa");
  const std::string b =
      portable_build_id("0123456789ab", "type=Release", "13.0", "0123456789ab+bbbb");
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.rfind("0123456789ab+", 0), 0u) << a;
  EXPECT_NE(a, portable_build_id("0123456789ab", "type=Debug", "13.0", "0123456789ab+aaaa"));
  EXPECT_NE(a, portable_build_id("0123456789ab", "type=Release", "13.1", "0123456789ab+aaaa"));
  EXPECT_NE(a, portable_build_id("ba9876543210", "type=Release", "13.0", "0123456789ab+aaaa"));
  for (const char *sha : {"0123456789ab-dirty", "unknown", ""})
    EXPECT_EQ(portable_build_id(sha, "type=Release", "13.0", "x+binary"), "x+binary") << sha;
}

namespace {
AttentionProblem gqa_prefill(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t n) {
  AttentionProblem p;
  p.batch = batch, p.heads_q = heads_q, p.heads_kv = heads_kv, p.seqlen_q = p.seqlen_kv = n,
  p.head_dim = 128;
  return p;
}
TuningEntry entry_for(const std::string &variant, const AttentionProblem &p, int64_t block_m) {
  TuningEntry e = make_entry_key(variant, p);
  e.config = Config({{"block_m", block_m}});
  return e;
}
} // namespace

TEST(Tuner, NearestBucketRule) {
  // dispatch.hpp's example: N = 3000, batch 3, GQA 48/8 lies in no measured bucket (sq 4096, b*h 256, group 8).
  const AttentionProblem p = gqa_prefill(3, 48, 8, 3000);
  TuningTable t;
  t.upsert(entry_for("fa2_q_outer", gqa_prefill(8, 32, 8, 2048), 1)); // 1.10 + 0.83 + 0.58 = 2.52
  t.upsert(entry_for("fa2_q_outer", gqa_prefill(4, 32, 8, 4096), 2)); // 0.90 + 0.17 + 0.58 = 1.65
  t.upsert(entry_for("fa2_q_outer", gqa_prefill(1, 64, 8, 4096), 3)); // 0.90 + 1.17 + 0.42 = 2.48
  bool exact = true;
  double d = 0;
  const TuningEntry *e = t.lookup("fa2_q_outer", p, &exact, &d);
  ASSERT_TRUE(e);
  EXPECT_FALSE(exact);
  EXPECT_EQ(e->config.get("block_m"), 2);
  EXPECT_NEAR(d, 2 * std::log2(4096.0 / 3000) + std::log2(128.0 / 144) * -1 + std::log2(6.0 / 4),
              1e-9);
  EXPECT_NEAR(bucket_distance(*e, p), d, 1e-12);
  // Other dtype, head_dim or causality never match, however near.
  AttentionProblem other = p;
  other.causal = true;
  EXPECT_EQ(t.lookup("fa2_q_outer", other), nullptr);
  // Its own bucket wins over any nearer-looking measured problem: N = 3000 and 4000 share bucket 4096.
  t.upsert(entry_for("fa2_q_outer", gqa_prefill(3, 48, 8, 4000), 4));
  EXPECT_EQ(t.lookup("fa2_q_outer", p, &exact)->config.get("block_m"), 4);
  EXPECT_TRUE(exact);

  // Ties: at equal distance the smaller length part wins; then the larger problem; then table order.
  TuningTable ties;
  const AttentionProblem q = gqa_prefill(4, 32, 8, 2048);                // b*h 128, group 4
  ties.upsert(entry_for("fa2_q_outer", gqa_prefill(8, 32, 8, 2048), 1)); // one doubling of b*h
  ties.upsert(
      entry_for("fa2_q_outer", gqa_prefill(4, 32, 8, 1024), 2)); // one halving of both lengths: 2
  ties.upsert(entry_for("fa2_q_outer", gqa_prefill(2, 32, 8, 2048), 3)); // one halving of b*h
  EXPECT_EQ(ties.lookup("fa2_q_outer", q)->config.get("block_m"),
            1); // 1 and 3 tie at 1, no length: larger
  TuningTable ties2;
  ties2.upsert(entry_for("fa2_q_outer", gqa_prefill(4, 16, 4, 2048), 5)); // b*h halved
  ties2.upsert(
      entry_for("fa2_q_outer", gqa_prefill(4, 64, 16, 2048), 6)); // b*h doubled: larger wins
  EXPECT_EQ(ties2.lookup("fa2_q_outer", q)->config.get("block_m"), 6);
  TuningTable ties3;
  AttentionProblem longer = gqa_prefill(2, 32, 8, 4096), wider = gqa_prefill(8, 32, 8, 1024);
  ties3.upsert(
      entry_for("fa2_q_outer", wider, 7)); // lengths halved (2), b*h doubled (1): 3, length part 2
  ties3.upsert(
      entry_for("fa2_q_outer", longer, 8)); // lengths doubled (2), b*h halved (1): 3, length part 2
  EXPECT_EQ(ties3.lookup("fa2_q_outer", q)->config.get("block_m"),
            8); // equal in all but size: the larger
}

TEST(Tuner, EntriesRecordTheirVariantsSourceHash) {
  const auto &hashes = variant_source_hashes();
  for (const auto &v : catalog().all()) {
    ASSERT_TRUE(hashes.count(v->name())) << v->name();
    EXPECT_EQ(hashes.at(v->name()).size(), 16u);
  }
  EXPECT_NE(hashes.at("fa2_q_outer"), hashes.at("fa3_pipelined"));
  TuningEntry e = make_entry_key("fa2_q_outer", prefill(1024, 128, false));
  EXPECT_NE(stale_reason(e).find("no source hash"),
            std::string::npos); // tables from before the hash
  e.source_hash = hashes.at("fa2_q_outer");
  EXPECT_EQ(stale_reason(e), "");
  e.source_hash = "0123456789abcdef";
  EXPECT_NE(stale_reason(e).find("changed"), std::string::npos);
  e.variant = "fa9_gone";
  EXPECT_NE(stale_reason(e).find("fa9_gone"), std::string::npos);
  // The hash survives the round trip; a table without it loads.
  TuningTable t;
  e.variant = "fa2_q_outer";
  e.source_hash = hashes.at("fa2_q_outer");
  t.upsert(e);
  nlohmann::json j = to_json(t);
  EXPECT_EQ(tuning_table_from_json(j, "x.json").entries[0].source_hash, e.source_hash);
  j["entries"][0].erase("source_hash");
  EXPECT_EQ(tuning_table_from_json(j, "x.json").entries[0].source_hash, "");
}

TEST(Tuner, CheckReportsStaleEntriesAndExitCodes) {
  const fs::path d = test_dir("check");
  TuningTable fresh;
  TuningEntry e = make_entry_key("fa2_q_outer", prefill(1024, 128, false));
  e.config = Config({{"block_m", 64}});
  e.source_hash = variant_source_hashes().at("fa2_q_outer");
  fresh.upsert(e);
  save_tuning_table((d / "fresh.json").string(), fresh);
  TuningTable stale = fresh;
  TuningEntry old =
      make_entry_key("fa3_pipelined", prefill(4096, 64, true)); // no hash: an old table's entry
  old.config = Config({{"block_m", 192}});
  stale.upsert(old);
  save_tuning_table((d / "stale.json").string(), stale);

  Cli r = cli("tune --check " + (d / "fresh.json").string(), d);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("1 fresh, 0 stale"), std::string::npos) << r.out;
  r = cli("tune --check " + (d / "fresh.json").string() + " " + (d / "stale.json").string(), d);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("stale: fa3_pipelined bf16 d64 causal bucket sq<=4096"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1 fresh, 1 stale"), std::string::npos) << r.out;
  // No tables named: every table of the tuning directory.
  r = cli("tune --check", d, "FLASHBENCH_TUNING_DIR=" + d.string());
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("fresh.json: 1 fresh"), std::string::npos) << r.out;
  // Bad input: exit 2, one line, nothing on stdout.
  r = cli("tune --check " + (d / "fresh.json").string() + " " + (d / "missing.json").string(), d);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("missing.json"), std::string::npos) << r.err;
  std::ofstream(d / "bad.json") << "{";
  EXPECT_EQ(cli("tune --check " + (d / "bad.json").string(), d).code, 2);
  EXPECT_EQ(cli("tune", d).code, 2); // neither a spec nor --check

  // The committed tables are listed too (the acceptance's `tune --check` on tuning/): this only checks that they
  // load; whether they are fresh is for the GPU run that regenerates them.
  r = cli("tune --check", d,
          "FLASHBENCH_TUNING_DIR=" + std::string(FLASHBENCH_SOURCE_DIR) + "/tuning");
  EXPECT_TRUE(r.code == 0 || r.code == 1) << r.out << r.err;
}

TEST(Tuner, StaleTableWarnsOnceWhenLoaded) {
  // In a child process (the table cache is per process): `run --dry-run` with configs: tuned loads the table.
  const fs::path d = test_dir("warn");
  const std::string slug = device_count() > 0 ? query_device(0).slug() : nominal_device().slug();
  TuningTable t;
  TuningEntry old = make_entry_key("fa2_q_outer", prefill(1024, 128, true)); // no source hash
  old.config = catalog().get("fa2_q_outer").space().default_config();
  t.upsert(old);
  TuningEntry other = make_entry_key("fa2_q_outer", prefill(4096, 128, true));
  other.config = old.config;
  t.upsert(other);
  save_tuning_table((d / (slug + ".json")).string(), t);
  std::ofstream(d / "run.yaml")
      << "problems:\n  - {tokens: 16384, hidden: 2048, seqlen: [1024, 4096], head_dim: "
         "128, causal: true}\nvariants:\n  fa2_q_outer: {configs: tuned}\n";
  Cli r =
      cli("run --dry-run " + (d / "run.yaml").string(), d, "FLASHBENCH_TUNING_DIR=" + d.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t first = r.err.find("warning: ");
  ASSERT_NE(first, std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2 of 2 entries"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("warning: ", first + 1), std::string::npos)
      << "more than one warning: " << r.err;
}

TEST(Tuner, SeveralGpusShareTheWorkAndGiveTheSameTable) {
  // --gpus 0,1 with fake workers (no CUDA): two workers take the measurements, and the table equals one GPU's.
  const fs::path d = test_dir("gpus");
  std::ofstream(d / "t.yaml")
      << "name: t\nproblems:\n  - {tokens: 16384, hidden: 2048, seqlen: [1024, 4096], "
         "head_dim: 128, causal: [false, true]}\nvariants: [fa2_q_outer]\n";
  auto tune = [&](const std::string &gpus, const std::string &out) {
    return cli("tune " + (d / "t.yaml").string() + " --fake-worker --no-cache --gpus " + gpus +
                   " -o " + (d / out).string() + " --report " + (d / (out + ".report")).string(),
               d);
  };
  Cli one = tune("0", "one.json"), two = tune("0,1", "two.json");
  ASSERT_EQ(one.code, 0) << one.err << one.out;
  ASSERT_EQ(two.code, 0) << two.err << two.out;
  const TuningTable a = load_tuning_table((d / "one.json").string()),
                    b = load_tuning_table((d / "two.json").string());
  ASSERT_EQ(a.entries.size(), 4u);
  ASSERT_EQ(b.entries.size(), a.entries.size());
  for (size_t i = 0; i < a.entries.size(); ++i) {
    EXPECT_EQ(a.entries[i].config, b.entries[i].config) << i;
    EXPECT_EQ(b.entries[i].source_hash, variant_source_hashes().at("fa2_q_outer"));
  }
  nlohmann::json report;
  std::ifstream(d / "two.json.report") >> report;
  EXPECT_EQ(report["workers_started"].get<int>(), 2) << report;
}

TEST(Tuner, TableSpecsCoverWhatAutoPicksAndTheAcceptanceShapes) {
  // sweeps/tune/table-*.yaml build a GPU's whole table in one `flashbench tune`: every variant `auto` picks, on the
  // acceptance shapes and the Llama-3 presets, and every (variant, problem) has a candidate on an H100.
  const std::string dir = std::string(FLASHBENCH_SOURCE_DIR) + "/sweeps/";
  std::map<std::string, std::vector<AttentionProblem>> tuned; // variant -> problems
  for (const char *f :
       {"tune/table-prefill.yaml", "tune/table-decode.yaml", "tune/table-fp8.yaml"}) {
    const SweepSpec s = load_spec(dir + f);
    for (const auto &sel : s.variants) {
      const Variant &v = catalog().get(sel.variant);
      ASSERT_EQ(sel.mode, VariantSelection::Mode::list)
          << f << ": a list keeps the search within the time budget";
      for (const auto &p : s.problems) {
        bool any = false;
        for (const auto &m : sel.configs) {
          const Config c = v.space().make(m);
          any = any || (!v.space().check(c) && v.supports(p, c, nominal_device()).ok);
        }
        EXPECT_TRUE(any) << f << ": no candidate of " << sel.variant << " supports " << key(p);
        tuned[sel.variant].push_back(p);
      }
    }
  }
  for (const char *v : {"fa3_pipelined", "fa2_q_outer", "flash_decoding", "fa3_fp8"})
    EXPECT_FALSE(tuned[v].empty()) << v << " is never tuned";
  auto covers = [&](const std::string &variant, const AttentionProblem &p) {
    const auto &ps = tuned[variant];
    return std::find(ps.begin(), ps.end(), p) != ps.end();
  };
  // The acceptance specs: sweeps/accept/<name>.yaml, or sweeps/<name>-accept.yaml in a tree not grouped by job.
  for (const auto &[name, variant] : std::vector<std::pair<std::string, std::string>>{
           {"fa3", "fa3_pipelined"}, {"fa2", "fa2_q_outer"}, {"decode", "flash_decoding"}}) {
    const std::string grouped = dir + "accept/" + name + ".yaml",
                      flat = dir + name + "-accept.yaml";
    const std::string spec = fs::exists(grouped) ? grouped : flat;
    for (const auto &p : load_spec(spec).problems)
      EXPECT_TRUE(covers(variant, p)) << spec << ": " << key(p);
  }
  // The acceptance's long GQA decode shapes, the presets' shapes and each head_dim.
  AttentionProblem d;
  d.batch = 16, d.heads_q = 32, d.heads_kv = 8, d.seqlen_q = 1, d.seqlen_kv = 20000,
  d.head_dim = 128;
  EXPECT_TRUE(covers("flash_decoding", d));
  d.batch = 4, d.heads_q = 64, d.seqlen_kv = 50000;
  EXPECT_TRUE(covers("flash_decoding", d));
  const SweepSpec presets =
      parse_spec("problems:\n  - {preset: llama3-8b-prefill}\n  - {preset: llama3-70b-prefill}\n"
                 "  - {preset: llama3-8b-decode}\n  - {preset: llama3-70b-decode}\n"
                 "variants: [naive]\n",
                 "presets");
  for (const auto &p : presets.problems)
    EXPECT_TRUE(covers(p.seqlen_q == 1 ? "flash_decoding" : "fa3_pipelined", p)) << key(p);
  for (int64_t hd : {64, 128, 256}) {
    const auto has = [&](const std::string &v) {
      return std::any_of(tuned[v].begin(), tuned[v].end(),
                         [&](const AttentionProblem &p) { return p.head_dim == hd; });
    };
    EXPECT_TRUE(has("fa3_pipelined") && has("fa2_q_outer") && has("flash_decoding")) << "d" << hd;
    EXPECT_TRUE(has("fa3_fp8")) << "fa3_fp8 d" << hd; // e4m3 at every head_dim it compiles
  }
}

TEST(Tuner, PassIsPartOfTheKeyAndABackwardEntryNeverServesAForwardProblem) {
  const AttentionProblem fwd = prefill(2048, 128, true);
  AttentionProblem bwd = fwd;
  bwd.pass = Pass::bwd;
  TuningTable t;
  TuningEntry b = make_entry_key("fa2_q_outer", bwd);
  b.config = Config({{"block_m", 128}});
  t.upsert(b);
  EXPECT_EQ(t.lookup("fa2_q_outer", fwd), nullptr); // nor any nearer bucket of the forward
  EXPECT_EQ(t.lookup("fa2_q_outer", prefill(4096, 128, true)), nullptr);
  bool exact = false;
  ASSERT_TRUE(t.lookup("fa2_q_outer", bwd, &exact));
  EXPECT_TRUE(exact);
  TuningEntry f = make_entry_key("fa2_q_outer", fwd);
  f.config = Config({{"block_m", 64}});
  EXPECT_FALSE(f.same_key(b));
  t.upsert(f); // its own entry beside the backward's, not a replacement
  ASSERT_EQ(t.entries.size(), 2u);
  EXPECT_EQ(t.lookup("fa2_q_outer", fwd)->config, f.config);
  EXPECT_EQ(t.lookup("fa2_q_outer", bwd)->config, b.config);
  EXPECT_EQ(describe_bucket(b).rfind("bwd bucket ", 0), 0u) << describe_bucket(b);

  nlohmann::json j = to_json(t);
  EXPECT_EQ(j["entries"][0]["pass"], "bwd");
  const TuningTable back = tuning_table_from_json(j, "t.json");
  EXPECT_EQ(back.entries[0].pass, Pass::bwd);
  EXPECT_EQ(back.entries[1].pass, Pass::fwd);
  // Tables written before the backward have no "pass": their entries are forward.
  for (auto &e : j["entries"]) {
    e.erase("pass");
    e["problem"].erase("pass");
  }
  const TuningTable old = tuning_table_from_json(j, "old.json");
  EXPECT_EQ(old.entries[0].pass, Pass::fwd);
  EXPECT_EQ(old.entries[0].problem.pass, Pass::fwd);
}

TEST(Tuner, DispatcherPicksOnlyVariantsOfTheProblemsPass) {
  const DeviceInfo dev = nominal_device();
  AttentionProblem bwd = prefill(2048, 128, true);
  bwd.pass = Pass::bwd;
  // A table entry of a forward variant for this very bucket is not taken for the backward.
  TuningTable t;
  TuningEntry e = make_entry_key("fa2_q_outer", bwd);
  e.config = catalog().get("fa2_q_outer").space().default_config();
  e.tflops = 1e9;
  t.upsert(e);
  bool any_bwd = false;
  for (const auto &v : catalog().all())
    any_bwd = any_bwd || (v->pass() == Pass::bwd && v->name().rfind("test_", 0) != 0);
  for (const TuningTable *table : std::vector<const TuningTable *>{nullptr, &t}) {
    if (any_bwd) {
      const KernelChoice c = choose_kernel(bwd, dev, "auto", table);
      ASSERT_TRUE(c.variant);
      EXPECT_EQ(c.variant->pass(), Pass::bwd) << c.variant->name() << ": " << c.source;
    } else {
      try {
        const KernelChoice c = choose_kernel(bwd, dev, "auto", table);
        ADD_FAILURE() << "picked " << c.variant->name() << " for a backward problem";
      } catch (const UserError &err) {
        EXPECT_NE(std::string(err.what()).find("no variant in the catalog supports"),
                  std::string::npos)
            << err.what();
      }
    }
    // A named forward variant is refused for a backward problem, table or not, saying why.
    try {
      choose_kernel(bwd, dev, "fa2_q_outer", table);
      ADD_FAILURE() << "fa2_q_outer chosen for a backward problem";
    } catch (const UserError &err) {
      EXPECT_NE(std::string(err.what())
                    .find("fa2_q_outer computes the forward pass; this point is "
                          "a backward (pass: bwd); name a variant of that pass"),
                std::string::npos)
          << err.what();
    }
  }
  // And the forward is untouched by backward entries.
  AttentionProblem fwd = bwd;
  fwd.pass = Pass::fwd;
  EXPECT_EQ(choose_kernel(fwd, dev, "auto", &t).variant->pass(), Pass::fwd);
  EXPECT_NE(choose_kernel(fwd, dev, "auto", &t).source.find("heuristic"), std::string::npos);
}

TEST(Tuner, ASpecMixingPassesTunesEachVariantOnItsOwnPass) {
  const fs::path d = test_dir("mixed_pass");
  fs::create_directories(d / "tuning");
  std::ofstream(d / "t.yaml")
      << "name: t\nproblems:\n  - {tokens: 16384, hidden: 2048, seqlen: 1024, "
         "head_dim: 128, causal: true, pass: [fwd, bwd]}\n"
         "variants: [fa2_q_outer]\n";
  const std::string out = (d / "tuning" / "t.json").string();
  const Cli r = cli("tune " + (d / "t.yaml").string() + " --fake-worker --strategy halving -o " +
                        out + " --report " + (d / "report.json").string(),
                    d);
  ASSERT_EQ(r.code, 0) << r.err
                       << r.out; // the backward problem is no failure of the forward variant
  EXPECT_NE(
      r.out.find("fa2_q_outer on b16_hq16_hkv16_sq1024_skv1024_d128_causal_bf16_bwd: not tuned "
                 "(fa2_q_outer computes the forward pass; this point is a backward (pass: bwd))"),
      std::string::npos)
      << r.out;
  const TuningTable t = load_tuning_table(out);
  ASSERT_EQ(t.entries.size(), 1u);
  EXPECT_EQ(t.entries[0].pass, Pass::fwd);
}
