#include "flashbench/results.hpp"

#include "flashbench/errors.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unistd.h>

namespace fb {

namespace {
constexpr size_t kMaxStoredSamples = 1000;

nlohmann::json num_or_null(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}

// The samples a file keeps: at most kMaxStoredSamples, evenly spaced, so that files stay small and compare still
// sees the spread; each to the nanosecond, since CUDA events resolve about half a microsecond (scripts/peers.py
// writes its samples the same way). The recorded statistics come from the unrounded samples.
std::vector<double> stored_samples(const std::vector<double> &s) {
  const size_t n = std::min(s.size(), kMaxStoredSamples);
  const double step = n ? static_cast<double>(s.size()) / static_cast<double>(n) : 1.0;
  std::vector<double> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i)
    out.push_back(std::round(s[static_cast<size_t>(i * step)] * 1e3) / 1e3);
  return out;
}
} // namespace

const char *to_string(Status s) {
  switch (s) {
  case Status::ok:
    return "ok";
  case Status::skipped:
    return "skipped";
  case Status::incorrect:
    return "incorrect";
  case Status::crashed:
    return "crashed";
  case Status::timeout:
    return "timeout";
  }
  return "?";
}

Status parse_status(const std::string &s) {
  for (Status st :
       {Status::ok, Status::skipped, Status::incorrect, Status::crashed, Status::timeout})
    if (s == to_string(st))
      return st;
  throw UserError("unknown status '" + s +
                  "'; expected ok, skipped, incorrect, crashed or timeout");
}

std::string Result::name() const {
  return variant + "/" + (config_str.empty() ? "default" : config_str) + "/" + key(problem);
}

double Result::tflops() const {
  if (status != Status::ok || !timing || timing->median_us <= 0)
    return 0;
  return flops / (timing->median_us * 1e-6) / 1e12;
}

nlohmann::json to_json(const Result &r) {
  using nlohmann::json;
  const bool ok = r.status == Status::ok && r.timing.has_value();
  json j;
  // Google Benchmark's fields first: compare.py matches records by name and reads real_time/cpu_time.
  j["name"] = r.name();
  j["run_name"] = r.name();
  j["run_type"] = "iteration";
  j["repetitions"] = 1;
  j["repetition_index"] = 0;
  j["threads"] = 1;
  j["iterations"] = ok ? static_cast<int64_t>(r.timing->samples_us.size()) : 0;
  j["real_time"] = ok ? r.timing->median_us : 0.0;
  j["cpu_time"] = ok ? r.timing->median_us : 0.0;
  j["time_unit"] = "us";
  if (!ok) {
    j["error_occurred"] = true;
    j["error_message"] = std::string(to_string(r.status)) + ": " + r.reason;
  }
  j["variant"] = r.variant;
  j["config"] = r.config_json;
  j["config_str"] = r.config_str;
  j["problem"] = r.problem;
  j["status"] = to_string(r.status);
  j["reason"] = r.reason;
  j["flops"] = r.flops;
  j["bytes_min"] = r.bytes_min;
  j["bytes_model"] = r.bytes_model;
  if (!r.bytes_model_reason.empty())
    j["bytes_model_reason"] = r.bytes_model_reason;
  if (r.bytes_model_low >= 0 && r.bytes_model_high >= r.bytes_model_low)
    j["bytes_model_range"] = {r.bytes_model_low, r.bytes_model_high};
  j["kv_bytes"] = kv_bytes(r.problem);
  j["seed"] = r.seed;
  if (ok) {
    const TimingStats &t = *r.timing;
    j["tflops"] = r.tflops();
    j["median_us"] = t.median_us;
    j["min_us"] = t.min_us;
    j["max_us"] = t.max_us;
    j["mean_us"] = t.mean_us;
    j["cv"] = t.cv;
    j["noisy"] = t.noisy;
    j["stop_reason"] = t.stop_reason;
    j["samples"] = t.samples_us.size();
    j["samples_us"] = stored_samples(t.samples_us);
    j["dropped_throttled"] = t.dropped_throttled;
    j["sm_clock_mhz"] = t.sm_clock_mhz;
    j["wall_s"] = t.wall_s;
    j["settle_wait_s"] = t.settle_wait_s;
    j["slowdown_at_start"] = t.slowdown_at_start;
    j["busy_fraction"] = t.busy_fraction;
    j["power_w"] = t.power_w;
    j["void_batches"] = t.void_batches;
    j["bytes_model_gbps"] = r.bytes_model / (t.median_us * 1e-6) / 1e9;
    // Achieved bandwidth on the bytes that must move: K+V alone (decode is bound by reading the cache) and all
    // of bytes_min (Q, K, V, O, LSE). SI GB/s over the median time.
    j["kv_gbps"] = kv_bytes(r.problem) / (t.median_us * 1e-6) / 1e9;
    j["bytes_min_gbps"] = r.bytes_min / (t.median_us * 1e-6) / 1e9;
  } else {
    j["tflops"] = nullptr;
    j["median_us"] = nullptr;
  }
  if (r.counters && r.counters->available) {
    j["counters"] = summarize_counters(*r.counters);
    j["metrics"] = *r.counters;
    j["counters_passes"] = r.counters->passes;
    j["counters_seconds"] = r.counters->seconds;
    if (!r.counters->untrusted.empty())
      j["counters_untrusted"] = r.counters->untrusted;
  } else {
    j["counters"] = nullptr;
    if (r.counters)
      j["counters_reason"] = r.counters->reason;
  }
  if (!r.occupancy.empty()) {
    j["occupancy"] = r.occupancy.front();
    j["occupancy_all"] = r.occupancy;
  }
  if (r.verification) {
    const VerifyResult &v = *r.verification;
    j["max_error"] = num_or_null(v.max_abs_error);
    j["rel_l2_error"] = num_or_null(v.rel_l2_error);
    j["lse_max_error"] = num_or_null(v.lse_max_error);
    j["verified_against"] = v.reference;
    j["verification"] = v;
  } else {
    j["max_error"] = nullptr;
  }
  return j;
}

