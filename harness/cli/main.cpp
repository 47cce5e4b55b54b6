// flashbench: list | run | plan | check | probe | tune | merge (and the internal worker). Every user error is
// one line on stderr and exit code 2, raised before any output file is created.
#include "flashbench/check.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/probe.hpp"
#include "flashbench/results.hpp"
#include "flashbench/spec.hpp"
#include "flashbench/sweep.hpp"
#include "flashbench/tuner.hpp"
#include "../src/worker.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

namespace {

constexpr int kExitNoDevice = 3;

// Quick flags become a one-entry spec in YAML, so they go through exactly the same parser and checks as files.
std::string quick_spec_yaml(const std::string& variant, const std::string& shape, const std::string& config) {
  std::ostringstream y;
  y << "name: command-line\nproblems:\n  - {";
  const auto yaml_map = [&](const std::vector<std::pair<std::string, std::string>>& items) {
    for (size_t i = 0; i < items.size(); ++i) y << (i ? ", " : "") << items[i].first << ": " << items[i].second;
  };
  yaml_map(fb::parse_assignments(shape, "--shape",
                                 "--shape batch=1,heads=16,seqlen=4096,head_dim=128,causal=true,dtype=bf16"));
  y << "}\nvariants:\n  " << variant << ":\n    configs: ";
  if (config.empty() || config == "default" || config == "all" || config == "tuned") {
    y << (config.empty() ? "default" : config) << "\n";
  } else {
    y << "\n      - {";
    yaml_map(fb::parse_assignments(config, "--config", "--config block_m=64,block_n=64"));
    y << "}\n";
  }
  return y.str();
}

void list_catalog(bool as_json) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& v : fb::catalog().all()) {
    nlohmann::json axes = nlohmann::json::array();
    for (const auto& a : v->space().axes()) {
      nlohmann::json vals = nlohmann::json::array();
      for (int64_t x : a.values) vals.push_back(a.labels.empty() ? nlohmann::json(x) : nlohmann::json(a.label_of(x)));
      axes.push_back({{"name", a.name}, {"values", vals}, {"help", a.help}});
    }
    out.push_back({{"name", v->name()},
                   {"description", v->description()},
                   {"axes", axes},
                   {"configs", v->space().size()},
                   {"default", v->space().to_json(v->space().default_config())}});
    if (!as_json) {
      std::printf("%s\n  %s\n  %zu configs; default %s\n", v->name().c_str(), v->description().c_str(),
                  v->space().size(), v->space().to_string(v->space().default_config()).c_str());
      for (const auto& a : v->space().axes()) {
        std::printf("    %-18s", a.name.c_str());
        for (size_t i = 0; i < a.values.size(); ++i)
          std::printf("%s%s", i ? ", " : "", a.label_of(a.values[i]).c_str());
        std::printf("%s%s\n", a.help.empty() ? "" : "   # ", a.help.c_str());
      }
    }
  }
  if (as_json) std::printf("%s\n", out.dump(2).c_str());
}

// "0,1,3" -> {0, 1, 3}; "" -> {}.
std::vector<int> parse_gpus(const std::string& csv) {
  std::vector<int> out;
  std::istringstream is(csv);
  for (std::string g; std::getline(is, g, ',');) {
    try {
      size_t used = 0;
      const int v = std::stoi(g, &used);
      if (used != g.size() || v < 0) throw std::invalid_argument(g);
      if (std::find(out.begin(), out.end(), v) != out.end()) throw std::invalid_argument(g);
      out.push_back(v);
    } catch (const std::exception&) {
      throw fb::UserError("--gpus '" + csv + "': expected distinct device indices like 0,1,2");
    }
  }
  return out;
}

// "33554432", "32M", "1G" -> bytes (K/M/G are binary multiples). Anything else is a user error naming the option.
size_t parse_byte_size(const std::string& text, const std::string& option) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  const std::string suffix = pos ? text.substr(pos) : "";
  const unsigned long long mult = suffix.empty() ? 1 : suffix == "K" ? 1ull << 10 : suffix == "M" ? 1ull << 20
                                                                                    : suffix == "G" ? 1ull << 30 : 0;
  if (pos == 0 || mult == 0 || text[0] == '-')
    throw fb::UserError(option + ": '" + text + "' is not a size; give bytes, optionally with K, M or G (e.g. 32M)");
  return static_cast<size_t>(v * mult);
}

