#include "flashbench/sweep.hpp"

#include "flashbench/check.hpp"
#include "flashbench/counters.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/nvtx.hpp"
#include "flashbench/probe.hpp"
#include "flashbench/results.hpp"
#include "point_runner.hpp"

#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <sstream>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <map>
#include <memory>
#include <algorithm>
#include <unistd.h>

namespace fb {

namespace {

// Seconds a single verification launch may run before the point is declared hung.
constexpr double kLaunchDeadlineS = 120.0;

std::string iso_date() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", std::localtime(&t));
  return buf;
}

nlohmann::json base_context(const SweepSpec& spec, const DeviceInfo& dev) {
  nlohmann::json c;
  // Google Benchmark's own context fields, so its tools recognise the file.
  c["date"] = iso_date();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  c["host_name"] = host;
  std::error_code ec;
  c["executable"] = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  const auto& cpu = benchmark::CPUInfo::Get();
  c["num_cpus"] = cpu.num_cpus;
  c["mhz_per_cpu"] = static_cast<int>(cpu.cycles_per_second / 1e6);
  c["cpu_scaling_enabled"] = cpu.scaling == benchmark::CPUInfo::ENABLED;
  c["caches"] = nlohmann::json::array();
  c["load_avg"] = cpu.load_avg;
  c["library_build_type"] = "release";
  c["schema_version"] = kSchemaVersion;
  c["flashbench"] = {{"version", FLASHBENCH_VERSION}, {"git_sha", FLASHBENCH_GIT_SHA}};
  c["spec"] = {{"name", spec.name}, {"path", spec.path}};
  c["device"] = dev;
  c["timing_policy"] = spec.timing;
  c["ceilings"] = nullptr;
  return c;
}

Result make_result(const PlannedPoint& pt) {
  Result r;
  r.variant = pt.variant->name();
  r.config = pt.config;
  r.config_str = pt.variant->space().to_string(pt.config);
  r.config_json = pt.variant->space().to_json(pt.config);
  r.problem = pt.problem;
  r.flops = flops(pt.problem);
  r.bytes_min = min_bytes(pt.problem);
  r.bytes_model = pt.variant->model_bytes(pt.problem, pt.config);
  if (pt.skip_reason) {
    r.status = Status::skipped;
    r.reason = *pt.skip_reason;
  }
  return r;
}

std::string human(double x, const char* unit) {
  std::ostringstream os;
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::abs(x) >= 1000 && i < 5) {
    x /= 1000;
    ++i;
  }
  os << std::fixed << std::setprecision(x < 10 ? 2 : 1) << x << " " << prefixes[i] << unit;
  return os.str();
}

void print_summary(const std::vector<Result>& results) {
  std::printf("\n%-14s %-44s %-40s %-9s %11s %8s %7s\n", "variant", "config", "problem", "status",
              "median_us", "TFLOPs", "cv%");
  for (const Result& r : results) {
    const std::string cfg = r.config_str.size() > 44 ? r.config_str.substr(0, 41) + "..." : r.config_str;
    if (r.status == Status::ok && r.timing)
      std::printf("%-14s %-44s %-40s %-9s %11.2f %8.2f %7.2f%s\n", r.variant.c_str(), cfg.c_str(),
                  key(r.problem).c_str(), "ok", r.timing->median_us, r.tflops(), r.timing->cv * 100,
                  r.timing->noisy ? " noisy" : "");
    else
      std::printf("%-14s %-44s %-40s %-9s %s\n", r.variant.c_str(), cfg.c_str(), key(r.problem).c_str(),
                  to_string(r.status), r.reason.substr(0, 120).c_str());
  }
}

} // namespace

std::string nvtx_name(const Result& r) {
  // NVTX filters in Nsight use '/' to separate nested ranges, so the point's range name uses ':' instead.
  std::string n = r.name();
  std::replace(n.begin(), n.end(), '/', ':');
  return n;
}