Result result_from_json(const nlohmann::json &j) {
  try {
    Result r;
    r.variant = j.at("variant").get<std::string>();
    r.config_json = j.value("config", nlohmann::json::object());
    r.config_str = j.value("config_str", std::string());
    for (auto &[k, v] : r.config_json.items())
      if (v.is_number_integer())
        r.config.set(k, v.get<int64_t>());
    r.problem = j.at("problem").get<AttentionProblem>();
    r.status = parse_status(j.at("status").get<std::string>());
    r.reason = j.value("reason", std::string());
    r.flops = j.value("flops", 0.0);
    r.bytes_min = j.value("bytes_min", 0.0);
    r.bytes_model = j.value("bytes_model", 0.0);
    r.bytes_model_reason = j.value("bytes_model_reason", std::string());
    if (const auto range = j.find("bytes_model_range");
        range != j.end() && range->is_array() && range->size() == 2) {
      r.bytes_model_low = range->at(0).get<double>();
      r.bytes_model_high = range->at(1).get<double>();
    }
    r.seed = j.value("seed", uint64_t{0});
    if (r.status == Status::ok && j.contains("samples_us")) {
      TimingStats t = summarize(j.at("samples_us").get<std::vector<double>>());
      // The stored samples may be thinned: keep the recorded statistics, which saw every sample.
      t.median_us = j.value("median_us", t.median_us);
      t.min_us = j.value("min_us", t.min_us);
      t.max_us = j.value("max_us", t.max_us);
      t.mean_us = j.value("mean_us", t.mean_us);
      t.cv = j.value("cv", t.cv);
      t.noisy = j.value("noisy", false);
      t.stop_reason = j.value("stop_reason", std::string());
      t.sm_clock_mhz = j.value("sm_clock_mhz", 0.0);
      t.dropped_throttled = j.value("dropped_throttled", 0);
      t.wall_s = j.value("wall_s", 0.0);
      t.settle_wait_s = j.value("settle_wait_s", 0.0);
      t.slowdown_at_start = j.value("slowdown_at_start", 0ull);
      t.busy_fraction = j.value("busy_fraction", 0.0);
      t.power_w = j.value("power_w", 0.0);
      t.void_batches = j.value("void_batches", 0);
      r.timing = t;
    }
    if (j.contains("verification") && j["verification"].is_object()) {
      const auto &v = j["verification"];
      VerifyResult vr;
      vr.pass = v.value("pass", false);
      vr.max_abs_error = v["max_error"].is_number() ? v["max_error"].get<double>() : INFINITY;
      vr.worst_ratio = v["worst_over_tolerance"].is_number()
                           ? v["worst_over_tolerance"].get<double>()
                           : INFINITY;
      vr.rel_l2_error = v["rel_l2_error"].is_number() ? v["rel_l2_error"].get<double>() : INFINITY;
      vr.lse_max_error =
          v["lse_max_error"].is_number() ? v["lse_max_error"].get<double>() : INFINITY;
      vr.nonfinite = v.value("nonfinite", int64_t{0});
      vr.mismatches = v.value("mismatches", int64_t{0});
      vr.reference = v.value("verified_against", std::string());
      if (v.contains("tensors") && v["tensors"].is_object())
        for (const auto &[name, t] : v["tensors"].items()) {
          auto num = [&](const char *f) {
            return t.contains(f) && t[f].is_number() ? t[f].get<double>() : INFINITY;
          };
          TensorError e;
          e.name = name;
          e.max_abs_error = num("max_error");
          e.worst_ratio = num("worst_over_tolerance");
          e.rel_l2_error = num("rel_l2_error");
          e.nonfinite = t.value("nonfinite", int64_t{0});
          e.mismatches = t.value("mismatches", int64_t{0});
          vr.tensors.push_back(std::move(e));
        }
      r.verification = vr;
    }
    return r;
  } catch (const nlohmann::json::exception &e) {
    throw UserError(std::string("malformed result record: ") + e.what());
  }
}

