// flashbench tune: search each variant's config space per problem and write a tuning table.
#include "commands.hpp"

#include "flashbench/device.hpp"
#include "flashbench/results.hpp"
#include "flashbench/spec.hpp"
#include "flashbench/tuner.hpp"
#include "options.hpp"

#include "flashbench/errors.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <vector>

namespace fb::cli {

namespace {

struct TuneArgs {
  std::vector<std::string> specs; // with --check: the tables
  std::string strategy = "halving", cache, report, gpus_csv, output;
  double budget = 0.3, point_timeout = -1;
  uint64_t seed = 0;
  bool no_cache = false, fake = false, check = false;
  int fake_delay_ms = 1;
};

int tune(const TuneArgs &a, const Globals &g) {
  if (a.check)
    return check_tuning_tables(a.specs, std::cout);
  if (a.specs.empty())
    throw UserError(
        "tune: give a sweep spec (e.g. sweeps/tune/table-prefill.yaml), or --check [TABLE...]");
  TuneOptions t;
  t.strategy = a.strategy;
  t.budget = a.budget;
  t.seed = a.seed;
  t.output_path = a.output;
  t.report_path = a.report;
  t.cache_path = a.no_cache ? "" : (a.cache.empty() ? default_cache_path() : a.cache);
  t.gpus = parse_gpus(a.gpus_csv);
  if (t.gpus.empty())
    t.gpus = {g.device};
  t.fake_worker = a.fake;
  t.fake_delay_ms = a.fake_delay_ms;
  std::vector<SweepSpec> specs; // every spec parsed before anything is measured
  for (const auto &path : a.specs) {
    specs.push_back(load_spec(path));
    if (a.point_timeout > 0)
      specs.back().timing.point_timeout_s = a.point_timeout;
  }
  // Outputs before any measurement. The tuning table is updated in place (other buckets' entries
  // are kept), so an existing one is expected, and the tuner makes its directory; the report is
  // replaced.
  if (!t.output_path.empty())
    check_output_path(t.output_path, "-o", true, "", true);
  if (!t.report_path.empty())
    check_output_path(t.report_path, "--report", true, "");
  if (!a.fake && device_count() <= t.gpus.front()) {
    std::fprintf(stderr, "flashbench: no CUDA device found; 'tune' needs a GPU\n");
    return kExitNoDevice;
  }
  if (t.output_path.empty())
    check_output_path(tuning_path_for(a.fake ? nominal_device() : query_device(t.gpus.front())),
                      "the tuning table (default path)", true, "", true);
  // Several specs tune into the same table, one after another (each with its own timing policy).
  // With several, each spec's report goes to --report's name with the spec's name before the
  // extension (tune.json -> tune-table-prefill.json).
  int code = 0;
  for (const auto &spec : specs) {
    TuneOptions ts = t;
    if (specs.size() > 1 && !t.report_path.empty()) {
      const std::filesystem::path r(t.report_path);
      ts.report_path =
          (r.parent_path() / (r.stem().string() + "-" + spec.name + r.extension().string()))
              .string();
    }
    code = std::max(code, run_tune(spec, ts, std::cout));
  }
  return code;
}

} // namespace

Command add_tune(CLI::App &app, const Globals &g) {
  auto *sub = app.add_subcommand(
      "tune", "search each variant's config space per problem; write a tuning table");
  auto a = std::make_shared<TuneArgs>();
  sub->add_option("spec", a->specs,
                  "sweep specs (problems and variants; configs are searched), tuned one after "
                  "another into one table; with --check, the tables to check");
  sub->add_flag("--check", a->check,
                "list the entries of the given tables (default: every tuning/*.json) whose "
                "variant's sources changed since they were tuned; exit 1 if any, 0 if none");
  sub->add_option(
      "-o,--output", a->output,
      "tuning table (default tuning/<gpu-slug>.json in the source tree); entries for other buckets "
      "already there are kept");
  sub->add_option("--strategy", a->strategy, "exhaustive | random | halving (successive halving)")
      ->check(CLI::IsMember({"exhaustive", "random", "halving"}));
  sub->add_option("--budget", a->budget,
                  "random/halving: evaluations per problem, in full-measurement units; < 1 means "
                  "that fraction of the candidate configs");
  sub->add_option("--seed", a->seed, "random strategy seed");
  sub->add_option(
      "--cache", a->cache,
      "measurement cache (default $FLASHBENCH_CACHE_DIR or ~/.cache/flashbench/tune-cache.jsonl)");
  sub->add_flag("--no-cache", a->no_cache, "measure everything again and record nothing");
  sub->add_option("--report", a->report,
                  "also write every measurement and the search's cost as JSON (several specs: one "
                  "report each, the spec's name added to the file name)");
  sub->add_option("--gpus", a->gpus_csv, "one worker per GPU, e.g. --gpus 0,1");
  sub->add_option("--point-timeout", a->point_timeout, "per-measurement deadline in seconds");
  sub->add_flag("--fake-worker", a->fake, "workers simulate points without CUDA (tests)")
      ->group("");
  sub->add_option("--fake-delay-ms", a->fake_delay_ms,
                  "fake workers: milliseconds a point takes (tests)")
      ->group("");
  return {sub, [a, &g] { return tune(*a, g); }};
}

} // namespace fb::cli
