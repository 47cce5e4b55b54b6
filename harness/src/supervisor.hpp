// Fault isolation for sweeps and the tuner. Points run in `flashbench worker` child processes (fork + exec of this
// executable, so no CUDA state ever crosses a fork); the parent never creates a CUDA context. Each worker takes one
// point at a time from a shared queue, so a kernel that kills its context (illegal address, trap, any sticky error)
// or hangs costs exactly that point: the worker is ended (SIGKILL after the per-point deadline) and a fresh one
// takes over the rest of the queue.
//
// Protocol (one JSON object per line both ways):
//   parent -> worker, on the worker's stdin:   {"id": N, "name": ..., "variant": ..., "config": {...},
//                                                "problem": {...}, "timing": {...}}
//   worker -> parent, on fd kWorkerResultFd:    {"type": "hello", "device": {...}, ...}   once, when ready
//                                                {"type": "phase", "id": N, "phase": "verify"}
//                                                {"type": "result", "id": N, "record": {...}}
// A worker that hits a sticky error sends the point's record and exits with kExitContextLost. EOF on stdin ends a
// worker cleanly. Workers die with the parent (PR_SET_PDEATHSIG), so kill -9 of a sweep leaves no orphans.
#pragma once

#include "flashbench/results.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fb {

constexpr int kWorkerResultFd = 3;
constexpr int kExitContextLost =
    86; // the worker's CUDA context is unusable; the parent starts a fresh one

struct SupervisorTask {
  size_t id = 0;
  nlohmann::json payload; // what the worker receives (the "id" field is set by the supervisor)
  std::string
      affinity; // tasks with equal affinity (the problem key) prefer the same worker: inputs are reused
};

struct SupervisorOptions {
  std::string exe;                // the flashbench executable; empty: /proc/self/exe
  std::vector<int> devices = {0}; // one worker per entry (a device index, passed as --device)
  double point_timeout_s =
      120; // from dispatch to result; past it the worker is killed and the point is a timeout
  double startup_timeout_s = 600; // from spawn to hello (CUDA init, ceilings)
  // Extra arguments after "worker --device D --result-fd 3"; `first` is true for the run's very first worker.
  std::function<std::vector<std::string>(int device, bool first)> worker_args;
  bool verbose = false;
};

struct SupervisorCallbacks {
  std::function<void(const nlohmann::json &hello)> on_hello;       // every worker's hello
  std::function<void(size_t id, nlohmann::json record)> on_record; // a worker's record for task id
  std::function<void(size_t id, Status status, std::string reason)>
      on_lost; // crashed or timeout, no record
};

class Supervisor {
public:
  explicit Supervisor(SupervisorOptions opts);
  ~Supervisor(); // ends every worker (EOF, then SIGKILL after a grace period)
  Supervisor(const Supervisor &) = delete;
  Supervisor &operator=(const Supervisor &) = delete;

  // Runs every task to an outcome (a record or a loss) and returns. Workers stay alive between calls.
  void run(const std::vector<SupervisorTask> &tasks, const SupervisorCallbacks &cb);

  int workers_started() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "signal 11 (Segmentation fault)" or "exit status 3" from a waitpid status.
std::string describe_wait_status(int status);

} // namespace fb
