#include "flashbench/sweep.hpp"
#include "flashbench/version.hpp"

#include "flashbench/check.hpp"
#include "flashbench/counters.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/machine.hpp"
#include "flashbench/nvtx.hpp"
#include "flashbench/options.hpp"
#include "flashbench/probe.hpp"
#include "flashbench/results.hpp"
#include "flashbench/tuner.hpp"
#include "supervisor.hpp"
#include "worker.hpp"

#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <unistd.h>

namespace fb {

namespace {

std::string iso_date() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", std::localtime(&t));
  return buf;
}

nlohmann::json base_context(const SweepSpec &spec, const DeviceInfo &dev) {
  nlohmann::json c;
  // Google Benchmark's own context fields, so its tools recognise the file.
  c["date"] = iso_date();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  c["host_name"] = host;
  std::error_code ec;
  c["executable"] = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  const auto &cpu = benchmark::CPUInfo::Get();
  c["num_cpus"] = cpu.num_cpus;
  c["mhz_per_cpu"] = static_cast<int>(cpu.cycles_per_second / 1e6);
  c["cpu_scaling_enabled"] = cpu.scaling == benchmark::CPUInfo::ENABLED;
  c["caches"] = nlohmann::json::array();
  c["load_avg"] = cpu.load_avg;
  c["library_build_type"] = "release";
  c["schema_version"] = kSchemaVersion;
  c["flashbench"] = {{"version", version()}, {"git_sha", git_sha()}};
  c["spec"] = {{"name", spec.name}, {"path", spec.path}};
  c["device"] = dev;
  c["timing_policy"] = spec.timing;
  c["ceilings"] = nullptr;
  c["options"] = env_options();
  return c;
}

std::string human(double x, const char *unit) {
  std::ostringstream os;
  const char *prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::abs(x) >= 1000 && i < 5) {
    x /= 1000;
    ++i;
  }
  os << std::fixed << std::setprecision(x < 10 ? 2 : 1) << x << " " << prefixes[i] << unit;
  return os.str();
}

void print_summary(const std::vector<nlohmann::json> &records) {
  std::printf("\n%-14s %-44s %-40s %-9s %11s %8s %7s\n", "variant", "config", "problem", "status",
              "median_us", "TFLOPs", "cv%");
  for (const auto &j : records) {
    std::string cfg = j.value("config_str", "");
    if (cfg.size() > 44)
      cfg = cfg.substr(0, 41) + "...";
    const std::string status = j.value("status", "?");
    const std::string problem =
        j.contains("problem") ? key(j["problem"].get<AttentionProblem>()) : "?";
    if (status == "ok" && j.value("median_us", nlohmann::json()).is_number())
      std::printf("%-14s %-44s %-40s %-9s %11.2f %8.2f %7.2f%s\n", j.value("variant", "").c_str(),
                  cfg.c_str(), problem.c_str(), "ok", j["median_us"].get<double>(),
                  j.value("tflops", 0.0), j.value("cv", 0.0) * 100,
                  j.value("noisy", false) ? " noisy" : "");
    else
      std::printf("%-14s %-44s %-40s %-9s %s\n", j.value("variant", "").c_str(), cfg.c_str(),
                  problem.c_str(), status.c_str(), j.value("reason", "").substr(0, 120).c_str());
  }
}

} // namespace

std::string nvtx_name(const Result &r) {
  // NVTX filters in Nsight use '/' to separate nested ranges, so the point's range name uses ':' instead.
  std::string n = r.name();
  std::replace(n.begin(), n.end(), '/', ':');
  std::replace(n.begin(), n.end(), ',',
               '+'); // ncu's --nvtx-include did not match names with commas
  return n;
}