void write_results_file(const std::string &path, const nlohmann::json &context,
                        const std::vector<Result> &results) {
  std::vector<nlohmann::json> records;
  records.reserve(results.size());
  for (const Result &r : results)
    records.push_back(to_json(r));
  write_results_file(path, context, records);
}

void write_results_file(const std::string &path, const nlohmann::json &context,
                        const std::vector<nlohmann::json> &records) {
  nlohmann::json doc;
  doc["context"] = context;
  doc["context"]["schema_version"] = kSchemaVersion;
  doc["benchmarks"] = records;
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path())
    fs::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  // Whatever fails, no temp file stays behind and the message names the results file, not an internal error.
  const auto fail = [&](const std::string &why) {
    fs::remove(tmp, ec);
    throw UserError("cannot write results file " + path + ": " + why +
                    "; check the path (a file in a writable directory) and the free space");
  };
  {
    std::ofstream os(tmp, std::ios::trunc);
    if (!os)
      fail(std::strerror(errno));
    os << doc.dump(1) << "\n";
    os.flush();
    if (!os)
      fail("writing " + tmp + " failed (disk full?)");
  }
  if (FILE *f =
          std::fopen(tmp.c_str(), "r")) { // fsync so that the rename never exposes an empty file
    ::fsync(fileno(f));
    std::fclose(f);
  }
  fs::rename(tmp, target, ec);
  if (ec)
    fail(ec.message());
}

