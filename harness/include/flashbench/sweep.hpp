// The sweep engine: plan -> verify -> time (through Google Benchmark) -> results file.
#pragma once

#include "flashbench/results.hpp"
#include "flashbench/spec.hpp"

#include <ostream>
#include <string>
#include <vector>

namespace fb {

struct RunOptions {
  std::string output_path;  // final results JSON; "<output_path>.partial.jsonl" is appended as points finish
  int device = 0;
  bool measure_ceilings = true; // run the probe first and record the ceilings in the context
  bool counters = true;         // CUPTI pass after timing (null metrics with a reason when unavailable)
  std::vector<std::string> extra_metrics; // added to default_metrics()
  bool verbose = false;
};

// Prints the plan: per variant the points that will run and are skipped (with reasons), FLOPs and model bytes.
void print_plan(std::ostream& os, const SweepSpec& spec, const std::vector<PlannedPoint>& points,
                const DeviceInfo& dev);

// The NVTX range name of a point (its name with ':' for '/'); ncu --nvtx-include "flashbench@<this>/time/".
std::string nvtx_name(const Result& r);

// Runs every planned point and writes the results file. Returns the process exit code: 0 when every point that
// ran verified correct, 1 when any point was incorrect, crashed or timed out.
int run_sweep(const SweepSpec& spec, const RunOptions& opts);

} // namespace fb

namespace fb {
// Correctness of every variant x every valid config on a built-in set of awkward shapes (lengths 1 and
// non-multiples of any tile, causal with seqlen_q != seqlen_kv, rows that see no key, GQA/MQA, every dtype).
// Only variants named in `only` when it is non-empty. Returns 0 when all pass, 1 otherwise.
int run_check(int device, const std::vector<std::string>& only, std::ostream& os);
// The built-in shapes, exposed for tests and the dry-run listing.
std::vector<AttentionProblem> awkward_shapes();
} // namespace fb