namespace {

// The profile pass: CUPTI counters over one cold launch (a pass of its own, after timing), and the theoretical
// occupancy of each kernel the variant lists.
void measure_counters_and_occupancy(Result& r, const PlannedPoint& pt, const LaunchArgs& args,
                                    CounterSession* counters, Timer& timer, const DeviceInfo& dev,
                                    cudaStream_t stream) {
  ScopedRange range{"profile"};
  for (const KernelDesc& k : pt.variant->kernels(pt.problem, pt.config)) r.occupancy.push_back(theoretical_occupancy(dev, k));
  if (!counters) return;
  r.counters = counters->profile(
      r.name(), [&](cudaStream_t s) { pt.variant->launch(pt.problem, pt.config, args, s); },
      [&] { timer.flush_l2(); }, stream);
}

// Console output from Google Benchmark, minus its own context banner (flashbench prints the device instead).
class QuietConsoleReporter : public benchmark::ConsoleReporter {
public:
  bool ReportContext(const Context&) override { return true; }
};

} // namespace

void print_plan(std::ostream& os, const SweepSpec& spec, const std::vector<PlannedPoint>& points,
                const DeviceInfo& dev) {
  os << "plan for " << spec.name << " (" << spec.path << ") on " << dev.name << "\n";
  os << "  " << spec.problems.size() << " problems, " << points.size() << " points\n";
  struct Tally {
    int run = 0, skipped = 0;
    double flops = 0, bytes = 0;
  };
  std::map<std::string, Tally> per_variant;
  std::vector<std::string> order;
  for (const auto& pt : points) {
    const std::string n = pt.variant->name();
    if (!per_variant.count(n)) order.push_back(n);
    Tally& t = per_variant[n];
    if (pt.skip_reason) {
      ++t.skipped;
    } else {
      ++t.run;
      t.flops += flops(pt.problem);
      t.bytes += pt.variant->model_bytes(pt.problem, pt.config);
    }
  }
  for (const auto& n : order) {
    const Tally& t = per_variant[n];
    os << "  " << std::left << std::setw(16) << n << std::right << std::setw(5) << t.run << " to run, "
       << std::setw(5) << t.skipped << " skipped; " << human(t.flops, "FLOP") << ", model traffic "
       << human(t.bytes, "B") << "\n";
  }
  os << "points:\n";
  for (const auto& pt : points) {
    os << "  " << (pt.skip_reason ? "skip " : "run  ") << pt.variant->name() << "/"
       << pt.variant->space().to_string(pt.config) << "/" << key(pt.problem) << "  "
       << human(flops(pt.problem), "FLOP") << ", min " << human(min_bytes(pt.problem), "B") << ", model "
       << human(pt.variant->model_bytes(pt.problem, pt.config), "B");
    if (pt.skip_reason) os << "  (" << *pt.skip_reason << ")";
    os << "\n";
  }
}

