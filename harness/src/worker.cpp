#include "worker.hpp"

#include "flashbench/check.hpp"
#include "flashbench/counters.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/nvtx.hpp"
#include "flashbench/options.hpp"
#include "flashbench/probe.hpp"
#include "flashbench/sweep.hpp"
#include "point_runner.hpp"
#include "supervisor.hpp"

#include <benchmark/benchmark.h>

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <thread>

namespace fb {

Result make_result(const PlannedPoint &pt) {
  Result r;
  r.variant = pt.variant->name();
  r.config = pt.config;
  r.config_str = pt.variant->space().to_string(pt.config);
  r.config_json = pt.variant->space().to_json(pt.config);
  r.problem = pt.problem;
  r.flops = flops(pt.problem);
  r.bytes_min = min_bytes(pt.problem);
  r.bytes_model =
      pt.model_bytes >= 0 ? pt.model_bytes : pt.variant->model_bytes(pt.problem, pt.config);
  r.bytes_model_reason = pt.model_reason;
  r.bytes_model_low = pt.model_low;
  r.bytes_model_high = pt.model_high;
  if (pt.skip_reason) {
    r.status = Status::skipped;
    r.reason = *pt.skip_reason;
  }
  return r;
}

nlohmann::json task_payload(const PlannedPoint &pt, const TimingPolicy &timing,
                            double launch_deadline_s) {
  nlohmann::json j;
  j["variant"] = pt.variant->name();
  j["config"] = pt.config.params();
  j["problem"] = pt.problem;
  j["timing"] = timing;
  j["launch_deadline_s"] = launch_deadline_s;
  j["model_bytes"] = pt.model_bytes;
  j["model_reason"] = pt.model_reason;
  j["model_low"] = pt.model_low;
  j["model_high"] = pt.model_high;
  return j;
}

PlannedPoint point_from_task(const nlohmann::json &task) {
  PlannedPoint pt;
  pt.variant = &catalog().get(task.at("variant").get<std::string>());
  pt.config = Config(task.at("config").get<std::map<std::string, int64_t>>());
  pt.problem = task.at("problem").get<AttentionProblem>();
  pt.model_bytes = task.value("model_bytes", -1.0);
  pt.model_reason = task.value("model_reason", std::string());
  pt.model_low = task.value("model_low", -1.0);
  pt.model_high = task.value("model_high", -1.0);
  return pt;
}

namespace {

TimingPolicy timing_from_json(const nlohmann::json &j) {
  TimingPolicy t;
  t.min_samples = j.value("min_samples", t.min_samples);
  t.max_noise = j.value("max_noise", t.max_noise);
  t.min_time_s = j.value("min_time_s", t.min_time_s);
  t.timeout_s = j.value("timeout_s", t.timeout_s);
  t.max_samples = j.value("max_samples", t.max_samples);
  t.cold = j.value("cold", t.cold);
  t.flush = j.value("flush", t.flush);
  t.settle_s = j.value("settle_s", t.settle_s);
  t.warmup_runs = j.value("warmup_runs", t.warmup_runs);
  t.throttle_fraction = j.value("throttle_fraction", t.throttle_fraction);
  t.point_timeout_s = j.value("point_timeout_s", t.point_timeout_s);
  t.queue = j.value("queue", t.queue);
  return t;
}

class Channel {
public:
  explicit Channel(int fd) : fd_(fd) {}
  void send(const nlohmann::json &m) const {
    const std::string line = m.dump() + "\n";
    size_t off = 0;
    while (off < line.size()) {
      const ssize_t n = ::write(fd_, line.data() + off, line.size() - off);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        std::_Exit(1); // the parent is gone
      off += static_cast<size_t>(n);
    }
  }

private:
  int fd_;
};

// Everything one point needs that outlives it, in one worker.
struct PointContext {
  const DeviceInfo &dev;
  cudaStream_t stream;
  PointRunner &runner;
  Timer &timer;
  CounterSession *counters;
  std::function<void(const char *)> phase;
};

// FLASHBENCH_TEST_SLOWDOWN=VARIANT:FRACTION (flashbench/options.hpp): each timed sample of VARIANT gets a GPU spin
// queued after the launch, sized so that the sample takes (1 + FRACTION) x as long: a known, small slowdown (a few
// percent, not a doubling) for testing a regression gate end to end. Calibrated per point from a few samples with
// and without an empty spin, so that the spin's own launch gap counts towards the fraction. Returns the record's
// "test_slowdown" object; the spin to add is in *spin_ns.
nlohmann::json calibrate_test_slowdown(Timer &timer,
                                       const std::function<void(cudaStream_t)> &launch,
                                       double fraction, bool cold, double *spin_ns) {
  constexpr int kSamples = 7;
  auto median_of = [&](const std::function<void(cudaStream_t)> &f) {
    std::vector<double> v;
    for (int i = 0; i < 3 * kSamples && static_cast<int>(v.size()) < kSamples; ++i)
      if (const double us = timer.sample_us(f, cold); us > 0)
        v.push_back(us);
    if (v.empty())
      return 0.0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const double base_us = median_of(launch);
  const double with_empty_spin_us = median_of([&](cudaStream_t s) {
    launch(s);
    gpu_spin(s, 0);
  });
  const double overhead_us = std::max(0.0, with_empty_spin_us - base_us);
  *spin_ns = slowdown_spin_ns(base_us, overhead_us, fraction);
  return {{"fraction", fraction},
          {"calibration_base_us", base_us},
          {"spin_overhead_us", overhead_us},
          {"spin_ns", *spin_ns},
          {"expected_fraction", base_us > 0 ? (overhead_us + *spin_ns * 1e-3) / base_us : 0.0}};
}

// The profile pass: CUPTI counters over one cold launch (a pass of its own, after timing), and the theoretical
// occupancy of each kernel the variant lists.
void measure_counters_and_occupancy(Result &r, const PlannedPoint &pt, const LaunchArgs &args,
                                    CounterSession *counters, Timer &timer, const DeviceInfo &dev,
                                    cudaStream_t stream) {
  ScopedRange range{"profile"};
  for (const KernelDesc &k : pt.variant->kernels(pt.problem, pt.config))
    r.occupancy.push_back(theoretical_occupancy(dev, k));
  if (!counters)
    return;
  r.counters = counters->profile(
      r.name(), [&](cudaStream_t s) { pt.variant->launch(pt.problem, pt.config, args, s); },
      [&] { timer.flush_l2(); }, stream);
}

// Measures one point: verify, then time, then counters. Fills r (status, reason, verification, timing, counters).
// Returns true when the CUDA context can no longer be trusted (sticky error, hung launch): the worker must exit.
bool measure_point(Result &r, const PlannedPoint &pt, const TimingPolicy &timing,
                   double launch_deadline_s, PointContext &ctx, nlohmann::json &extra) {
  ScopedRange point_range{nvtx_name(r).c_str()};
  try {
    ctx.phase("prepare");
    ctx.runner.prepare(pt.problem);
    r.seed = ctx.runner.seed();
    ctx.phase("verify");
    const VerifyResult v = ctx.runner.verify(*pt.variant, pt.config, launch_deadline_s);
    r.verification = v;
    if (!v.pass) {
      r.status = Status::incorrect;
      r.reason = v.summary();
      return false;
    }
    ctx.phase("time");
    const LaunchArgs args = ctx.runner.args();
    const auto launch = [&](cudaStream_t s) { pt.variant->launch(pt.problem, pt.config, args, s); };
    double spin_ns = 0;
    if (const double f = env_options().slowdown_for(pt.variant->name()); f > 0)
      extra["test_slowdown"] = calibrate_test_slowdown(ctx.timer, launch, f, timing.cold, &spin_ns);
    TimingStats t = spin_ns > 0 ? ctx.timer.measure(
                                      [&](cudaStream_t s) {
                                        launch(s);
                                        gpu_spin(s, spin_ns);
                                      },
                                      timing)
                                : ctx.timer.measure(launch, timing);
    r.timing = t;
    r.status = Status::ok;
    if (t.noisy)
      r.reason = "noise target not met: cv " + std::to_string(t.cv * 100) + "%";
    ctx.phase("counters");
    measure_counters_and_occupancy(r, pt, args, ctx.counters, ctx.timer, ctx.dev, ctx.stream);
    return false;
  } catch (const PointTimeout &e) {
    r.status = Status::timeout;
    r.reason = e.what();
    r.timing.reset();
    return true;
  } catch (const CudaError &e) {
    r.timing.reset();
    if (e.code() == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      r.status = Status::skipped;
      r.reason = std::string("out of device memory: ") + e.what();
      return false;
    }
    r.status = Status::crashed;
    r.reason = e.what();
    // Sticky errors poison the context; an error not on that list still counts as lost when the device no
    // longer synchronises cleanly, so the next point never inherits it.
    return e.sticky() || cudaDeviceSynchronize() != cudaSuccess;
  } catch (const std::exception &e) {
    // A config the variant rejects at launch, or a host-side failure: this point only.
    r.timing.reset();
    r.status = Status::crashed;
    r.reason = e.what();
    return false;
  }
}

// Deterministic per point, so that fake runs compare exactly.
uint64_t name_hash(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

bool fake_measure(Result &r, const PlannedPoint &pt, int delay_ms, const Channel &ch, size_t id,
                  CounterSession *counters) {
  r.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  if (pt.variant->name() == "test_faults") {
    switch (pt.config.get_or("fault", 0)) {
    case 1:
      r.status = Status::crashed;
      r.reason = "CUDA error cudaErrorIllegalAddress (an illegal memory access was encountered) "
                 "[simulated by a "
                 "fake worker]";
      return true;
    case 2:
      ch.send({{"type", "phase"}, {"id", id}, {"phase", "verify"}});
      std::abort();
    case 3:
      ch.send({{"type", "phase"}, {"id", id}, {"phase", "verify"}});
      for (;;)
        std::this_thread::sleep_for(std::chrono::seconds(1));
    default:
      break;
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  const double us = 10.0 + static_cast<double>(name_hash(r.name()) % 100000) / 10.0;
  r.timing = summarize(std::vector<double>(10, us));
  r.timing->stop_reason = "fake";
  r.status = Status::ok;
  if (counters)
    r.counters = counters->profile(
        r.name(), [](cudaStream_t) {}, [] {}, nullptr);
  return false;
}

// Console output from Google Benchmark, minus its own context banner (the parent prints the device instead).
class QuietConsoleReporter : public benchmark::ConsoleReporter {
public:
  bool ReportContext(const Context &) override { return true; }
};

} // namespace

namespace {
// A worker that dies on a signal leaves the parent only the signal number; this prints where (a raw backtrace to
// stderr, async-signal-safe) before the default action ends the process.
void print_backtrace_and_die(int sig) {
  void *frames[64];
  const int n = backtrace(frames, 64);
  const char msg[] = "flashbench worker: fatal signal, backtrace:\n";
  (void)!write(2, msg, sizeof(msg) - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
} // namespace

int run_worker(const WorkerOptions &o) {
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT})
    signal(sig, print_backtrace_and_die);
  const Channel ch(o.result_fd);
  nlohmann::json hello = {
      {"type", "hello"}, {"pid", ::getpid()}, {"fake", o.fake}, {"gpu", o.device}};

  // CUDA state (absent in fake mode).
  DeviceInfo dev = nominal_device();
  cudaStream_t stream = nullptr;
  std::unique_ptr<PointRunner> runner;
  std::unique_ptr<Timer> timer;
  std::unique_ptr<CounterSession> counters;
  if (o.fake && o.counters) {
    // The fake worker has no device, so its counters are unavailable with a reason (or the simulated CUPTI failure):
    // the CPU tests use it to check that records stay complete, with null metrics, when counters cannot be read.
    counters = std::make_unique<CounterSession>(dev, default_metrics());
    hello["counters"] = {{"metrics", counters->metrics()},
                         {"available", counters->available()},
                         {"passes", counters->passes()},
                         {"reason", counters->reason()}};
  }
  if (!o.fake) {
    FB_CUDA_CHECK(cudaSetDevice(o.device));
    dev = query_device(o.device);
    FB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    runner = std::make_unique<PointRunner>(dev, stream);
    timer = std::make_unique<Timer>(dev, stream);
    std::vector<std::string> metrics = default_metrics();
    for (const auto &m : o.extra_metrics)
      if (std::find(metrics.begin(), metrics.end(), m) == metrics.end())
        metrics.push_back(m);
    if (o.counters) {
      counters = std::make_unique<CounterSession>(
          dev, metrics); // unknown metric names throw UserError here
      hello["counters"] = {{"metrics", metrics},
                           {"available", counters->available()},
                           {"passes", counters->passes()},
                           {"reason", counters->reason()}};
    }
    if (o.ceilings) {
      try {
        hello["ceilings"] = measure_ceilings(dev);
      } catch (const CudaError &e) {
        hello["ceilings_reason"] = e.what();
        if (e.sticky())
          throw;
      } catch (const std::exception &e) {
        hello["ceilings_reason"] = e.what();
      }
    }
  }
  hello["device"] = dev;
  ch.send(hello);

  int argc = 1;
  char arg0[] = "flashbench";
  char *argv[] = {arg0, nullptr};
  benchmark::Initialize(&argc, argv);
  QuietConsoleReporter console;

  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty())
      continue;
    const nlohmann::json task = nlohmann::json::parse(line);
    const size_t id = task.at("id").get<size_t>();
    ch.send({{"type", "phase"}, {"id", id}, {"phase", "start"}});
    const PlannedPoint pt = point_from_task(task);
    const TimingPolicy timing = timing_from_json(task.value("timing", nlohmann::json::object()));
    const double deadline = task.value("launch_deadline_s", 120.0);
    Result r = make_result(pt);
    nlohmann::json extra = nlohmann::json::object(); // record fields beyond Result's
    bool lost = false;
    if (o.fake) {
      lost = fake_measure(r, pt, o.fake_delay_ms, ch, id, counters.get());
    } else {
      PointContext ctx{dev, stream, *runner, *timer, counters.get(), [&](const char *phase) {
                         ch.send({{"type", "phase"}, {"id", id}, {"phase", phase}});
                       }};
      // Google Benchmark owns the loop (one registered benchmark per point, manual time), so its console and
      // JSON conventions hold; the point itself is measured by measure_point().
      benchmark::RegisterBenchmark(
          r.name().c_str(),
          [&](benchmark::State &state) {
            for (auto _ : state) {
              lost = measure_point(r, pt, timing, deadline, ctx, extra);
              if (r.status != Status::ok || !r.timing) {
                state.SkipWithError((std::string(to_string(r.status)) + ": " + r.reason).c_str());
                break;
              }
              state.SetIterationTime(r.timing->median_us * 1e-6);
              state.counters["TFLOPs"] = r.tflops();
              state.counters["cv_pct"] = r.timing->cv * 100;
              state.counters["samples"] = static_cast<double>(r.timing->samples_us.size());
              state.counters["sm_MHz"] = r.timing->sm_clock_mhz;
            }
          })
          ->Iterations(1)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RunSpecifiedBenchmarks(&console);
      benchmark::ClearRegisteredBenchmarks();
    }
    nlohmann::json rec = to_json(r);
    rec.update(extra);
    ch.send({{"type", "result"}, {"id", id}, {"record", rec}, {"exiting", lost}});
    if (lost) {
      // Nothing more can run in this context; tearing it down could hang too, so leave at once.
      std::fflush(nullptr);
      std::_Exit(kExitContextLost);
    }
  }
  if (stream)
    cudaStreamDestroy(stream);
  return 0;
}

} // namespace fb
