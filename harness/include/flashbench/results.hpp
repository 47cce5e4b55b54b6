// Result: what happened to one point (variant, config, problem), and the results file that holds them.
// The file has Google Benchmark's JSON shape ({"context": ..., "benchmarks": [...]}) so that its tools/compare.py
// reads it; each record adds flashbench's structured fields. Points that were not timed carry Google Benchmark's
// own error convention (error_occurred, error_message, zero times) plus status and reason.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/counters.hpp"
#include "flashbench/device.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/timing.hpp"
#include "flashbench/verify.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace fb {

constexpr int kSchemaVersion = 1;

enum class Status { ok, skipped, incorrect, crashed, timeout };
const char *to_string(Status s);
Status parse_status(const std::string &s);

struct Result {
  std::string variant;
  Config config;
  nlohmann::json config_json = nlohmann::json::object(); // with labels for enumerated axes
  std::string config_str;                                // "block_m=64,block_n=64"
  AttentionProblem problem;
  Status status = Status::skipped;
  std::string reason;
  std::optional<TimingStats> timing;
  std::optional<VerifyResult> verification;
  std::optional<Counters>
      counters; // read in the profile pass; !available means null metrics + reason
  std::vector<Occupancy>
      occupancy; // theoretical, one per kernel the variant lists (first = main kernel)
  double flops = 0;
  double bytes_min = 0;
  double bytes_model = 0;
  std::string bytes_model_reason; // the traffic model's regime (TrafficModel::reason)
  double bytes_model_low = -1,
         bytes_model_high = -1; // the range that regime leaves open (-1: none)
  uint64_t seed = 0;

  std::string name() const; // "variant/config/problem-key", unique within a sweep
  double tflops() const;    // 0 unless ok
};

nlohmann::json to_json(const Result &r);
Result result_from_json(const nlohmann::json &j); // throws UserError on a malformed record

// Writes {"context": context, "benchmarks": records} to `path` atomically (temp file, fsync, rename). On failure
// the temp file is removed and a UserError names the path.
void write_results_file(const std::string &path, const nlohmann::json &context,
                        const std::vector<Result> &results);
// The same from records already in JSON form (the sweep's parent holds its workers' records this way).
void write_results_file(const std::string &path, const nlohmann::json &context,
                        const std::vector<nlohmann::json> &records);
// Checks, before any work, that `path` can be written by the option named `option` (e.g. "-o"): not a directory,
// its directory exists and takes new files (probed by creating and removing one there), and, unless
// `may_replace`, no non-empty file is there yet (`replace_hint` then says what to do, e.g. "pass --force").
// With `creates_parents` (a writer that makes its directory, as the tuner does for tuning/), a missing directory
// is fine when its nearest existing ancestor takes new files. Throws UserError: what, where, what to do.
void check_output_path(const std::string &path, const std::string &option, bool may_replace,
                       const std::string &replace_hint, bool creates_parents = false);
// A run's <output>.partial.jsonl left by an interrupted run holds measured points: unless `may_discard` (--resume
// continues it, --force starts over), a non-empty one is a UserError.
void check_partial_log(const std::string &path, bool may_discard);
// Reads and checks schema_version; throws UserError naming the file on any problem.
nlohmann::json read_results_file(const std::string &path);
// The device a results file recorded (its context.device), for what is computed from it afterwards (the traffic
// models: flashbench model). Throws UserError naming `where` when a field the models need (cc, sm_count, l2_bytes,
// smem_per_sm, regs_per_sm, max_threads_per_sm) is missing. max_blocks_per_sm, which older files lack, defaults
// to the architecture's limit (32 on compute capability 8.0 and 9.0+, else 16).
DeviceInfo device_from_json(const nlohmann::json &j, const std::string &where);

// Append-only log of finished records (one JSON object a line) beside the final file, so that a crash never loses
// finished points.
class ResultLog {
public:
  explicit ResultLog(std::string path);
  void append(const Result &r);
  void append(const nlohmann::json &record);
  const std::string &path() const { return path_; }

private:
  std::string path_;
};

} // namespace fb