void print_plan(std::ostream &os, const SweepSpec &spec, const std::vector<PlannedPoint> &points,
                const DeviceInfo &dev) {
  os << "plan for " << spec.name << " (" << spec.path << ") on " << dev.name << "\n";
  os << "  " << spec.problems.size() << " problems, " << points.size() << " points\n";
  struct Tally {
    int run = 0, skipped = 0;
    double flops = 0, bytes = 0;
  };
  std::map<std::string, Tally> per_variant;
  std::vector<std::string> order;
  for (const auto &pt : points) {
    const std::string n = pt.variant->name();
    if (!per_variant.count(n))
      order.push_back(n);
    Tally &t = per_variant[n];
    if (pt.skip_reason) {
      ++t.skipped;
    } else {
      ++t.run;
      t.flops += flops(pt.problem);
      t.bytes += pt.model_bytes;
    }
  }
  for (const auto &n : order) {
    const Tally &t = per_variant[n];
    os << "  " << std::left << std::setw(16) << n << std::right << std::setw(5) << t.run
       << " to run, " << std::setw(5) << t.skipped << " skipped; " << human(t.flops, "FLOP")
       << ", model traffic " << human(t.bytes, "B") << "\n";
  }
  os << "points:\n";
  for (const auto &pt : points) {
    os << "  " << (pt.skip_reason ? "skip " : "run  ") << pt.variant->name() << "/"
       << pt.variant->space().to_string(pt.config) << "/" << key(pt.problem) << "  "
       << human(flops(pt.problem), "FLOP") << ", min " << human(min_bytes(pt.problem), "B")
       << ", model " << human(pt.model_bytes, "B");
    if (pt.skip_reason)
      os << "  (" << *pt.skip_reason << ")";
    if (!pt.config_source.empty())
      os << "  [" << pt.config_source << "]";
    os << "\n";
  }
}

std::pair<int, int> parse_shard(const std::string &text) {
  const auto slash = text.find('/');
  try {
    if (slash == std::string::npos)
      throw std::invalid_argument(text);
    size_t u1 = 0, u2 = 0;
    const int i = std::stoi(text.substr(0, slash), &u1), n = std::stoi(text.substr(slash + 1), &u2);
    if (u1 != slash || u2 != text.size() - slash - 1 || n < 1 || i < 0 || i >= n)
      throw std::invalid_argument(text);
    return {i, n};
  } catch (const std::exception &) {
    throw UserError("--shard '" + text + "': expected i/n with 0 <= i < n, e.g. --shard 0/4");
  }
}

std::pair<size_t, size_t> shard_range(size_t n, int index, int count) {
  const auto at = [&](int k) { return n * static_cast<size_t>(k) / static_cast<size_t>(count); };
  return {at(index), at(index + 1)};
}

std::string hash_hex(const std::string &bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes)
    h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string binary_hash() {
  static const std::string hash = [] {
    // Word-wise FNV-style mixing: the executable is tens of MB, hashed once per process.
    uint64_t h = 1469598103934665603ull;
    std::ifstream is("/proc/self/exe", std::ios::binary);
    std::vector<char> buf(1 << 20);
    while (is) {
      is.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      const size_t n = static_cast<size_t>(is.gcount());
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, buf.data() + i, 8);
        h = (h ^ w) * 1099511628211ull;
        h ^= h >> 29;
      }
      for (; i < n; ++i)
        h = (h ^ static_cast<unsigned char>(buf[i])) * 1099511628211ull;
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    return std::string(hex);
  }();
  return hash;
}

std::string build_id() { return std::string(git_sha()) + "+" + binary_hash(); }

std::string portable_build_id(const std::string &sha, const std::string &options,
                              const std::string &toolkit, const std::string &binary_id) {
  if (sha.empty() || sha == "unknown" || sha.find("-dirty") != std::string::npos)
    return binary_id;
  return sha + "+" + hash_hex(options + "\n" + toolkit);
}

std::string portable_build_id() {
  return portable_build_id(git_sha(), build_options(), toolkit(), build_id());
}

nlohmann::json build_identity() {
  return {
      {"source_sha", git_sha()},
      {"options", build_options()},
      {"toolkit", toolkit()},
      {"binary_hash", binary_hash()},
      // Each variant's kernel sources (tuner.hpp): two results files tell which variants' code differs.
      {"variant_sources", variant_source_hashes()}};
}

std::string plan_hash(const SweepSpec &spec, const std::vector<PlannedPoint> &points) {
  std::string text = spec.name + "\n" + nlohmann::json(spec.timing).dump() + "\n";
  for (const auto &pt : points)
    text += make_result(pt).name() + "\n";
  return hash_hex(text);
}

namespace {

// Records already in a partial log (one JSON object a line). A line cut short by kill -9 is ignored.
std::vector<nlohmann::json> read_partial_log(const std::string &path) {
  std::vector<nlohmann::json> out;
  std::ifstream is(path);
  std::string line;
  while (std::getline(is, line)) {
    if (line.empty())
      continue;
    try {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.is_object() && j.contains("name") && j.contains("status"))
        out.push_back(std::move(j));
    } catch (const nlohmann::json::exception &) {
    }
  }
  return out;
}

