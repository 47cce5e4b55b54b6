#include "flashbench/tuner.hpp"

#include "flashbench/dispatch.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/machine.hpp"
#include "flashbench/options.hpp"
#include "flashbench/sweep.hpp"
#include "supervisor.hpp"
#include "worker.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>

#ifndef FLASHBENCH_TUNING_DEFAULT_DIR
#define FLASHBENCH_TUNING_DEFAULT_DIR "tuning"
#endif

namespace fb {

namespace fs = std::filesystem;

// ---- tuning tables ----

int64_t bucket_of(int64_t n) {
  int64_t b = 1;
  while (b < n)
    b *= 2;
  return b;
}

namespace {
std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", std::localtime(&t));
  return buf;
}

void write_atomically(const std::string &path, const std::string &text) {
  const fs::path target(path);
  if (target.has_parent_path())
    fs::create_directories(target.parent_path());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream os(tmp, std::ios::trunc);
    if (!os)
      throw UserError("cannot write " + tmp + "; check that the directory is writable");
    os << text;
    if (!os.flush())
      throw UserError("failed writing " + tmp + " (disk full?)");
  }
  fs::rename(tmp, target);
}
} // namespace

bool TuningEntry::same_key(const TuningEntry &o) const {
  return variant == o.variant && pass == o.pass && dtype == o.dtype && head_dim == o.head_dim &&
         causal == o.causal && seqlen_q_bucket == o.seqlen_q_bucket &&
         seqlen_kv_bucket == o.seqlen_kv_bucket && bh_bucket == o.bh_bucket &&
         group_bucket == o.group_bucket;
}

TuningEntry make_entry_key(const std::string &variant, const AttentionProblem &p) {
  TuningEntry e;
  e.variant = variant;
  e.pass = p.pass;
  e.dtype = p.dtype;
  e.head_dim = p.head_dim;
  e.causal = p.causal;
  e.seqlen_q_bucket = bucket_of(p.seqlen_q);
  e.seqlen_kv_bucket = bucket_of(p.seqlen_kv);
  e.bh_bucket = bucket_of(p.batch * p.heads_q);
  e.group_bucket = bucket_of(std::max<int64_t>(1, p.group_size()));
  e.problem = p;
  return e;
}

namespace {

// The four dimensions the buckets cut (seqlen_q, seqlen_kv, batch*heads_q, heads_q/heads_kv), as the entry's
// measured problem has them when it recorded one of its own bucket, else as the bucket's upper edges.
std::array<double, 4> entry_dims(const TuningEntry &e) {
  if (make_entry_key(e.variant, e.problem).same_key(e)) {
    const AttentionProblem &q = e.problem;
    return {double(q.seqlen_q), double(q.seqlen_kv), double(q.batch * q.heads_q),
            double(std::max<int64_t>(1, q.group_size()))};
  }
  return {double(e.seqlen_q_bucket), double(e.seqlen_kv_bucket), double(e.bh_bucket),
          double(e.group_bucket)};
}

std::array<double, 4> problem_dims(const AttentionProblem &p) {
  return {double(p.seqlen_q), double(p.seqlen_kv), double(p.batch * p.heads_q),
          double(std::max<int64_t>(1, p.group_size()))};
}

// log2(entry / problem) per dimension: positive where the entry's problem is the larger.
std::array<double, 4> log_ratios(const TuningEntry &e, const AttentionProblem &p) {
  const auto a = entry_dims(e), b = problem_dims(p);
  std::array<double, 4> r{};
  for (size_t i = 0; i < r.size(); ++i)
    r[i] = std::log2(std::max(a[i], 1.0) / std::max(b[i], 1.0));
  return r;
}

} // namespace

double bucket_distance(const TuningEntry &e, const AttentionProblem &p) {
  double d = 0;
  for (double x : log_ratios(e, p))
    d += std::abs(x);
  return d;
}

