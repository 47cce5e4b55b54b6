// The sweep engine: plan -> verify -> time (through Google Benchmark) -> results file.
#pragma once

#include "flashbench/results.hpp"
#include "flashbench/spec.hpp"

#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace fb {

struct RunOptions {
  std::string
      output_path; // final results JSON; "<output_path>.partial.jsonl" is appended as points finish
  int device = 0;
  bool measure_ceilings = true; // run the probe first and record the ceilings in the context
  bool counters = true; // CUPTI pass after timing (null metrics with a reason when unavailable)
  std::vector<std::string> extra_metrics; // added to default_metrics()
  bool verbose = false;
  // Fault isolation and distribution: points run in worker processes (see harness/src/supervisor.hpp).
  std::vector<int> gpus; // one worker per GPU over a shared queue; empty: {device}
  int shard_index = 0; // this run takes shard_index of shard_count deterministic slices of the plan
  int shard_count = 1;
  // Keep the records already in <output>.partial.jsonl (or, when there is none, in a finished <output> of the
  // same plan) and run only the rest.
  bool resume = false;
  bool force = false;         // with resume: an <output> of another plan is replaced, not refused
  double point_timeout_s = 0; // > 0 overrides the spec's timing.point_timeout_s
  bool fake_worker = false;   // workers simulate points without CUDA (tests of the engine)
  int fake_delay_ms = 5;
};

// Prints the plan: per variant the points that will run and are skipped (with reasons), FLOPs and model bytes.
void print_plan(std::ostream &os, const SweepSpec &spec, const std::vector<PlannedPoint> &points,
                const DeviceInfo &dev);

// The NVTX range name of a point (its name with ':' for '/'); ncu --nvtx-include "flashbench@<this>/time/".
std::string nvtx_name(const Result &r);

// "i/n" -> (i, n), 0 <= i < n; throws UserError.
std::pair<int, int> parse_shard(const std::string &text);
// The deterministic slice [begin, end) of n planned points that shard i of count takes (contiguous, so points that
// share a problem stay together and reuse its inputs and reference).
std::pair<size_t, size_t> shard_range(size_t n, int index, int count);
// A hash of this executable (16 hex digits).
std::string binary_hash();
// This binary: the git sha and binary_hash().
std::string build_id();
// What the tune cache keys a measurement's build on. For a clean commit (sha neither empty, "unknown" nor "-dirty"):
// the sha and a hash of the build options and toolkit, so that the same commit rebuilt with the same options and
// toolkit on another machine of the same GPU model (where only the paths baked into the binary differ) is served
// from the cache and a tune resumes there; otherwise `binary_id` (build_id(): only this binary is served).
std::string portable_build_id(const std::string &sha, const std::string &options,
                              const std::string &toolkit, const std::string &binary_id);
// portable_build_id() of this binary.
std::string portable_build_id();
// This build as results record it: {source_sha, options, toolkit, binary_hash, variant_sources}. Shards merge
// when source_sha, options and toolkit match, so that one source built on several machines merges.
nlohmann::json build_identity();
// Identity of a plan: the spec's name, timing policy and every point's name in order. Shards merge only when
// it matches.
std::string plan_hash(const SweepSpec &spec, const std::vector<PlannedPoint> &points);
// 64-bit FNV-1a as 16 hex digits.
std::string hash_hex(const std::string &bytes);

// Joins shard result files into one: same plan hash and source build (build_identity), no point twice, every
// shard present (unless allow_missing). Records come out in plan order. Throws UserError naming the offending file.
void merge_results(const std::vector<std::string> &inputs, const std::string &output,
                   bool allow_missing, std::ostream &log);

// Runs every planned point and writes the results file. Returns the process exit code: 0 when every point that
// ran verified correct, 1 when any point was incorrect, crashed or timed out.
int run_sweep(const SweepSpec &spec, const RunOptions &opts);

} // namespace fb

namespace fb {
// Correctness of every variant x every valid config on a built-in set of awkward shapes (lengths 1 and
// non-multiples of any tile, causal with seqlen_q != seqlen_kv, rows that see no key, GQA/MQA, every dtype).
// Only variants named in `only` when it is non-empty; `defaults_only`: each shape's default config
// (ConfigSpace::default_config(p, dev)) instead of every config. Returns 0 when all pass, 1 otherwise.
int run_check(int device, const std::vector<std::string> &only, std::ostream &os,
              bool defaults_only = false);
// The built-in shapes, exposed for tests and the dry-run listing.
std::vector<AttentionProblem> awkward_shapes();
} // namespace fb