bool is_bad_status(const std::string &s) {
  return s == "incorrect" || s == "crashed" || s == "timeout";
}

} // namespace

int run_sweep(const SweepSpec &spec, const RunOptions &opts) {
  const std::vector<int> gpus = opts.gpus.empty() ? std::vector<int>{opts.device} : opts.gpus;
  // The parent only reads device properties (no context); every CUDA context lives in a worker.
  const DeviceInfo dev = opts.fake_worker ? nominal_device() : query_device(gpus.front());
  if (!opts.fake_worker)
    for (int g : gpus)
      if (query_device(g).name != dev.name)
        throw UserError("--gpus mixes " + dev.name + " and " + query_device(g).name +
                        "; one sweep runs on one kind of GPU (run one per kind, then compare)");
  const std::vector<PlannedPoint> points = plan(spec, catalog(), dev);
  const auto [begin, end] = shard_range(points.size(), opts.shard_index, opts.shard_count);
  std::printf(
      "flashbench %s (%s) on %s, SM %d.%d, %d SMs, driver %s, CUDA runtime %d; %zu GPU worker(s)\n",
      version(), git_sha(), dev.name.c_str(), dev.cc_major, dev.cc_minor, dev.sm_count,
      dev.driver_version_string.c_str(), dev.runtime_version, gpus.size());
  if (opts.shard_count > 1)
    std::printf("shard %d/%d: points %zu..%zu of %zu\n", opts.shard_index, opts.shard_count, begin,
                end == begin ? begin : end - 1, points.size());

  nlohmann::json context = base_context(spec, dev);
  // The machine at the start; its clocks and temperature are read again when the last point is in.
  MachineIdentity machine = query_machine(dev);
  context["machine"] = machine;
  context["plan_hash"] = plan_hash(spec, points);
  context["build_id"] = build_id();
  context["build"] = build_identity();
  context["plan_points"] = points.size();
  context["shard"] = {
      {"index", opts.shard_index}, {"count", opts.shard_count}, {"begin", begin}, {"end", end}};
  context["gpus"] = gpus;
  if (opts.fake_worker)
    context["fake_worker"] = true;

  std::vector<std::optional<nlohmann::json>> records(points.size());
  std::map<std::string, size_t> index_of;
  for (size_t i = begin; i < end; ++i)
    index_of[make_result(points[i]).name()] = i;

  ResultLog log(opts.output_path + ".partial.jsonl");
  auto keep = [&](size_t i, nlohmann::json rec) {
    rec["point_index"] = i;
    log.append(rec);
    records[i] = std::move(rec);
  };
  if (opts.resume) {
    size_t kept = 0, foreign = 0;
    std::vector<nlohmann::json> earlier = read_partial_log(log.path());
    std::string from = log.path();
    // A run that finished left no partial log, only its results file: resuming it keeps that file's points (a
    // requeued shard has nothing left to do). Another plan's file is not this run's to continue.
    std::error_code ec;
    if (earlier.empty() && std::filesystem::file_size(opts.output_path, ec) > 0 && !ec) {
      const nlohmann::json doc = read_results_file(opts.output_path);
      if (doc["context"].value("plan_hash", std::string()) ==
          context["plan_hash"].get<std::string>()) {
        for (const auto &rec : doc["benchmarks"])
          earlier.push_back(rec);
        from = opts.output_path;
      } else if (!opts.force) {
        throw UserError(opts.output_path +
                        " holds the results of another plan; --resume continues a run of this "
                        "plan: pass --force to replace the file, or choose another -o");
      }
    }
    for (auto &rec : earlier) {
      const auto it = index_of.find(rec.value("name", ""));
      if (it == index_of.end() || records[it->second]) {
        ++foreign;
        continue;
      }
      rec["point_index"] = it->second;
      records[it->second] = std::move(rec);
      ++kept;
    }
    // Rewrite the log with exactly the kept records (drops a torn last line and records of other plans), through
    // a rename so that a kill during the rewrite loses nothing.
    {
      const std::string tmp = log.path() + ".tmp";
      std::ofstream os(tmp, std::ios::trunc);
      for (size_t i = begin; i < end; ++i)
        if (records[i])
          os << records[i]->dump() + "\n";
      os.close();
      if (!os)
        throw UserError("cannot rewrite " + tmp + " (disk full?)");
      std::filesystem::rename(tmp, log.path());
    }
    std::printf("resume: %zu finished points kept from %s%s\n", kept, from.c_str(),
                foreign
                    ? (", " + std::to_string(foreign) + " records not in this plan ignored").c_str()
                    : "");
  } else {
    std::filesystem::remove(log.path());
  }
  for (size_t i = begin; i < end; ++i)
    if (points[i].skip_reason && !records[i])
      keep(i, to_json(make_result(points[i])));

  const double point_timeout =
      opts.point_timeout_s > 0 ? opts.point_timeout_s : spec.timing.point_timeout_s;
  std::vector<SupervisorTask> tasks;
  for (size_t i = begin; i < end; ++i)
    if (!records[i])
      tasks.push_back(
          {i, task_payload(points[i], spec.timing, point_timeout), key(points[i].problem)});
  std::printf("%zu points to run, %zu already recorded\n", tasks.size(),
              (end - begin) - tasks.size());

  if (!tasks.empty()) {
    SupervisorOptions so;
    so.devices = gpus;
    so.point_timeout_s = point_timeout;
    so.verbose = opts.verbose;
    so.worker_args = [&](int, bool first) {
      std::vector<std::string> a;
      if (first && opts.measure_ceilings)
        a.push_back("--ceilings");
      if (!opts.counters)
        a.push_back("--no-counters");
      std::string metrics;
      for (const auto &m : opts.extra_metrics)
        metrics += (metrics.empty() ? "" : ",") + m;
      if (!metrics.empty())
        a.insert(a.end(), {"--metrics", metrics});
      if (opts.fake_worker)
        a.insert(a.end(), {"--fake", "--fake-delay-ms", std::to_string(opts.fake_delay_ms)});
      return a;
    };
    bool have_hello = false;
    SupervisorCallbacks cb;
    cb.on_hello = [&](const nlohmann::json &hello) {
      if (hello.contains("ceilings") && context["ceilings"].is_null()) {
        context["ceilings"] = hello["ceilings"];
        std::printf("ceilings: bf16 GEMM %.0f TFLOP/s, device copy %.0f GB/s (read+write)\n",
                    hello["ceilings"].value("gemm_bf16_tflops", 0.0),
                    hello["ceilings"].value("copy_gbps", 0.0));
      }
      if (hello.contains("ceilings_reason"))
        context["ceilings_reason"] = hello["ceilings_reason"];
      if (have_hello)
        return;
      have_hello = true;
      if (hello.contains("counters")) {
        context["counters"] = hello["counters"];
        if (!hello["counters"].value("available", false))
          std::fprintf(
              stderr,
              "flashbench: warning: hardware counters unavailable (%s); metrics will be null\n",
              hello["counters"].value("reason", "").c_str());
      }
    };
    cb.on_record = [&](size_t id, nlohmann::json rec) {
      if (opts.verbose || is_bad_status(rec.value("status", "")))
        std::fprintf(stderr, "flashbench: %s: %s%s%s\n", rec.value("name", "").c_str(),
                     rec.value("status", "").c_str(), rec.value("reason", "").empty() ? "" : ": ",
                     rec.value("reason", "").c_str());
      keep(id, std::move(rec));
    };
    cb.on_lost = [&](size_t id, Status st, std::string reason) {
      Result r = make_result(points[id]);
      r.status = st;
      r.reason = std::move(reason);
      std::fprintf(stderr, "flashbench: %s: %s: %s\n", r.name().c_str(), to_string(st),
                   r.reason.c_str());
      keep(id, to_json(r));
    };
    Supervisor supervisor(so);
    try {
      supervisor.run(tasks, cb);
    } catch (const UserError &) {
      // A worker refused the run (e.g. an unknown --metrics name) before measuring anything: leave no output
      // behind, unless a resumed log holds earlier work.
      if (!opts.resume)
        std::filesystem::remove(log.path());
      throw;
    }
    context["workers_started"] = supervisor.workers_started();
  }

  std::vector<nlohmann::json> out;
  for (size_t i = begin; i < end; ++i)
    out.push_back(*records[i]);
  machine.end = query_machine_state(machine.pci_bus_id);
  context["machine"] = machine;
  write_results_file(opts.output_path, context, out);
  std::filesystem::remove(log.path());
  print_summary(out);
  int bad = 0, ok = 0, skipped = 0;
  for (const auto &j : out) {
    const std::string st = j.value("status", "");
    if (st == "ok")
      ++ok;
    else if (st == "skipped")
      ++skipped;
    else
      ++bad;
  }
  std::printf("\n%d ok, %d skipped, %d incorrect/crashed/timeout; results in %s\n", ok, skipped,
              bad, opts.output_path.c_str());
  return bad ? 1 : 0;
}