const TuningEntry *TuningTable::lookup(const std::string &variant, const AttentionProblem &p,
                                       bool *exact, double *distance) const {
  const TuningEntry k = make_entry_key(variant, p);
  const TuningEntry *best = nullptr;
  // (distance, its length part, minus the signed size difference): smaller is nearer. Equal within 1e-9.
  std::array<double, 3> best_rank{};
  for (const auto &e : entries) {
    if (e.variant != k.variant || e.pass != k.pass || e.dtype != k.dtype ||
        e.head_dim != k.head_dim || e.causal != k.causal)
      continue;
    if (e.same_key(k)) {
      if (exact)
        *exact = true;
      if (distance)
        *distance = 0;
      return &e;
    }
    const auto r = log_ratios(e, p);
    const std::array<double, 3> rank = {
        std::abs(r[0]) + std::abs(r[1]) + std::abs(r[2]) + std::abs(r[3]),
        std::abs(r[0]) + std::abs(r[1]), -(r[0] + r[1] + r[2] + r[3])};
    bool nearer = !best;
    for (size_t i = 0; best && i < rank.size(); ++i) {
      if (std::abs(rank[i] - best_rank[i]) <= 1e-9)
        continue;
      nearer = rank[i] < best_rank[i];
      break;
    }
    if (nearer && rank[0] <= kMaxBucketDistance + 1e-9) {
      best = &e;
      best_rank = rank;
    }
  }
  if (exact)
    *exact = false;
  if (distance)
    *distance = best ? best_rank[0] : 0;
  return best;
}

void TuningTable::upsert(TuningEntry e) {
  for (auto &x : entries)
    if (x.same_key(e)) {
      x = std::move(e);
      return;
    }
  entries.push_back(std::move(e));
}

nlohmann::json to_json(const TuningTable &t) {
  nlohmann::json j;
  j["schema_version"] = 1;
  j["gpu"] = t.gpu;
  j["build_id"] = t.build_id;
  j["updated"] = iso_now();
  j["entries"] = nlohmann::json::array();
  for (const auto &e : t.entries)
    j["entries"].push_back({{"variant", e.variant},
                            {"pass", to_string(e.pass)},
                            {"dtype", to_string(e.dtype)},
                            {"head_dim", e.head_dim},
                            {"causal", e.causal},
                            {"seqlen_q_bucket", e.seqlen_q_bucket},
                            {"seqlen_kv_bucket", e.seqlen_kv_bucket},
                            {"bh_bucket", e.bh_bucket},
                            {"group_bucket", e.group_bucket},
                            {"config", e.config.params()},
                            {"config_str", e.config_str},
                            {"tflops", e.tflops},
                            {"median_us", e.median_us},
                            {"runner_up", e.runner_up},
                            {"margin", e.margin},
                            {"clock_spread", e.clock_spread},
                            {"problem", e.problem},
                            {"source_hash", e.source_hash},
                            {"strategy", e.strategy},
                            {"evaluations", e.evaluations},
                            {"candidates", e.candidates}});
  return j;
}

TuningTable tuning_table_from_json(const nlohmann::json &j, const std::string &path) {
  try {
    if (j.value("schema_version", 0) != 1)
      throw UserError(
          path +
          ": not a flashbench tuning table (schema_version 1); regenerate it with flashbench tune");
    TuningTable t;
    t.gpu = j.value("gpu", nlohmann::json::object());
    t.build_id = j.value("build_id", "");
    for (const auto &x : j.at("entries")) {
      TuningEntry e;
      e.variant = x.at("variant").get<std::string>();
      e.pass = parse_pass(x.value("pass", std::string("fwd")));
      e.dtype = parse_dtype(x.at("dtype").get<std::string>());
      e.head_dim = x.at("head_dim").get<int64_t>();
      e.causal = x.at("causal").get<bool>();
      e.seqlen_q_bucket = x.at("seqlen_q_bucket").get<int64_t>();
      e.seqlen_kv_bucket = x.at("seqlen_kv_bucket").get<int64_t>();
      e.bh_bucket = x.at("bh_bucket").get<int64_t>();
      e.group_bucket = x.value("group_bucket", int64_t{1});
      e.config = Config(x.at("config").get<std::map<std::string, int64_t>>());
      e.config_str = x.value("config_str", "");
      e.tflops = x.value("tflops", 0.0);
      e.median_us = x.value("median_us", 0.0);
      e.runner_up = x.value("runner_up", "");
      e.margin = x.value("margin", 0.0);
      e.clock_spread = x.value("clock_spread", 0.0);
      if (x.contains("problem"))
        e.problem = x["problem"].get<AttentionProblem>();
      e.source_hash = x.value("source_hash", "");
      e.strategy = x.value("strategy", "");
      e.evaluations = x.value("evaluations", 0.0);
      e.candidates = x.value("candidates", 0);
      t.entries.push_back(std::move(e));
    }
    return t;
  } catch (const nlohmann::json::exception &e) {
    throw UserError(path + ": malformed tuning table (" + std::string(e.what()) +
                    "); regenerate it with flashbench tune");
  }
}

