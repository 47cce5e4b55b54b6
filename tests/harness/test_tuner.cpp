// The autotuner's search, tie-breaking, tables, cache and dispatcher, on the CPU: the search runs against a
// synthetic evaluator; the command runs with fake workers.
#include "flashbench/dispatch.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/spec.hpp"
#include "flashbench/tuner.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

using namespace fb;
namespace fs = std::filesystem;

namespace {

fs::path test_dir(const std::string& name) {
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

std::vector<Config> candidates(const Variant& v, const AttentionProblem& p) {
  std::vector<Config> out;
  for (const auto& e : v.space().expand())
    if (!e.invalid_reason && v.supports(p, e.config, nominal_device())) out.push_back(e.config);
  return out;
}

// A synthetic landscape over a config space: each axis value scales the time by a factor in [1, 1.6], plus a
// pairwise interaction; measurements at fidelity f carry multiplicative noise of 0.5%/sqrt(f).
struct Landscape {
  const ConfigSpace& space;
  uint64_t seed;
  std::map<std::string, double> factor;
  std::mt19937_64 noise_rng{1};

  double truth(const Config& c) {
    double t = 100;
    std::string prev;
    for (const auto& [name, value] : c.params()) {
      const std::string k = name + "=" + std::to_string(value);
      t *= f(k);
      if (!prev.empty()) t *= 1 + 0.1 * (f(prev + "&" + k) - 1);
      prev = k;
    }
    return t;
  }
  double f(const std::string& k) {
    auto it = factor.find(k);
    if (it != factor.end()) return it->second;
    std::mt19937_64 r(seed ^ std::hash<std::string>{}(k));
    return factor[k] = 1 + 0.6 * std::uniform_real_distribution<double>(0, 1)(r);
  }
  std::vector<Measurement> operator()(const std::vector<Trial>& trials) {
    std::vector<Measurement> out;
    for (const auto& t : trials) {
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
  const Variant& v = catalog().get("fa2_q_outer");
  int shapes = 0;
  for (int64_t d : {64, 128})
    for (int64_t s : {1024, 4096})
      for (bool causal : {false, true})
        for (uint64_t seed : {1, 2, 3, 4, 5}) {
          const auto cands = candidates(v, prefill(s, d, causal));
          ASSERT_GE(cands.size(), 10u);
          Landscape land{v.space(), seed * 1000 + static_cast<uint64_t>(d + s + causal)};
          double best = INFINITY;
          for (const auto& c : cands) best = std::min(best, land.truth(c));
          const SearchResult r = search_configs(
              v.space(), cands, "halving", 0.3, 0, [&](const std::vector<Trial>& t) { return land(t); });
          ASSERT_TRUE(r.winner);
          EXPECT_LE(r.evaluations, 0.3 * static_cast<double>(cands.size()) + 1e-9);
          EXPECT_LE(land.truth(r.measurements[*r.winner].config), best * 1.02) << "shape " << d << "/" << s;
          ++shapes;
        }
  EXPECT_EQ(shapes, 40);
}

TEST(Tuner, ExhaustiveAndRandomAndFailuresNeverAbort) {
  const Variant& v = catalog().get("fa2_q_outer");
  const auto cands = candidates(v, prefill(2048, 128, true));
  Landscape land{v.space(), 7};
  int calls = 0;
  // Every third config "crashes": recorded, never eligible, never stops the search.
  auto eval = [&](const std::vector<Trial>& t) {
    auto ms = land(t);
    for (auto& m : ms)
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
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(r1.measurements[i].config, r2.measurements[i].config); // seeded
  EXPECT_THROW(search_configs(v.space(), cands, "psychic", 1, 0, land), UserError);
}

TEST(Tuner, TiesWithinOnePercentGoToFewerResources) {
  const Variant& v = catalog().get("fa2_q_outer");
  const Config big = v.space().make({{"block_m", "128"}, {"block_n", "128"}, {"warps", "8"}, {"stages", "3"}});
  const Config small = v.space().make({{"block_m", "64"}, {"block_n", "64"}, {"warps", "4"}, {"stages", "2"}});
  auto m = [](const Config& c, double us) {
    Measurement x;
    x.config = c;
    x.status = Status::ok;
    x.median_us = us;
    return x;
  };
  // Within 1%: the smaller config wins whichever is faster and in whichever order they come.
  for (const auto& ms : {std::vector<Measurement>{m(big, 100.0), m(small, 100.8)},
                         std::vector<Measurement>{m(small, 100.8), m(big, 100.0)},
                         std::vector<Measurement>{m(small, 100.0), m(big, 100.9)}}) {
    const auto w = pick_winner(v.space(), ms);
    ASSERT_TRUE(w);
    EXPECT_EQ(ms[*w].config, small);
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
  const AttentionProblem p = prefill(1000, 128, true); // seqlen bucket 1024, batch*heads 16*16: a's bucket
  const TuningEntry* e = t.lookup("fa2_q_outer", p, &exact);
  ASSERT_TRUE(e);
  EXPECT_TRUE(exact);
  EXPECT_EQ(e->tflops, 120);
  e = t.lookup("fa2_q_outer", prefill(4096, 128, true), &exact); // log2 distance 3 to b's bucket, 6 to a's
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
  gqa.batch = 1, gqa.heads_q = 32, gqa.heads_kv = 8, gqa.seqlen_q = 1, gqa.seqlen_kv = 32768, gqa.head_dim = 128;
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
  for (auto& e : j["entries"])
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
  fa2.config = catalog().get("fa2_q_outer").space().make({{"block_m", "64"}, {"block_n", "64"}, {"warps", "4"}});
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
  EXPECT_NE(choose_kernel(prefill(2048, 64, true), dev, "auto", &t).source.find("heuristic"), std::string::npos);
}

namespace {
struct Cli {
  int code;
  std::string out, err;
};
Cli cli(const std::string& args, const fs::path& dir, const std::string& env = "") {
  const std::string cmd = env + " " + FLASHBENCH_BIN + " " + args + " >" + (dir / "o").string() + " 2>" +
                          (dir / "e").string();
  const int st = std::system(cmd.c_str());
  std::stringstream a, b;
  a << std::ifstream(dir / "o").rdbuf();
  b << std::ifstream(dir / "e").rdbuf();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, a.str(), b.str()};
}
} // namespace

TEST(Tuner, CommandWritesTableCachesAndFeedsConfigsTuned) {
  const fs::path d = test_dir("cmd");
  // The dry run below looks up the table of the GPU it plans for: the real one where there is a GPU.
  const std::string table = (device_count() > 0 ? query_device(0).slug() : nominal_device().slug()) + ".json";
  std::ofstream(d / "t.yaml") << "name: t\nproblems:\n  - {tokens: 16384, hidden: 2048, seqlen: [1024, 4096], "
                                 "head_dim: 128, causal: true}\nvariants: [fa2_q_outer]\n";
  const std::string args = "tune " + (d / "t.yaml").string() + " --fake-worker --strategy halving -o " +
                           (d / "tuning" / table).string() + " --cache " +
                           (d / "cache.jsonl").string() + " --report " + (d / "report.json").string();
  Cli r = cli(args, d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("0 served from the cache"), std::string::npos) << r.out;
  nlohmann::json report;
  std::ifstream(d / "report.json") >> report;
  ASSERT_EQ(report["results"].size(), 2u);
  for (const auto& item : report["results"]) {
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
  std::ofstream(d / "run.yaml") << "problems:\n  - {tokens: 16384, hidden: 2048, seqlen: [1024, 4096, 512], "
                                   "head_dim: 128, causal: true}\nvariants:\n  fa2_q_outer: {configs: tuned}\n";
  r = cli("run --dry-run " + (d / "run.yaml").string(), d, "FLASHBENCH_TUNING_DIR=" + (d / "tuning").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[tuned: bucket sq<=1024"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[tuned: nearest bucket"), std::string::npos) << r.out; // 512: no exact bucket
  EXPECT_NE(r.out.find(t.entries[0].config_str), std::string::npos) << r.out;
  r = cli("run --dry-run " + (d / "run.yaml").string(), d, "FLASHBENCH_TUNING_DIR=" + (d / "none").string());
  EXPECT_NE(r.out.find("[default: no tuning table"), std::string::npos) << r.out;
}