namespace {

std::string parent_dir(const std::string &path) {
  const std::filesystem::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

bool non_empty_file(const std::string &path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && std::filesystem::file_size(path, ec) > 0 &&
         !ec;
}

} // namespace

void check_output_path(const std::string &path, const std::string &option, bool may_replace,
                       const std::string &replace_hint, bool creates_parents) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string where = option + " " + path;
  if (path.empty())
    throw UserError(option + ": the path is empty; give a file name such as results.json");
  if (fs::is_directory(path, ec))
    throw UserError(where + ": is a directory; give a file name in it, e.g. " + option + " " +
                    (fs::path(path) / "results.json").string());
  std::string dir = parent_dir(path);
  if (creates_parents)
    while (!fs::exists(dir, ec) && fs::path(dir).has_parent_path() &&
           fs::path(dir).parent_path() != dir)
      dir = fs::path(dir).parent_path().string();
  if (!fs::exists(dir, ec))
    throw UserError(where + ": the directory " + dir + " does not exist; create it (mkdir -p " +
                    dir + ") or choose another path");
  if (!fs::is_directory(dir, ec))
    throw UserError(where + ": " + dir + " is not a directory; choose a path in a directory");
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    throw UserError(where + ": exists and is not a regular file; choose another path");
  if (!may_replace && non_empty_file(path))
    throw UserError(where + ": the file already exists; " + replace_hint);
  // The writes go through a temp file beside the target and a rename: the directory must take new files. Probing
  // with a real file catches what permission bits do not (read-only mounts, root on /proc, quotas).
  const std::string probe =
      (fs::path(dir) / (".flashbench-probe." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    throw UserError(where + ": cannot create files in " + dir + " (" + why +
                    "); choose a writable directory");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_partial_log(const std::string &path, bool may_discard) {
  if (may_discard || !non_empty_file(path))
    return;
  throw UserError(
      path + ": an interrupted run's measured points are here; continue that run with --resume, "
             "or pass --force to start over");
}

DeviceInfo device_from_json(const nlohmann::json &j, const std::string &where) {
  if (!j.is_object())
    throw UserError(
        where +
        " is not an object with the device's fields; give a results file that flashbench wrote");
  DeviceInfo d;
  const auto need = [&](const char *key) -> const nlohmann::json & {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null())
      throw UserError(where + " has no '" + key +
                      "': the traffic models need the device the results were measured on");
    return *it;
  };
  try {
    d.present = j.value("present", true);
    d.name = j.value("name", std::string());
    d.pci_bus_id = j.value("pci_bus_id", std::string());
    const std::string cc = need("cc").get<std::string>();
    const size_t dot = cc.find('.');
    if (dot == std::string::npos)
      throw UserError(where + ": cc '" + cc + "' is not MAJOR.MINOR");
    d.cc_major = std::stoi(cc.substr(0, dot));
    d.cc_minor = std::stoi(cc.substr(dot + 1));
    d.sm_count = need("sm_count").get<int>();
    d.l2_bytes = need("l2_bytes").get<int64_t>();
    d.smem_per_sm = need("smem_per_sm").get<int64_t>();
    d.smem_per_block_optin = j.value("smem_per_block_optin", d.smem_per_sm);
    d.regs_per_sm = need("regs_per_sm").get<int>();
    d.max_threads_per_sm = need("max_threads_per_sm").get<int>();
    d.max_blocks_per_sm = j.value("max_blocks_per_sm", (d.cc_major >= 9 || d.cc() == 80) ? 32 : 16);
    d.total_mem_bytes = j.value("total_mem_bytes", int64_t{0});
    d.sm_clock_max_mhz = j.value("sm_clock_max_mhz", 0);
    d.mem_clock_max_mhz = j.value("mem_clock_max_mhz", 0);
    d.mem_bus_width_bits = j.value("mem_bus_width_bits", 0);
  } catch (const nlohmann::json::exception &e) {
    throw UserError(where + ": " + e.what() + "; give a results file that flashbench wrote");
  } catch (const std::logic_error &e) { // stoi
    throw UserError(where + ": cc is not MAJOR.MINOR (" + e.what() + ")");
  }
  return d;
}

nlohmann::json read_results_file(const std::string &path) {
  std::ifstream is(path);
  if (!is)
    throw UserError(path + ": cannot open results file; check the path");
  nlohmann::json doc;
  try {
    is >> doc;
  } catch (const nlohmann::json::parse_error &e) {
    throw UserError(path + ": not valid JSON (" + std::string(e.what()) +
                    "); regenerate it with flashbench run");
  }
  if (!doc.is_object() || !doc.contains("benchmarks") || !doc["benchmarks"].is_array())
    throw UserError(path + ": no 'benchmarks' array; this is not a flashbench results file");
  const auto version = doc.value(nlohmann::json::json_pointer("/context/schema_version"), -1);
  if (version != kSchemaVersion)
    throw UserError(path + ": schema_version " + std::to_string(version) +
                    ", this flashbench reads version " + std::to_string(kSchemaVersion) +
                    "; regenerate the file with this build");
  return doc;
}

ResultLog::ResultLog(std::string path) : path_(std::move(path)) {
  namespace fs = std::filesystem;
  const fs::path target(path_);
  if (target.has_parent_path())
    fs::create_directories(target.parent_path());
}

void ResultLog::append(const Result &r) { append(to_json(r)); }

void ResultLog::append(const nlohmann::json &record) {
  // One write per record, so that a kill leaves at most one torn last line (which --resume ignores).
  std::ofstream os(path_, std::ios::app);
  os << record.dump() + "\n";
  os.flush();
}

} // namespace fb