TuningTable load_tuning_table(const std::string &path) {
  std::ifstream is(path);
  if (!is)
    throw UserError(
        path +
        ": cannot open tuning table; check the path (tables live in tuning/<gpu-slug>.json)");
  nlohmann::json j;
  try {
    is >> j;
  } catch (const nlohmann::json::parse_error &e) {
    throw UserError(path + ": not valid JSON (" + std::string(e.what()) +
                    "); regenerate it with flashbench tune");
  }
  return tuning_table_from_json(j, path);
}

void save_tuning_table(const std::string &path, const TuningTable &t) {
  write_atomically(path, to_json(t).dump(1) + "\n");
}

std::string tuning_dir() {
  if (const std::string &d = env_options().tuning_dir; !d.empty())
    return d;
  return FLASHBENCH_TUNING_DEFAULT_DIR;
}

std::string tuning_path_for(const DeviceInfo &dev) {
  return (fs::path(tuning_dir()) / (dev.slug() + ".json")).string();
}

std::string describe_bucket(const TuningEntry &e) {
  return std::string(e.pass == Pass::bwd ? "bwd " : "") +
         "bucket sq<=" + std::to_string(e.seqlen_q_bucket) +
         " skv<=" + std::to_string(e.seqlen_kv_bucket) + " b*h<=" + std::to_string(e.bh_bucket) +
         " group<=" + std::to_string(e.group_bucket);
}

std::string stale_reason(const TuningEntry &e) {
  const auto &hashes = variant_source_hashes();
  const auto it = hashes.find(e.variant);
  if (it == hashes.end())
    return "this build has no variant " + e.variant;
  if (e.source_hash.empty())
    return "no source hash recorded (tuned by a build that did not record them)";
  if (e.source_hash != it->second)
    return e.variant + "'s sources changed since (tuned at " + e.source_hash + ", this build " +
           it->second + ")";
  return "";
}

namespace {

// One line for the first load of a table with stale entries.
void warn_if_stale(const TuningTable &t, const std::string &path) {
  size_t stale = 0;
  std::set<std::string> variants;
  for (const auto &e : t.entries)
    if (!stale_reason(e).empty()) {
      ++stale;
      variants.insert(e.variant);
    }
  if (!stale)
    return;
  std::string names;
  for (const auto &v : variants)
    names += (names.empty() ? "" : ", ") + v;
  std::fprintf(stderr,
               "flashbench: warning: %s: %zu of %zu entries were tuned on other sources of their "
               "variant (%s); "
               "their configs are still used, but may no longer be the best: `flashbench tune "
               "--check %s` lists "
               "them, docs/tuning.md says how to re-tune\n",
               path.c_str(), stale, t.entries.size(), names.c_str(), path.c_str());
}

} // namespace

int check_tuning_tables(const std::vector<std::string> &given, std::ostream &os) {
  std::vector<std::string> paths = given;
  if (paths.empty()) {
    const std::string dir = tuning_dir();
    if (fs::is_directory(dir))
      for (const auto &f : fs::directory_iterator(dir))
        if (f.path().extension() == ".json")
          paths.push_back(f.path().string());
    std::sort(paths.begin(), paths.end());
    if (paths.empty())
      throw UserError("tune --check: no tuning tables (*.json) in " + dir +
                      "; name the tables to check");
  }
  std::vector<TuningTable> tables;
  for (const auto &p : paths)
    tables.push_back(load_tuning_table(p)); // every table readable before any output
  size_t stale_total = 0;
  for (size_t i = 0; i < tables.size(); ++i) {
    size_t stale = 0;
    for (const auto &e : tables[i].entries) {
      const std::string why = stale_reason(e);
      if (why.empty())
        continue;
      ++stale;
      os << paths[i] << ": stale: " << e.variant << " " << to_string(e.dtype) << " d" << e.head_dim
         << (e.causal ? " causal " : " ") << describe_bucket(e) << ": " << why << "\n";
    }
    os << paths[i] << ": " << tables[i].entries.size() - stale << " fresh, " << stale << " stale"
       << (stale ? "; re-tune it (docs/tuning.md)" : "") << "\n";
    stale_total += stale;
  }
  return stale_total ? 1 : 0;
}

const TuningTable *tuning_table_for(const DeviceInfo &dev) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<TuningTable>>
      loaded; // path -> table (null: no file)
  const std::string path = tuning_path_for(dev);
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded.find(path);
  if (it == loaded.end()) {
    std::unique_ptr<TuningTable> t;
    if (fs::exists(path)) {
      t = std::make_unique<TuningTable>(load_tuning_table(path));
      warn_if_stale(*t, path);
    }
    it = loaded.emplace(path, std::move(t)).first;
  }
  return it->second.get();
}

