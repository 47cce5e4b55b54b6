// flashbench worker (internal): measures the points that run and tune send on stdin, in its own
// process.
#include "commands.hpp"

#include "../src/worker.hpp"
#include "options.hpp"

#include <memory>

namespace fb::cli {

namespace {
struct WorkerArgs {
  WorkerOptions opts;
  std::string metrics;
  bool no_counters = false;
};
} // namespace

Command add_worker(CLI::App &app, const Globals &) {
  auto *sub = app.add_subcommand("worker", "internal: measures points sent by run/tune on stdin")
                  ->group("");
  auto a = std::make_shared<WorkerArgs>();
  sub->add_option("--device", a->opts.device);
  sub->add_option("--result-fd", a->opts.result_fd);
  sub->add_flag("--ceilings", a->opts.ceilings);
  sub->add_flag("--no-counters", a->no_counters);
  sub->add_option("--metrics", a->metrics);
  sub->add_flag("--fake", a->opts.fake);
  sub->add_option("--fake-delay-ms", a->opts.fake_delay_ms);
  return {sub, [a] {
            a->opts.counters = !a->no_counters;
            a->opts.extra_metrics = split_csv(a->metrics);
            return run_worker(a->opts);
          }};
}

} // namespace fb::cli