void merge_results(const std::vector<std::string> &inputs, const std::string &output,
                   bool allow_missing, std::ostream &log) {
  if (inputs.empty())
    throw UserError("merge: give the shard files to join, e.g. merge a.json b.json -o all.json");
  nlohmann::json context;
  std::string first;
  int count = 0;
  std::set<int> shards;
  std::map<std::string, std::string> seen; // point name -> file
  std::vector<nlohmann::json> records, build_ids;
  for (const auto &path : inputs) {
    const nlohmann::json doc = read_results_file(path);
    const nlohmann::json &c = doc["context"];
    for (const char *field : {"plan_hash", "build_id", "shard"})
      if (!c.contains(field))
        throw UserError(path + ": no context." + field +
                        "; it was not written by 'flashbench run' of this version");
    build_ids.push_back(c["build_id"]);
    const int index = c["shard"].value("index", 0), n = c["shard"].value("count", 1);
    if (first.empty()) {
      first = path;
      context = c;
      count = n;
    } else {
      auto same = [&](const char *field, const nlohmann::json &a, const nlohmann::json &b,
                      const char *what) {
        if (a != b)
          throw UserError(path + ": " + field + " " + a.dump() + " differs from " + first + "'s " +
                          b.dump() + "; " + what);
      };
      same("plan_hash", c["plan_hash"], context["plan_hash"],
           "shards must come from the same spec and plan");
      // One source build: the same sha, options and toolkit. The binaries may differ (shards built on several
      // machines); files written before the build identity existed can only be matched by their binary.
      if (c.contains("build") && context.contains("build")) {
        for (const char *field : {"source_sha", "options", "toolkit"})
          same((std::string("build ") + field).c_str(), c["build"].value(field, nlohmann::json()),
               context["build"].value(field, nlohmann::json()),
               "shards must come from one source built the same way (rebuild them from one commit "
               "with the same "
               "options and toolkit)");
      } else {
        same("build_id", c["build_id"], context["build_id"],
             "shards must come from the same build");
      }
      same("device", c.value("device", nlohmann::json()).value("name", nlohmann::json()),
           context.value("device", nlohmann::json()).value("name", nlohmann::json()),
           "shards must run on the same kind of GPU");
      same("shard count", nlohmann::json(n), nlohmann::json(count),
           "shards must split the plan the same way");
    }
    if (!shards.insert(index).second)
      throw UserError(path + ": shard " + std::to_string(index) + "/" + std::to_string(n) +
                      " is given twice; pass each shard file once");
    for (const auto &rec : doc["benchmarks"]) {
      const std::string name = rec.value("name", "");
      const auto [it, fresh] = seen.emplace(name, path);
      if (!fresh)
        throw UserError(path + ": point " + name + " is also in " + it->second +
                        "; shards overlap");
      records.push_back(rec);
    }
  }
  if (!allow_missing && static_cast<int>(shards.size()) != count) {
    std::string missing;
    for (int i = 0; i < count; ++i)
      if (!shards.count(i))
        missing += (missing.empty() ? "" : ", ") + std::to_string(i);
    throw UserError("merge: shard(s) " + missing + " of " + std::to_string(count) +
                    " missing; add their files or pass --allow-missing");
  }
  std::stable_sort(records.begin(), records.end(),
                   [](const nlohmann::json &a, const nlohmann::json &b) {
                     return a.value("point_index", size_t(0)) < b.value("point_index", size_t(0));
                   });
  context["shard"] = {{"index", 0},
                      {"count", 1},
                      {"begin", 0},
                      {"end", context.value("plan_points", records.size())}};
  context["merged_from"] = inputs;
  context["merged_build_ids"] = build_ids; // per input: its source sha and binary hash
  write_results_file(output, context, records);
  log << "merged " << records.size() << " records from " << inputs.size() << " file(s) ("
      << shards.size() << " of " << count << " shards) into " << output << "\n";
}

} // namespace fb