std::pair<Config, std::string> tuned_config(const Variant &v, const AttentionProblem &p,
                                            const DeviceInfo &dev) {
  const Config fallback = v.space().default_config(p, dev);
  const TuningTable *t = tuning_table_for(dev);
  if (!t)
    return {fallback, "default: no tuning table " + tuning_path_for(dev)};
  bool exact = false;
  const TuningEntry *e = t->lookup(v.name(), p, &exact);
  if (!e)
    return {fallback, "default: no " + v.name() + " entry for " +
                          (p.pass == Pass::bwd ? "bwd " : "") + to_string(p.dtype) + " d" +
                          std::to_string(p.head_dim) + (p.causal ? " causal" : "") + " in " +
                          tuning_path_for(dev)};
  if (auto why = v.space().check(e->config))
    return {fallback, "default: tuned config invalid (" + *why + ")"};
  if (Support s = support_for(v, p, e->config, dev); !s.ok)
    return {fallback, "default: tuned config unsupported here (" + s.reason + ")"};
  return {e->config, std::string("tuned: ") + (exact ? "" : "nearest ") + describe_bucket(*e) +
                         " of " + tuning_path_for(dev)};
}

// ---- search ----

TimingPolicy scaled_policy(const TimingPolicy &full, double f) {
  if (f >= 1.0)
    return full;
  TimingPolicy t = full;
  t.min_time_s = full.min_time_s * f;
  t.timeout_s = std::max(full.timeout_s * f, 0.05);
  t.min_samples = std::max(3, static_cast<int>(std::ceil(full.min_samples * f)));
  t.max_samples = std::max(t.max_samples, t.min_samples);
  t.max_noise = full.max_noise / std::sqrt(f);
  t.warmup_runs = std::max(1, static_cast<int>(std::ceil(full.warmup_runs * f)));
  return t;
}

namespace {

// Sum of each axis value's position on its axis (axes list values smallest first): fewer resources, lower rank.
int resource_rank(const ConfigSpace &space, const Config &c) {
  int rank = 0;
  for (const Axis &a : space.axes()) {
    if (!c.has(a.name))
      continue;
    const auto it = std::find(a.values.begin(), a.values.end(), c.get(a.name));
    if (it != a.values.end())
      rank += static_cast<int>(it - a.values.begin());
  }
  return rank;
}

bool same_fidelity(double a, double b) { return std::abs(a - b) < 1e-9; }

} // namespace

double clock_spread(const Measurement &a, const Measurement &b) {
  if (a.sm_clock_mhz <= 0 || b.sm_clock_mhz <= 0)
    return 0;
  return std::abs(a.sm_clock_mhz - b.sm_clock_mhz) / std::max(a.sm_clock_mhz, b.sm_clock_mhz);
}

std::optional<size_t> pick_winner(const ConfigSpace &space, const std::vector<Measurement> &m,
                                  double fidelity, double tie_fraction) {
  double best = INFINITY;
  for (const auto &x : m)
    if (x.status == Status::ok && same_fidelity(x.fidelity, fidelity) && x.median_us > 0)
      best = std::min(best, x.median_us);
  if (!std::isfinite(best))
    return std::nullopt;
  std::optional<size_t> w;
  for (size_t i = 0; i < m.size(); ++i) {
    const auto &x = m[i];
    if (x.status != Status::ok || !same_fidelity(x.fidelity, fidelity) ||
        x.median_us > best * (1 + tie_fraction))
      continue;
    if (!w) {
      w = i;
      continue;
    }
    // Fewer resources first; at equal resources the faster (a decode kernel at the read floor is separated from
    // its neighbour by less than the tie, and config order would pick blindly), then config order.
    const int ra = resource_rank(space, x.config), rb = resource_rank(space, m[*w].config);
    const double ta = x.median_us, tb = m[*w].median_us;
    if (ra < rb || (ra == rb && (ta < tb || (ta == tb && x.config < m[*w].config))))
      w = i;
  }
  return w;
}