int run_sweep(const SweepSpec& spec, const RunOptions& opts) {
  FB_CUDA_CHECK(cudaSetDevice(opts.device));
  const DeviceInfo dev = query_device(opts.device);
  const std::vector<PlannedPoint> points = plan(spec, catalog(), dev);
  std::printf("flashbench %s (%s) on %s, SM %d.%d, %d SMs, driver %s, CUDA runtime %d\n", FLASHBENCH_VERSION,
              FLASHBENCH_GIT_SHA, dev.name.c_str(), dev.cc_major, dev.cc_minor, dev.sm_count,
              dev.driver_version_string.c_str(), dev.runtime_version);

  nlohmann::json context = base_context(spec, dev);
  std::vector<std::string> metrics = default_metrics();
  for (const auto& m : opts.extra_metrics)
    if (std::find(metrics.begin(), metrics.end(), m) == metrics.end()) metrics.push_back(m);
  std::unique_ptr<CounterSession> counters;
  if (opts.counters) {
    counters = std::make_unique<CounterSession>(dev, metrics); // unknown metric names throw UserError here
    if (!counters->available())
      std::fprintf(stderr, "flashbench: warning: hardware counters unavailable (%s); metrics will be null\n",
                   counters->reason().c_str());
    context["counters"] = {{"metrics", metrics}, {"available", counters->available()},
                           {"passes", counters->passes()}, {"reason", counters->reason()}};
  }
  if (opts.measure_ceilings) {
    try {
      const Ceilings c = measure_ceilings(dev);
      context["ceilings"] = c;
      std::printf("ceilings: bf16 GEMM %.0f TFLOP/s, device copy %.0f GB/s (read+write)\n", c.gemm_bf16_tflops,
                  c.copy_gbps);
    } catch (const std::exception& e) {
      context["ceilings_reason"] = e.what();
      std::fprintf(stderr, "flashbench: warning: ceilings not measured: %s\n", e.what());
    }
  }

  std::vector<Result> results;
  results.reserve(points.size());
  for (const auto& pt : points) results.push_back(make_result(pt));
  ResultLog log(opts.output_path + ".partial.jsonl");
  std::filesystem::remove(log.path());

  cudaStream_t stream;
  FB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  PointRunner runner(dev, stream);
  Timer timer(dev, stream);
  std::string context_lost; // set after a sticky error or a hung kernel: nothing more can run in this process

  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].skip_reason) {
      log.append(results[i]);
      continue;
    }
    const std::string name = results[i].name();
    benchmark::RegisterBenchmark(name.c_str(), [&, i](benchmark::State& state) {
      Result& r = results[i];
      const PlannedPoint& pt = points[i];
      for (auto _ : state) {
        if (!context_lost.empty()) {
          r.status = Status::crashed;
          r.reason = "not run: " + context_lost;
          state.SkipWithError(r.reason.c_str());
          break;
        }
        ScopedRange point_range{nvtx_name(r).c_str()};
        try {
          runner.prepare(pt.problem);
          r.seed = runner.seed();
          VerifyResult v = runner.verify(*pt.variant, pt.config, kLaunchDeadlineS);
          r.verification = v;
          if (!v.pass) {
            r.status = Status::incorrect;
            r.reason = v.summary();
            state.SkipWithError(("incorrect: " + r.reason).c_str());
            break;
          }
          const LaunchArgs args = runner.args();
          TimingStats t = timer.measure(
              [&](cudaStream_t s) { pt.variant->launch(pt.problem, pt.config, args, s); }, spec.timing);
          r.timing = t;
          r.status = Status::ok;
          if (t.noisy) r.reason = "noise target not met: cv " + std::to_string(t.cv * 100) + "%";
          state.SetIterationTime(t.median_us * 1e-6);
          state.counters["TFLOPs"] = r.tflops();
          state.counters["cv_pct"] = t.cv * 100;
          state.counters["samples"] = static_cast<double>(t.samples_us.size());
          state.counters["sm_MHz"] = t.sm_clock_mhz;
          measure_counters_and_occupancy(r, pt, args, counters.get(), timer, dev, stream);
        } catch (const PointTimeout& e) {
          r.status = Status::timeout;
          r.reason = e.what();
          context_lost = "an earlier point (" + r.name() + ") hung";
          state.SkipWithError(r.reason.c_str());
        } catch (const CudaError& e) {
          if (e.code() == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            r.status = Status::skipped;
            r.reason = std::string("out of device memory: ") + e.what();
          } else {
            r.status = Status::crashed;
            r.reason = e.what();
            if (e.sticky()) context_lost = "the CUDA context was lost at " + r.name() + " (" + e.what() + ")";
          }
          state.SkipWithError(r.reason.c_str());
        } catch (const std::exception& e) {
          r.status = Status::crashed;
          r.reason = e.what();
          state.SkipWithError(r.reason.c_str());
        }
      }
      log.append(r);
    })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }

  int argc = 1;
  char arg0[] = "flashbench";
  char* argv[] = {arg0, nullptr};
  benchmark::Initialize(&argc, argv);
  QuietConsoleReporter console;
  benchmark::RunSpecifiedBenchmarks(&console);
  benchmark::ClearRegisteredBenchmarks();
  cudaStreamDestroy(stream);

  write_results_file(opts.output_path, context, results);
  std::filesystem::remove(log.path());
  print_summary(results);
  int bad = 0, ok = 0, skipped = 0;
  for (const Result& r : results) {
    if (r.status == Status::ok) ++ok;
    else if (r.status == Status::skipped) ++skipped;
    else ++bad;
  }
  std::printf("\n%d ok, %d skipped, %d incorrect/crashed/timeout; results in %s\n", ok, skipped, bad,
              opts.output_path.c_str());
  return bad ? 1 : 0;
}

} // namespace fb
