// The autotuner and its tuning tables.
//
// `flashbench tune SPEC` searches each variant's config space for every problem of the spec, measuring through the
// same fault-isolated workers as `run` (a config that crashes, hangs or is rejected at launch is recorded and never
// aborts the search; only configs that verify correct are eligible). Strategies:
//   exhaustive  every candidate at full fidelity (the spec's timing policy);
//   random      `budget` candidates drawn with a fixed seed, full fidelity;
//   halving     successive halving: every candidate at a low fidelity (few samples, short minimum time), the best
//               third at three times that, the best few at full fidelity. `budget` counts full-fidelity
//               measurements: a measurement at fidelity f costs f.
// Candidates within 1% of the fastest are ties, broken toward fewer resources (smaller values on every axis), then
// by the config's order, so the winner does not flip between runs on noise.
//
// Measurements are cached in an append-only JSONL file keyed on the GPU (name, SM count), driver and runtime
// versions, the build (git sha + executable hash), variant, config, problem and timing policy: a re-run is served
// from it; entries of another build or driver simply never match.
//
// The tuning table (tuning/<gpu-slug>.json) keeps, per (variant, pass, dtype, head_dim, causal, seqlen_q bucket,
// seqlen_kv bucket, batch*heads_q bucket, heads_q/heads_kv bucket) with power-of-two buckets, the winner with its
// TFLOPs, the runner-up margin, the problem it was measured on and the source hash of the variant it tuned
// (variant_source_hashes()). The dispatcher (dispatch.hpp) and `configs: tuned` read it; `flashbench tune --check`
// lists the entries whose variant's sources have changed since (stale_reason()).
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/device.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/results.hpp"
#include "flashbench/spec.hpp"
#include "flashbench/variant.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace fb {

// ---- tuning tables ----

int64_t bucket_of(int64_t n); // the smallest power of two >= n (n >= 1)

struct TuningEntry {
  std::string variant;
  Pass pass = Pass::fwd; // tables written before the backward have no "pass": they are forward
  DType dtype = DType::bf16;
  int64_t head_dim = 0;
  bool causal = false;
  int64_t seqlen_q_bucket = 1, seqlen_kv_bucket = 1, bh_bucket = 1;
  // Query heads per KV head (power-of-two bucket): decode packs a GQA group into one row block, so GQA
  // 32/8 and MHA 32/32 at the same batch and length want different configs. Tables written before
  // this key read as 1.
  int64_t group_bucket = 1;
  Config config;
  std::string config_str;
  double tflops = 0, median_us = 0;
  std::string runner_up; // config_str of the second best ("" when there was one candidate)
  double margin =
      0; // runner-up time / winner time - 1 (negative when the winner won a 1% tie on resources)
  // How far apart the SM clocks were at which the winner and the runner-up were timed: |a - b| / max(a, b) of their
  // median sampled clocks (0: unknown, or no runner-up). Under a power cap a point's median follows the clock phase
  // it drew, so above kClockSpreadFlag the margin may be the clock's rather than the code's (seen on a power-capped H100).
  double clock_spread = 0;
  AttentionProblem problem; // the problem it was measured on
  // The variant's source hash in the build that tuned it; "" in tables written before hashes were recorded.
  std::string source_hash;
  std::string strategy;
  double evaluations = 0;
  int candidates = 0;

  bool same_key(const TuningEntry &o) const;
};

struct TuningTable {
  nlohmann::json gpu =
      nlohmann::json::object(); // name, slug, sm_count, cc, driver_version, runtime_version
  std::string build_id;
  std::vector<TuningEntry> entries;

  // The entry for (variant, p) by the nearest-bucket rule (dispatch.hpp): among the variant's entries with p's
  // pass, dtype, head_dim and causality, the one of p's own bucket, else the one nearest by bucket_distance(), ties
  // broken by the smaller length part of the distance, then toward the larger problem, then by table order.
  // Null when there is none within kMaxBucketDistance. *exact says whether it is p's own bucket; *distance gives
  // its distance (0 when exact).
  const TuningEntry *lookup(const std::string &variant, const AttentionProblem &p,
                            bool *exact = nullptr, double *distance = nullptr) const;
  void upsert(TuningEntry e); // replaces the entry with the same key
};

TuningEntry make_entry_key(const std::string &variant, const AttentionProblem &p);

// How far an entry is from a problem: the sum over seqlen_q, seqlen_kv, batch*heads_q and heads_q/heads_kv of
// |log2(problem's value / entry's value)|, the entry's values being those of the problem it was measured on (its
// bucket's upper edge for tables that did not record it). Each doubling counts one, whichever dimension it is in.
double bucket_distance(const TuningEntry &e, const AttentionProblem &p);
// Entries farther than this are not near: a config tuned on a problem 64 times larger or smaller (a prefill
// problem's for decode: seqlen_q 512 against 1 is 9 alone) says little; the default for the problem decides.
inline constexpr double kMaxBucketDistance = 6;