SearchResult search_configs(const ConfigSpace &space, const std::vector<Config> &candidates,
                            const std::string &strategy, double budget, uint64_t seed,
                            const Evaluator &eval) {
  SearchResult r;
  const size_t n = candidates.size();
  r.candidates = static_cast<int>(n);
  if (n == 0)
    return r;
  const double b = budget < 1 ? std::max(1.0, budget * static_cast<double>(n)) : budget;

  // Measures `configs` at fidelity f; returns their indices into r.measurements.
  auto measure = [&](const std::vector<Config> &configs, double f) {
    std::vector<Trial> trials;
    for (const auto &c : configs)
      trials.push_back({c, f});
    std::vector<Measurement> ms = eval(trials);
    std::vector<size_t> idx;
    for (auto &m : ms) {
      m.fidelity = f;
      r.evaluations += f;
      idx.push_back(r.measurements.size());
      r.measurements.push_back(std::move(m));
    }
    return idx;
  };
  // The k fastest ok configs among the measurements `idx` (ties by config order, so the cut is deterministic).
  auto best_k = [&](const std::vector<size_t> &idx, size_t k) {
    std::vector<size_t> ok;
    for (size_t i : idx)
      if (r.measurements[i].status == Status::ok && r.measurements[i].median_us > 0)
        ok.push_back(i);
    std::sort(ok.begin(), ok.end(), [&](size_t a, size_t c) {
      const auto &x = r.measurements[a], &y = r.measurements[c];
      return x.median_us != y.median_us ? x.median_us < y.median_us : x.config < y.config;
    });
    std::vector<Config> out;
    for (size_t i = 0; i < ok.size() && out.size() < k; ++i)
      out.push_back(r.measurements[ok[i]].config);
    return out;
  };

  if (strategy == "random") {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t(0));
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    const size_t k = std::min(n, static_cast<size_t>(std::max(1.0, std::round(b))));
    std::vector<Config> pick;
    for (size_t i = 0; i < k; ++i)
      pick.push_back(candidates[order[i]]);
    measure(pick, 1.0);
  } else if (strategy == "halving" && b < static_cast<double>(n)) {
    const size_t final_k =
        std::min(n, static_cast<size_t>(std::clamp(std::floor(b / 2), 1.0, 3.0)));
    const size_t mid_k = (n + 2) / 3;
    const bool use_mid = mid_k > final_k;
    const double rest = std::max(0.0, b - static_cast<double>(final_k));
    // (1 - 1e-9): the rungs add up to the budget without rounding over it.
    const double f0 =
        std::clamp(rest / (static_cast<double>(n) + (use_mid ? 3.0 * mid_k : 0.0)) * (1 - 1e-9),
                   0.01, 1.0 / 3);
    std::vector<Config> survivors = best_k(measure(candidates, f0), use_mid ? mid_k : final_k);
    if (use_mid)
      survivors = best_k(measure(survivors, std::min(1.0, 3 * f0)), final_k);
    if (!survivors.empty())
      measure(survivors, 1.0);
  } else if (strategy == "exhaustive" || strategy == "halving") {
    measure(candidates, 1.0);
  } else {
    throw UserError("unknown tuning strategy '" + strategy +
                    "'; use exhaustive, random or halving");
  }

  std::set<Config> distinct;
  for (const auto &m : r.measurements)
    distinct.insert(m.config);
  r.configs_measured = static_cast<int>(distinct.size());
  r.winner = pick_winner(space, r.measurements, 1.0);
  if (r.winner)
    for (size_t i = 0; i < r.measurements.size(); ++i) {
      const auto &m = r.measurements[i];
      if (m.status != Status::ok || !same_fidelity(m.fidelity, 1.0) ||
          m.config == r.measurements[*r.winner].config)
        continue;
      if (!r.runner_up || m.median_us < r.measurements[*r.runner_up].median_us)
        r.runner_up = i;
    }
  return r;
}

// ---- cache ----

std::string default_cache_path() {
  if (const std::string &d = env_options().cache_dir; !d.empty())
    return (fs::path(d) / "tune-cache.jsonl").string();
  const char *home = std::getenv("HOME");
  return (fs::path(home && *home ? home : "/tmp") / ".cache" / "flashbench" / "tune-cache.jsonl")
      .string();
}

