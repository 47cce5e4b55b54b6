// The worker side of fault-isolated sweeps (`flashbench worker`, started by the Supervisor): owns one CUDA
// context, reads points from stdin and measures each one (verify -> time -> counters) inside a Google Benchmark
// run, writing one record per point back to the parent. See supervisor.hpp for the protocol.
#pragma once

#include "flashbench/results.hpp"
#include "flashbench/spec.hpp"
#include "flashbench/timing.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace fb {

struct WorkerOptions {
  int device = 0;
  int result_fd = 3;
  bool ceilings =
      false; // measure the GEMM/copy ceilings before the first point and report them in the hello
  bool counters = true; // CUPTI pass after timing
  std::vector<std::string> extra_metrics;
  // No CUDA at all: points are simulated (the supervisor's CPU tests). ok points sleep fake_delay_ms and get a
  // time derived from their name; test_faults configs misbehave on the CPU: illegal_access sends a crashed record
  // and exits as after a sticky error, trap aborts the process without a record, spin never returns.
  bool fake = false;
  int fake_delay_ms = 5;
};

int run_worker(const WorkerOptions &o);

// A point's record before it runs: identity, FLOPs, bytes; skipped with the reason when planned as skipped.
Result make_result(const PlannedPoint &pt);

// What the parent sends for one point, and how the worker reads it back (against the catalog).
nlohmann::json task_payload(const PlannedPoint &pt, const TimingPolicy &timing,
                            double launch_deadline_s);
PlannedPoint point_from_task(const nlohmann::json &task);

} // namespace fb