// "bucket sq<=4096 skv<=4096 b*h<=128 group<=4" ("bwd bucket ..." for a backward entry)
std::string describe_bucket(const TuningEntry &e);

// Each variant folder's source hash in this build (generated by harness/source_hashes.cmake): variant name ->
// 16 hex digits over the sources of kernels/<variant>/, kernels/common/ and the kernel files they include.
const std::map<std::string, std::string> &variant_source_hashes();
// Why an entry no longer describes this build's variant ("" when it does): no hash recorded, the variant's sources
// changed since, or the variant is gone.
std::string stale_reason(const TuningEntry &e);
// `flashbench tune --check [TABLE...]`: every stale entry of each table (no tables: every *.json in tuning_dir()),
// one line each, then a summary a table. Returns 0 when all are fresh, 1 when some entry is stale; a missing or
// malformed table is a UserError (exit 2), raised before anything is printed.
int check_tuning_tables(const std::vector<std::string> &paths, std::ostream &os);
nlohmann::json to_json(const TuningTable &t);
TuningTable tuning_table_from_json(const nlohmann::json &j, const std::string &path_for_messages);
TuningTable load_tuning_table(const std::string &path); // throws UserError naming the file
void save_tuning_table(const std::string &path, const TuningTable &t); // atomic

// $FLASHBENCH_TUNING_DIR, else the source tree's tuning/ directory.
std::string tuning_dir();
std::string tuning_path_for(const DeviceInfo &dev); // tuning_dir()/<slug>.json
// The table of this GPU (loaded once per path); null when there is no file. A malformed file is a UserError.
// When it has stale entries, the first load prints one warning on stderr (how many, which variants, the command
// that lists them).
const TuningTable *tuning_table_for(const DeviceInfo &dev);

// `configs: tuned`: the table's config for (v, p) on dev when it has one the variant supports, else the default
// config; the string says which ("tuned: <slug> bucket ..." or "default: no tuning table for <slug>").
std::pair<Config, std::string> tuned_config(const Variant &v, const AttentionProblem &p,
                                            const DeviceInfo &dev);

// ---- search ----

struct Trial {
  Config config;
  double fidelity = 1.0; // fraction of the full timing policy
};

struct Measurement {
  Config config;
  double fidelity = 1.0;
  Status status = Status::crashed;
  double median_us = 0;
  double tflops = 0;
  std::string reason;
  bool cached = false;
  double seconds = 0;      // wall time the measurement took (timing), 0 when cached
  double sm_clock_mhz = 0; // median SM clock over the timed samples (0: unknown)
};

// The winner/runner-up clock spread above which `flashbench tune` flags a margin (TuningEntry::clock_spread).
inline constexpr double kClockSpreadFlag = 0.02;
// |a - b| / max(a, b) of two measurements' clocks; 0 when either is unknown.
double clock_spread(const Measurement &a, const Measurement &b);

// Measures a batch of trials of one (variant, problem); one Measurement per trial, in order.
using Evaluator = std::function<std::vector<Measurement>(const std::vector<Trial> &)>;

struct SearchResult {
  std::vector<Measurement> measurements;   // every measurement, in the order made
  std::optional<size_t> winner, runner_up; // indices into measurements (full fidelity only)
  int candidates = 0;
  double evaluations =
      0; // full-fidelity equivalents: the sum of the fidelities asked for (cached or not)
  int configs_measured = 0;
};

// budget < 1: that fraction of the candidates; >= 1: a count of full-fidelity measurements.
SearchResult search_configs(const ConfigSpace &space, const std::vector<Config> &candidates,
                            const std::string &strategy, double budget, uint64_t seed,
                            const Evaluator &eval);

// Among ok measurements of the given fidelity: the fastest, with configs within tie_fraction of it counted as ties
// and won by the one with fewer resources (smaller axis positions summed), then by the faster, then by config order.
std::optional<size_t> pick_winner(const ConfigSpace &space, const std::vector<Measurement> &m,
                                  double fidelity = 1.0, double tie_fraction = 0.01);

// The timing policy of a measurement at fidelity f (f = 1: the spec's own).
TimingPolicy scaled_policy(const TimingPolicy &full, double fidelity);

// ---- the command ----

std::string
default_cache_path(); // $FLASHBENCH_CACHE_DIR/tune-cache.jsonl or ~/.cache/flashbench/tune-cache.jsonl

struct TuneOptions {
  std::string strategy = "halving";
  double budget = 0.3;
  uint64_t seed = 0;
  std::string output_path; // empty: tuning_path_for(device)
  std::string report_path; // empty: none
  std::string cache_path;  // empty: no cache
  std::vector<int> gpus = {0};
  bool fake_worker = false;
  int fake_delay_ms = 1; // fake workers: how long a simulated point takes
  bool verbose = false;
};

// Returns 0 when every (variant, problem) got a winner, 1 when some had no eligible config.
int run_tune(const SweepSpec &spec, const TuneOptions &o, std::ostream &os);

} // namespace fb