namespace {

// Append-only: one JSON object a line; the last line for a key wins. Torn lines (a killed run) are ignored.
class TuneCache {
public:
  explicit TuneCache(std::string path) : path_(std::move(path)) {
    if (path_.empty())
      return;
    std::ifstream is(path_);
    std::string line;
    while (std::getline(is, line)) {
      try {
        const auto j = nlohmann::json::parse(line);
        Measurement m;
        m.status = parse_status(j.at("status").get<std::string>());
        m.median_us = j.value("median_us", 0.0);
        m.tflops = j.value("tflops", 0.0);
        m.reason = j.value("reason", "");
        m.sm_clock_mhz = j.value("sm_clock_mhz", 0.0);
        entries_[j.at("key").get<std::string>()] = m;
      } catch (const std::exception &) {
      }
    }
  }
  bool enabled() const { return !path_.empty(); }
  const Measurement *find(const std::string &key) const {
    const auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second;
  }
  void add(const std::string &key, const Measurement &m, const nlohmann::json &about) {
    if (path_.empty())
      return;
    entries_[key] = m;
    const fs::path p(path_);
    if (p.has_parent_path())
      fs::create_directories(p.parent_path());
    nlohmann::json j = about;
    j["key"] = key;
    j["status"] = to_string(m.status);
    j["median_us"] = m.median_us;
    j["tflops"] = m.tflops;
    j["reason"] = m.reason;
    j["sm_clock_mhz"] = m.sm_clock_mhz;
    j["created"] = iso_now();
    std::ofstream os(path_, std::ios::app);
    os << j.dump() + "\n";
  }

private:
  std::string path_;
  std::map<std::string, Measurement> entries_;
};

Measurement measurement_from_record(const nlohmann::json &rec) {
  Measurement m;
  m.status = parse_status(rec.value("status", "crashed"));
  m.reason = rec.value("reason", "");
  if (rec.value("median_us", nlohmann::json()).is_number())
    m.median_us = rec["median_us"].get<double>();
  if (rec.value("tflops", nlohmann::json()).is_number())
    m.tflops = rec["tflops"].get<double>();
  m.seconds = rec.value("wall_s", 0.0);
  if (rec.value("sm_clock_mhz", nlohmann::json()).is_number())
    m.sm_clock_mhz = rec["sm_clock_mhz"].get<double>();
  return m;
}

std::string fmt(const char *f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

} // namespace

// ---- the command ----

int run_tune(const SweepSpec &spec, const TuneOptions &o, std::ostream &os) {
  const auto started = std::chrono::steady_clock::now();
  const DeviceInfo dev = o.fake_worker ? nominal_device() : query_device(o.gpus.front());
  const std::string out_path = o.output_path.empty() ? tuning_path_for(dev) : o.output_path;
  TuningTable table;
  if (fs::exists(out_path)) {
    table = load_tuning_table(out_path);
    const std::string name = table.gpu.value("name", "");
    if (!name.empty() && name != dev.name)
      throw UserError(out_path + " is the tuning table of " + name + ", not " + dev.name +
                      "; give -o tuning/" + dev.slug() + ".json");
  }
  table.gpu = {{"name", dev.name},
               {"slug", dev.slug()},
               {"sm_count", dev.sm_count},
               {"cc", dev.cc()},
               {"driver_version", dev.driver_version},
               {"runtime_version", dev.runtime_version}};
  table.build_id = build_id();
  TuneCache cache(o.cache_path);
  nlohmann::json identity = {{"gpu", dev.name},
                             {"sm_count", dev.sm_count},
                             {"driver", dev.driver_version},
                             {"runtime", dev.runtime_version},
                             {"build", portable_build_id()},
                             {"fake", o.fake_worker}};
  // Options that change what a sample measures (a test slowdown, the stream hold) key the cache too, so that a
  // measurement taken under one is never served to a run without it. Absent when none is set: older keys stay.
  if (const std::string opt = timing_options_key(env_options()); !opt.empty())
    identity["options"] = opt;

  SupervisorOptions so;
  so.devices = o.gpus;
  so.point_timeout_s = spec.timing.point_timeout_s;
  so.verbose = o.verbose;
  so.worker_args = [&](int, bool) {
    std::vector<std::string> a = {"--no-counters"};
    if (o.fake_worker)
      a.insert(a.end(), {"--fake", "--fake-delay-ms", std::to_string(o.fake_delay_ms)});
    return a;
  };
  std::unique_ptr<Supervisor> supervisor; // started at the first measurement the cache cannot serve

  nlohmann::json report = {{"strategy", o.strategy}, {"budget", o.budget},
                           {"seed", o.seed},         {"device", dev},
                           {"build_id", build_id()}, {"results", nlohmann::json::array()}};
  report["machine"] = query_machine(dev);
  report["options"] = env_options();
  int measured = 0, from_cache = 0, without_winner = 0, clock_flagged = 0;
  double measure_s = 0;
  char line[512];
  std::snprintf(line, sizeof line, "%-13s %-40s %-10s %5s %6s  %-52s %8s %7s\n", "variant",
                "problem", "strategy", "cands", "evals", "best config", "TFLOPs", "margin");
  os << "tuning on " << dev.name << " (" << dev.slug() << "), strategy " << o.strategy << "\n"
     << line;

  for (const auto &sel : spec.variants) {
    const Variant *v = catalog().find(sel.variant);
    if (!v) {
      try {
        catalog().get(sel.variant);
      } catch (const UserError &e) {
        throw UserError(sel.where + ": " + e.what());
      }
    }
    std::vector<Config> space_configs;
    const bool listed = sel.mode == VariantSelection::Mode::list;
    if (listed) {
      check_config_maps(sel, *v); // completed per problem below
    } else {
      for (const auto &e : v->space().expand())
        if (!e.invalid_reason)
          space_configs.push_back(e.config);
    }
    for (const auto &p : spec.problems) {
      // A problem of the other pass has nothing to tune for this variant (a spec may mix fwd and bwd): said once,
      // and not counted as a problem without an eligible config.
      if (p.pass != v->pass()) {
        os << v->name() << " on " << key(p) << ": not tuned ("
           << support_for(*v, p, v->space().default_config(), dev).reason << ")\n";
        continue;
      }
      std::vector<Config> candidates;
      nlohmann::json rejected = nlohmann::json::array();
      if (listed) { // a spec's maps, completed for this problem as a run's plan completes them
        space_configs.clear();
        for (const auto &m : sel.configs) {
          Config c = complete_config(*v, m, p, dev);
          if (std::find(space_configs.begin(), space_configs.end(), c) == space_configs.end())
            space_configs.push_back(std::move(c));
        }
      }
      for (const auto &c : space_configs) {
        std::string why;
        if (auto bad = v->space().check(c))
          why = *bad;
        else if (Support s = support_for(*v, p, c, dev); !s.ok)
          why = s.reason;
        if (why.empty())
          candidates.push_back(c);
        else
          rejected.push_back({{"config", v->space().to_string(c)}, {"reason", why}});
      }
      const Evaluator eval = [&](const std::vector<Trial> &trials) {
        std::vector<Measurement> res(trials.size());
        std::vector<std::string> keys(trials.size());
        std::vector<SupervisorTask> tasks;
        for (size_t i = 0; i < trials.size(); ++i) {
          const TimingPolicy policy = scaled_policy(spec.timing, trials[i].fidelity);
          nlohmann::json k = identity;
          k["variant"] = v->name();
          k["config"] = trials[i].config.params();
          k["problem"] = p;
          k["timing"] = policy;
          keys[i] = hash_hex(k.dump());
          if (const Measurement *hit = cache.find(keys[i])) {
            res[i] = *hit;
            res[i].cached = true;
            ++from_cache;
          } else {
            PlannedPoint pt{v, trials[i].config, p, std::nullopt, {}};
            tasks.push_back({i, task_payload(pt, policy, spec.timing.point_timeout_s), key(p)});
          }
          res[i].config = trials[i].config;
          res[i].fidelity = trials[i].fidelity;
        }
        if (!tasks.empty()) {
          if (!supervisor)
            supervisor = std::make_unique<Supervisor>(so);
          SupervisorCallbacks cb;
          cb.on_record = [&](size_t id, nlohmann::json rec) {
            Measurement m = measurement_from_record(rec);
            m.config = trials[id].config;
            m.fidelity = trials[id].fidelity;
            res[id] = m;
          };
          cb.on_lost = [&](size_t id, Status st, std::string reason) {
            res[id].status = st;
            res[id].reason = std::move(reason);
          };
          supervisor->run(tasks, cb);
          for (const auto &t : tasks) {
            const size_t i = t.id;
            ++measured;
            measure_s += res[i].seconds;
            if (o.verbose || res[i].status != Status::ok)
              os << "  " << v->name() << " " << v->space().to_string(res[i].config)
                 << " f=" << fmt("%.3f", res[i].fidelity) << ": " << to_string(res[i].status)
                 << (res[i].reason.empty() ? "" : " (" + res[i].reason + ")") << "\n";
            cache.add(keys[i], res[i],
                      {{"variant", v->name()},
                       {"config_str", v->space().to_string(res[i].config)},
                       {"problem_key", key(p)},
                       {"fidelity", res[i].fidelity}});
          }
        }
        return res;
      };
      const SearchResult sr =
          search_configs(v->space(), candidates, o.strategy, o.budget, o.seed, eval);

      nlohmann::json item = {{"variant", v->name()},
                             {"problem", p},
                             {"problem_key", key(p)},
                             {"strategy", o.strategy},
                             {"candidates", sr.candidates},
                             {"rejected", rejected},
                             {"evaluations", sr.evaluations},
                             {"configs_measured", sr.configs_measured},
                             {"measurements", nlohmann::json::array()}};
      double item_seconds = 0;
      int item_cached = 0;
      for (const auto &m : sr.measurements) {
        item_seconds += m.seconds;
        item_cached += m.cached;
        item["measurements"].push_back(
            {{"config", v->space().to_string(m.config)},
             {"fidelity", m.fidelity},
             {"status", to_string(m.status)},
             {"median_us", m.status == Status::ok ? nlohmann::json(m.median_us) : nlohmann::json()},
             {"tflops", m.status == Status::ok ? nlohmann::json(m.tflops) : nlohmann::json()},
             {"reason", m.reason},
             {"sm_clock_mhz", m.sm_clock_mhz},
             {"cached", m.cached}});
      }
      item["measure_seconds"] = item_seconds;
      item["cached_measurements"] = item_cached;
      std::string best = "(no eligible config)", tflops = "-", margin = "-";
      if (sr.winner) {
        const Measurement &w = sr.measurements[*sr.winner];
        TuningEntry e = make_entry_key(v->name(), p);
        e.config = w.config;
        e.config_str = v->space().to_string(w.config);
        e.tflops = w.tflops;
        e.median_us = w.median_us;
        if (sr.runner_up) {
          const Measurement &ru = sr.measurements[*sr.runner_up];
          e.runner_up = v->space().to_string(ru.config);
          e.margin = ru.median_us / w.median_us - 1;
          e.clock_spread = clock_spread(w, ru);
        }
        if (const auto h = variant_source_hashes().find(v->name());
            h != variant_source_hashes().end())
          e.source_hash = h->second;
        e.strategy = o.strategy;
        e.evaluations = sr.evaluations;
        e.candidates = sr.candidates;
        item["winner"] = {
            {"config", e.config_str}, {"median_us", e.median_us}, {"tflops", e.tflops}};
        item["runner_up"] = {
            {"config", e.runner_up}, {"margin", e.margin}, {"clock_spread", e.clock_spread}};
        best = e.config_str;
        tflops = fmt("%.1f", e.tflops);
        margin = sr.runner_up ? fmt("%+.1f%%", e.margin * 100) +
                                    (e.clock_spread > kClockSpreadFlag ? "*" : "")
                              : "-";
        clock_flagged += e.clock_spread > kClockSpreadFlag;
        table.upsert(std::move(e));
        // Saved after every entry: a tune cut short (a job's time limit, a lost machine) keeps what it finished,
        // and its measurements are in the cache for the rerun.
        save_tuning_table(out_path, table);
      } else {
        ++without_winner;
      }
      report["results"].push_back(item);
      std::snprintf(line, sizeof line, "%-13s %-40s %-10s %5d %6.2f  %-52s %8s %7s\n",
                    v->name().c_str(), key(p).c_str(), o.strategy.c_str(), sr.candidates,
                    sr.evaluations, best.c_str(), tflops.c_str(), margin.c_str());
      os << line << std::flush;
    }
  }
  if (clock_flagged)
    os << "* " << clock_flagged << " margin(s) between configs timed at SM clocks more than "
       << fmt("%.0f", kClockSpreadFlag * 100)
       << "% apart (a power cap): the order may be the clock's, not the code's; compare the two "
          "sample by sample "
          "in one loop (scripts/peers.py --ours with --interleave sample: README)\n";
  if (!table.entries.empty())
    save_tuning_table(out_path, table);
  os << measured << " measurements made (" << fmt("%.1f", measure_s) << " s of sampling), "
     << from_cache << " served from the cache"
     << (cache.enabled() ? " " + o.cache_path : std::string(" (cache off)")) << "\n";
  os << "tuning table: " << out_path << " (" << table.entries.size() << " entries), "
     << fmt("%.0f",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count())
     << " s in all\n";
  report["measurements_made"] = measured;
  report["workers_started"] = supervisor ? supervisor->workers_started() : 0;
  report["wall_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  report["served_from_cache"] = from_cache;
  report["measure_seconds"] = measure_s;
  report["table"] = out_path;
  report["machine"]["end"] = query_machine_state(dev.pci_bus_id);
  if (!o.report_path.empty())
    write_atomically(o.report_path, report.dump(1) + "\n");
  return without_winner ? 1 : 0;
}

} // namespace fb
