// flashbench run: a sweep spec, or one variant and shape, measured into a results file.
#include "commands.hpp"

#include "flashbench/errors.hpp"
#include "flashbench/results.hpp"
#include "flashbench/spec.hpp"
#include "flashbench/sweep.hpp"
#include "flashbench/variant.hpp"
#include "options.hpp"

#include <cstdio>
#include <iostream>
#include <memory>

namespace fb::cli {

namespace {

constexpr const char *kDefaultOutput = "results.json";

struct RunArgs {
  std::string spec_path, output = kDefaultOutput, variant, shape, config;
  bool dry_run = false, no_ceilings = false, verbose = false, resume = false, force = false,
       fake_worker = false;
  bool no_counters = false;
  double min_time = -1, timeout = -1, max_noise = -1, point_timeout = -1;
  std::string gpus_csv, shard_text, configs_override, metrics_csv;
  int fake_delay_ms = 5;
};

int run(const RunArgs &a, const Globals &g) {
  if (!a.variant.empty() && !a.spec_path.empty())
    throw UserError("give a spec file or --variant with --shape, not both");
  if (a.variant.empty() && a.spec_path.empty())
    throw UserError(
        "nothing to run: give a spec (e.g. sweeps/quick.yaml) or --variant NAME --shape ...");
  if (!a.variant.empty() && a.shape.empty())
    throw UserError(
        "--variant needs --shape, e.g. --shape batch=1,heads=16,seqlen=4096,head_dim=128");
  SweepSpec spec = a.spec_path.empty()
                       ? parse_spec(quick_spec_yaml(a.variant, a.shape, a.config), "<command line>")
                       : load_spec(a.spec_path);
  if (a.min_time >= 0)
    spec.timing.min_time_s = a.min_time;
  if (a.timeout > 0)
    spec.timing.timeout_s = a.timeout;
  if (a.max_noise > 0)
    spec.timing.max_noise = a.max_noise;
  if (a.point_timeout > 0)
    spec.timing.point_timeout_s = a.point_timeout;
  if (!a.configs_override.empty())
    for (auto &sel : spec.variants) {
      sel.mode = a.configs_override == "all"     ? VariantSelection::Mode::all
                 : a.configs_override == "tuned" ? VariantSelection::Mode::tuned
                                                 : VariantSelection::Mode::default_config;
      sel.configs.clear();
    }
  const auto gpus = parse_gpus(a.gpus_csv);
  const auto [shard_index, shard_count] =
      a.shard_text.empty() ? std::pair{0, 1} : parse_shard(a.shard_text);
  // The results file and its partial log, before any device is looked at: a bad path fails now, not
  // after the sweep, and an earlier run's results are never replaced unasked.
  if (!a.dry_run) {
    check_output_path(
        a.output, "-o", a.force || a.resume,
        "pass --force to replace it, --resume to continue that run, or choose another -o");
    check_partial_log(a.output + ".partial.jsonl", a.resume || a.force);
  }

  int device = g.device;
  if (!gpus.empty())
    device = gpus.front();
  bool present = false;
  const DeviceInfo dev = device_or_nominal(device, &present);
  for (int i : gpus)
    if (present && !a.fake_worker && i >= device_count())
      throw UserError("--gpus " + a.gpus_csv + ": there is no GPU " + std::to_string(i) +
                      " (this machine has " + std::to_string(device_count()) + ")");
  present = present || a.fake_worker;
  const auto points =
      plan(spec, catalog(), dev); // unknown variants/configs fail here, before output
  if (a.dry_run || !present) {
    if (!present && !a.dry_run)
      std::fprintf(stderr,
                   "flashbench: no CUDA device found; nothing was run. The plan (with nominal H100 "
                   "limits) follows; run on a machine with an NVIDIA GPU to measure.\n");
    print_plan(std::cout, spec, points, dev);
    return present || a.dry_run ? 0 : kExitNoDevice;
  }
  RunOptions opts;
  opts.output_path = a.output;
  opts.device = device;
  opts.measure_ceilings = !a.no_ceilings;
  opts.verbose = a.verbose;
  opts.gpus = gpus;
  opts.shard_index = shard_index;
  opts.shard_count = shard_count;
  opts.resume = a.resume;
  opts.force = a.force;
  opts.fake_worker = a.fake_worker;
  opts.fake_delay_ms = a.fake_delay_ms;
  opts.counters = !a.no_counters;
  opts.extra_metrics = split_csv(a.metrics_csv);
  return run_sweep(spec, opts);
}

} // namespace

Command add_run(CLI::App &app, const Globals &g) {
  auto *sub = app.add_subcommand(
      "run", "run a sweep spec (or one variant and shape) and write a results file");
  auto a = std::make_shared<RunArgs>();
  sub->add_option("spec", a->spec_path, "sweep spec (YAML), e.g. sweeps/quick.yaml");
  sub->add_option("-o,--output", a->output,
                  std::string("results file (Google Benchmark JSON shape); default ./") +
                      kDefaultOutput +
                      ". Points are appended to <output>.partial.jsonl as they finish");
  sub->add_flag("--force", a->force,
                "replace an existing results file (and an interrupted run's partial log)");
  sub->add_option("--variant", a->variant, "run one variant instead of a spec (with --shape)");
  sub->add_option(
      "--shape", a->shape,
      "with --variant: batch=1,heads=16,seqlen=4096,head_dim=128,causal=true,dtype=bf16");
  sub->add_option("--config", a->config, "with --variant: block_m=64,block_n=64 | default | all");
  sub->add_flag("--dry-run", a->dry_run,
                "print the plan (points, FLOPs, expected bytes); needs no GPU");
  sub->add_flag("--no-ceilings", a->no_ceilings, "skip measuring the GEMM and copy ceilings");
  sub->add_option("--min-time", a->min_time, "override the spec's timing.min_time_s");
  sub->add_option("--timeout", a->timeout, "override the spec's timing.timeout_s");
  sub->add_option("--max-noise", a->max_noise,
                  "override the spec's timing.max_noise (relative, e.g. 0.005)");
  sub->add_flag("-v,--verbose", a->verbose);
  sub->add_flag(
      "--resume", a->resume,
      "keep the points already in <output>.partial.jsonl (after any interruption), run the rest");
  sub->add_option("--gpus", a->gpus_csv,
                  "one worker per GPU over a shared queue, e.g. --gpus 0,1,2,3");
  sub->add_option("--shard", a->shard_text,
                  "run slice i of n of the plan (e.g. 0/4); join the files with 'merge'");
  sub->add_option("--point-timeout", a->point_timeout,
                  "override the spec's timing.point_timeout_s (whole point, seconds)");
  sub->add_option("--configs", a->configs_override,
                  "override every variant's configs: all | default | tuned")
      ->check(CLI::IsMember({"all", "default", "tuned"}));
  sub->add_flag("--fake-worker", a->fake_worker, "workers simulate points without CUDA (tests)")
      ->group("");
  sub->add_option("--fake-delay-ms", a->fake_delay_ms,
                  "with --fake-worker: milliseconds per ok point")
      ->group("");
  sub->add_flag("--no-counters", a->no_counters,
                "skip the CUPTI pass (metrics null with that reason)");
  sub->add_option("--metrics", a->metrics_csv,
                  "extra CUPTI metrics, comma-separated (e.g. lts__t_sector_hit_rate.pct)");
  return {sub, [a, &g] { return run(*a, g); }};
}

} // namespace fb::cli