fb::DeviceInfo device_or_nominal(int index, bool* present) {
  *present = fb::device_count() > index;
  return *present ? fb::query_device(index) : fb::nominal_device();
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"flashbench: verify, time and profile FlashAttention-style kernels"};
  app.require_subcommand(1);
  int device = 0;
  app.add_option("--device", device, "CUDA device index")->check(CLI::NonNegativeNumber);

  auto* list = app.add_subcommand("list", "the catalog: variants and their config spaces");
  bool list_json = false;
  list->add_flag("--json", list_json, "machine-readable");

  auto* run = app.add_subcommand("run", "run a sweep spec (or one variant and shape) and write a results file");
  std::string spec_path, output = "results.json", variant, shape, config;
  bool dry_run = false, no_ceilings = false, verbose = false;
  double min_time = -1, timeout = -1, max_noise = -1;
  run->add_option("spec", spec_path, "sweep spec (YAML), e.g. sweeps/quick.yaml");
  run->add_option("-o,--output", output, "results file (Google Benchmark JSON shape)");
  run->add_option("--variant", variant, "run one variant instead of a spec (with --shape)");
  run->add_option("--shape", shape, "with --variant: batch=1,heads=16,seqlen=4096,head_dim=128,causal=true,dtype=bf16");
  run->add_option("--config", config, "with --variant: block_m=64,block_n=64 | default | all");
  run->add_flag("--dry-run", dry_run, "print the plan (points, FLOPs, expected bytes); needs no GPU");
  run->add_flag("--no-ceilings", no_ceilings, "skip measuring the GEMM and copy ceilings");
  run->add_option("--min-time", min_time, "override the spec's timing.min_time_s");
  run->add_option("--timeout", timeout, "override the spec's timing.timeout_s");
  run->add_option("--max-noise", max_noise, "override the spec's timing.max_noise (relative, e.g. 0.005)");
  run->add_flag("-v,--verbose", verbose);
  bool resume = false, fake_worker = false;
  std::string gpus_csv, shard_text, configs_override;
  double point_timeout = -1;
  int fake_delay_ms = 5;
  run->add_flag("--resume", resume, "keep the points already in <output>.partial.jsonl (after any interruption), run the rest");
  run->add_option("--gpus", gpus_csv, "one worker per GPU over a shared queue, e.g. --gpus 0,1,2,3");
  run->add_option("--shard", shard_text, "run slice i of n of the plan (e.g. 0/4); join the files with 'merge'");
  run->add_option("--point-timeout", point_timeout, "override the spec's timing.point_timeout_s (whole point, seconds)");
  run->add_option("--configs", configs_override, "override every variant's configs: all | default | tuned")
      ->check(CLI::IsMember({"all", "default", "tuned"}));
  run->add_flag("--fake-worker", fake_worker, "workers simulate points without CUDA (tests)")->group("");
  run->add_option("--fake-delay-ms", fake_delay_ms, "with --fake-worker: milliseconds per ok point")->group("");
  bool no_counters = false;
  std::string metrics_csv;
  run->add_flag("--no-counters", no_counters, "skip the CUPTI pass (metrics null with that reason)");
  run->add_option("--metrics", metrics_csv, "extra CUPTI metrics, comma-separated (e.g. lts__t_sector_hit_rate.pct)");

  auto* ncu_cmd = app.add_subcommand("ncu-cmd", "print the ncu command line that profiles one point of a run");
  std::string ncu_variant, ncu_shape, ncu_config = "default", ncu_set = "full";
  ncu_cmd->add_option("--variant", ncu_variant, "variant")->required();
  ncu_cmd->add_option("--shape", ncu_shape, "as for run --shape")->required();
  ncu_cmd->add_option("--config", ncu_config, "one config, as for run --config");
  ncu_cmd->add_option("--set", ncu_set, "ncu section set (full, detailed, basic)");

  auto* plan_cmd = app.add_subcommand("plan", "print a spec's expanded problems as JSON (for scripts/peers.py)");
  std::string plan_spec;
  plan_cmd->add_option("spec", plan_spec, "sweep spec (YAML)")->required();

  auto* check = app.add_subcommand("check", "correctness of every variant x config on built-in awkward shapes");
  std::vector<std::string> check_only;
  check->add_option("--variant", check_only, "only these variants");
  std::string check_configs = "all";
  check->add_option("--configs", check_configs, "all (every valid config) | default (each shape's default config)")
      ->check(CLI::IsMember({"all", "default"}));

  auto* worker = app.add_subcommand("worker", "internal: measures points sent by run/tune on stdin")->group("");
  fb::WorkerOptions wopts;
  std::string worker_metrics;
  bool worker_no_counters = false;
  worker->add_option("--device", wopts.device);
  worker->add_option("--result-fd", wopts.result_fd);
  worker->add_flag("--ceilings", wopts.ceilings);
  worker->add_flag("--no-counters", worker_no_counters);
  worker->add_option("--metrics", worker_metrics);
  worker->add_flag("--fake", wopts.fake);
  worker->add_option("--fake-delay-ms", wopts.fake_delay_ms);

  auto* merge = app.add_subcommand("merge", "join shard result files (same spec, same build) into one");
  std::vector<std::string> merge_inputs;
  std::string merge_output;
  bool allow_missing = false;
  merge->add_option("inputs", merge_inputs, "shard result files")->required();
  merge->add_option("-o,--output", merge_output, "merged results file")->required();
  merge->add_flag("--allow-missing", allow_missing, "merge even when some shards are absent");

  auto* tune = app.add_subcommand("tune", "search each variant's config space per problem; write a tuning table");
  std::string tune_strategy = "halving", tune_cache, tune_report, tune_gpus_csv;
  std::vector<std::string> tune_args;
  std::string tune_output;
  double tune_budget = 0.3, tune_point_timeout = -1;
  uint64_t tune_seed = 0;
  bool tune_no_cache = false, tune_fake = false, tune_check = false;
  tune->add_option("spec", tune_args, "sweep specs (problems and variants; configs are searched), tuned one after "
                                      "another into one table; with --check, the tables to check");
  tune->add_flag("--check", tune_check, "list the entries of the given tables (default: every tuning/*.json) whose "
                                        "variant's sources changed since they were tuned; exit 1 if any, 0 if none");
  tune->add_option("-o,--output", tune_output, "tuning table (default tuning/<gpu-slug>.json in the source tree); "
                                               "entries for other buckets already there are kept");
  tune->add_option("--strategy", tune_strategy, "exhaustive | random | halving (successive halving)")
      ->check(CLI::IsMember({"exhaustive", "random", "halving"}));
  tune->add_option("--budget", tune_budget, "random/halving: evaluations per problem, in full-measurement units; "
                                            "< 1 means that fraction of the candidate configs");
  tune->add_option("--seed", tune_seed, "random strategy seed");
  tune->add_option("--cache", tune_cache, "measurement cache (default $FLASHBENCH_CACHE_DIR or ~/.cache/flashbench"
                                          "/tune-cache.jsonl)");
  tune->add_flag("--no-cache", tune_no_cache, "measure everything again and record nothing");
  tune->add_option("--report", tune_report, "also write every measurement and the search's cost as JSON");
  tune->add_option("--gpus", tune_gpus_csv, "one worker per GPU, e.g. --gpus 0,1");
  tune->add_option("--point-timeout", tune_point_timeout, "per-measurement deadline in seconds");
  tune->add_flag("--fake-worker", tune_fake, "workers simulate points without CUDA (tests)")->group("");

  auto* probe = app.add_subcommand("probe", "device facts and measured ceilings (bf16 GEMM, device copy)");
  std::string probe_out;
  probe->add_option("-o,--output", probe_out, "also write them as JSON here");
  bool probe_copy = false, probe_no_counters = false;
  probe->add_flag("--copy-kernel", probe_copy, "only the copy kernel, with its counters (the counters' sanity check)");
  std::vector<std::string> probe_read_floor;
  probe->add_option("--read-floor", probe_read_floor,
                    "only the read floor: fastest cold read of each size (bytes; K/M/G suffix = KiB/MiB/GiB; 0 = "
                    "empty kernel), comma-separated")
      ->delimiter(',');
  probe->add_flag("--no-counters", probe_no_counters, "with --copy-kernel: skip the CUPTI pass (e.g. under ncu)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "flashbench: error: %s; run 'flashbench --help'\n", e.what());
    return fb::kExitUserError;
  }

  try {
    if (*list) {
      list_catalog(list_json);
      return 0;
    }
    if (*plan_cmd) {
      const fb::SweepSpec spec = fb::load_spec(plan_spec);
      nlohmann::json j;
      j["spec"] = {{"name", spec.name}, {"path", spec.path}};
      j["problems"] = spec.problems;
      j["timing_policy"] = spec.timing;
      std::printf("%s\n", j.dump(1).c_str());
      return 0;
    }
    if (*run) {
      if (!variant.empty() && !spec_path.empty())
        throw fb::UserError("give a spec file or --variant with --shape, not both");
      if (variant.empty() && spec_path.empty())
        throw fb::UserError("nothing to run: give a spec (e.g. sweeps/quick.yaml) or --variant NAME --shape ...");
      if (!variant.empty() && shape.empty())
        throw fb::UserError("--variant needs --shape, e.g. --shape batch=1,heads=16,seqlen=4096,head_dim=128");
      fb::SweepSpec spec = spec_path.empty()
                               ? fb::parse_spec(quick_spec_yaml(variant, shape, config), "<command line>")
                               : fb::load_spec(spec_path);
      if (min_time >= 0) spec.timing.min_time_s = min_time;
      if (timeout > 0) spec.timing.timeout_s = timeout;
      if (max_noise > 0) spec.timing.max_noise = max_noise;
      const auto gpus = parse_gpus(gpus_csv);
      if (!gpus.empty()) device = gpus.front();
      bool present = false;
      const fb::DeviceInfo dev = device_or_nominal(device, &present);
      for (int g : gpus)
        if (present && !fake_worker && g >= fb::device_count())
          throw fb::UserError("--gpus " + gpus_csv + ": there is no GPU " + std::to_string(g) + " (this machine has " +
                              std::to_string(fb::device_count()) + ")");
      if (!configs_override.empty())
        for (auto& sel : spec.variants) {
          sel.mode = configs_override == "all"       ? fb::VariantSelection::Mode::all
                     : configs_override == "tuned" ? fb::VariantSelection::Mode::tuned
                                                   : fb::VariantSelection::Mode::default_config;
          sel.configs.clear();
        }
      if (point_timeout > 0) spec.timing.point_timeout_s = point_timeout;
      const auto [shard_index, shard_count] = shard_text.empty() ? std::pair{0, 1} : fb::parse_shard(shard_text);
      present = present || fake_worker;
      const auto points = fb::plan(spec, fb::catalog(), dev); // unknown variants/configs fail here, before output
      if (dry_run || !present) {
        if (!present && !dry_run)
          std::fprintf(stderr, "flashbench: no CUDA device found; nothing was run. The plan (with nominal H100 "
                               "limits) follows; run on a machine with an NVIDIA GPU to measure.\n");
        fb::print_plan(std::cout, spec, points, dev);
        return present || dry_run ? 0 : kExitNoDevice;
      }
      fb::RunOptions opts;
      opts.output_path = output;
      opts.device = device;
      opts.measure_ceilings = !no_ceilings;
      opts.verbose = verbose;
      opts.gpus = gpus;
      opts.shard_index = shard_index;
      opts.shard_count = shard_count;
      opts.resume = resume;
      opts.fake_worker = fake_worker;
      opts.fake_delay_ms = fake_delay_ms;
      opts.counters = !no_counters;
      std::istringstream ms(metrics_csv);
      for (std::string m; std::getline(ms, m, ',');)
        if (!m.empty()) opts.extra_metrics.push_back(m);
      return fb::run_sweep(spec, opts);
    }
    if (*ncu_cmd) {
      if (ncu_config == "all") throw fb::UserError("ncu-cmd profiles one point: give one --config, not 'all'");
      const fb::SweepSpec spec = fb::parse_spec(quick_spec_yaml(ncu_variant, ncu_shape, ncu_config), "<command line>");
      const auto points = fb::plan(spec, fb::catalog(), fb::nominal_device());
      if (points.size() != 1) throw fb::UserError("ncu-cmd needs exactly one point; the shape expands to " +
                                                  std::to_string(points.size()));
      fb::Result r;
      r.variant = points[0].variant->name();
      r.config_str = points[0].variant->space().to_string(points[0].config);
      r.problem = points[0].problem;
      // One kernel per call for most variants; multi-kernel ones (naive: cuBLAS GEMMs + softmax) need a larger
      // --launch-count to cover a whole call.
      std::printf("ncu --nvtx --nvtx-include 'flashbench@%s/time/' --launch-count 1 --cache-control all "
                  "--clock-control none --set %s -o %s \\\n    %s run --variant %s --shape %s --config %s "
                  "--no-counters --no-ceilings --timeout 2 -o /tmp/flashbench-ncu.json\n",
                  fb::nvtx_name(r).c_str(), ncu_set.c_str(), r.variant.c_str(), argv[0], r.variant.c_str(),
                  ncu_shape.c_str(), ncu_config.c_str());
      return 0;
    }
    if (*check) {
      for (const auto& n : check_only) fb::catalog().get(n); // unknown names are user errors
      if (fb::device_count() <= device) {
        std::fprintf(stderr, "flashbench: no CUDA device found; 'check' needs a GPU\n");
        return kExitNoDevice;
      }
      return fb::run_check(device, check_only, std::cout, check_configs == "default");
    }
    if (*worker) {
      wopts.counters = !worker_no_counters;
      std::istringstream ms(worker_metrics);
      for (std::string m; std::getline(ms, m, ',');)
        if (!m.empty()) wopts.extra_metrics.push_back(m);
      return fb::run_worker(wopts);
    }
    if (*merge) {
      fb::merge_results(merge_inputs, merge_output, allow_missing, std::cout);
      return 0;
    }
    if (*tune) {
      if (tune_check) return fb::check_tuning_tables(tune_args, std::cout);
      if (tune_args.empty())
        throw fb::UserError("tune: give a sweep spec (e.g. sweeps/tune/prefill.yaml), or --check [TABLE...]");
      fb::TuneOptions t;
      t.strategy = tune_strategy;
      t.budget = tune_budget;
      t.seed = tune_seed;
      t.output_path = tune_output;
      t.report_path = tune_report;
      t.cache_path = tune_no_cache ? "" : (tune_cache.empty() ? fb::default_cache_path() : tune_cache);
      t.gpus = parse_gpus(tune_gpus_csv);
      if (t.gpus.empty()) t.gpus = {device};
      t.fake_worker = tune_fake;
      std::vector<fb::SweepSpec> specs; // every spec parsed before anything is measured
      for (const auto& path : tune_args) {
        specs.push_back(fb::load_spec(path));
        if (tune_point_timeout > 0) specs.back().timing.point_timeout_s = tune_point_timeout;
      }
      if (!tune_fake && fb::device_count() <= t.gpus.front()) {
        std::fprintf(stderr, "flashbench: no CUDA device found; 'tune' needs a GPU\n");
        return kExitNoDevice;
      }
      // Several specs tune into the same table, one after another (each keeps its own timing policy).
      int code = 0;
      for (const auto& spec : specs) code = std::max(code, fb::run_tune(spec, t, std::cout));
      return code;
    }
    if (*probe) {
      std::vector<size_t> read_sizes;
      for (const auto& t : probe_read_floor) read_sizes.push_back(parse_byte_size(t, "--read-floor"));
      if (fb::device_count() <= device) {
        std::fprintf(stderr, "flashbench: no CUDA device found; 'probe' needs a GPU\n");
        return kExitNoDevice;
      }
      FB_CUDA_CHECK(cudaSetDevice(device));
      const fb::DeviceInfo dev = fb::query_device(device);
      nlohmann::json j;
      j["device"] = dev;
      if (!probe_read_floor.empty()) {
        j["read_floor"] = fb::measure_read_floor(dev, read_sizes);
      } else if (probe_copy) {
        const fb::CopyProbe cp = fb::run_copy_probe(dev, size_t(1) << 30, !probe_no_counters);
        j["copy_kernel"] = {{"bytes_each_way", cp.bytes}, {"median_us", cp.median_us}, {"gbps", cp.gbps},
                            {"occupancy", cp.occupancy}, {"counters", fb::summarize_counters(cp.counters)},
                            {"counters_reason", cp.counters.reason}};
      } else {
        j["ceilings"] = fb::measure_ceilings(dev);
      }
      std::printf("%s\n", j.dump(2).c_str());
      if (!probe_out.empty()) {
        std::ofstream os(probe_out);
        if (!os) throw fb::UserError("cannot write " + probe_out + "; check the directory");
        os << j.dump(2) << "\n";
      }
      return 0;
    }
  } catch (const fb::UserError& e) {
    std::fprintf(stderr, "flashbench: error: %s\n", e.what());
    return fb::kExitUserError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashbench: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
