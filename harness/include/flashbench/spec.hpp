// Sweep specs (YAML): which problems, which variants and configs, and the timing policy. Every error names
// file:line:column, what is wrong and what to do.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/device.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/timing.hpp"
#include "flashbench/variant.hpp"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace fb {

struct VariantSelection {
  std::string variant;
  // tuned: per problem, the tuning table's config for this GPU (tuner.hpp), else the default config.
  enum class Mode { all, default_config, list, tuned } mode = Mode::default_config;
  std::vector<std::map<std::string, std::string>> configs; // Mode::list: name -> value or label
  // Names of problem entries ('name:' or 'preset:') this variant runs on; empty: every problem of the spec.
  std::vector<std::string> problems;
  std::string where; // "file:line:col" of the entry, for error messages
};

struct SweepSpec {
  std::string name;
  std::string path;
  TimingPolicy timing;
  std::vector<AttentionProblem> problems; // expanded, validated, de-duplicated, in spec order
  std::vector<std::set<std::string>>
      problem_entries; // per problem: the names of the entries that gave it
  std::vector<VariantSelection> variants;
};

// A Mode::list selection's config maps, their axis names and values checked against v's space (each problem
// completes them later: complete_config, dispatch.hpp). Throws UserError naming the entry (sel.where).
void check_config_maps(const VariantSelection &sel, const Variant &v);

// Throws UserError("<file>:<line>:<col>: <what>; <what to do>").
SweepSpec parse_spec(const std::string &yaml_text, const std::string &path_for_messages);
SweepSpec load_spec(const std::string &path);

// One (variant, config, problem) with the reason it will not run, if any (config invalid, problem unsupported).
struct PlannedPoint {
  const Variant *variant = nullptr;
  Config config;
  AttentionProblem problem;
  std::optional<std::string> skip_reason;
  std::string
      config_source; // configs: tuned: which table entry chose the config, or why the default was used
  double model_bytes =
      -1; // the variant's traffic model for this point on the planned device (-1: not computed)
  std::string model_reason;               // the model's regime (TrafficModel::reason)
  double model_low = -1, model_high = -1; // the range the regime leaves open (-1: none)
};

// Expands the spec against the catalog. Unknown variants or config names raise UserError; unsupported
// combinations become skipped points with a reason (never silently dropped).
std::vector<PlannedPoint> plan(const SweepSpec &spec, const Registry &registry,
                               const DeviceInfo &dev);

} // namespace fb
