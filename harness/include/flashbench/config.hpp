// Config and ConfigSpace: the named integer parameters of a variant (block_m, block_n, warps, ...) and the axes
// they range over. Enumerated axes (warp_layout: split_q | split_k) keep integer values with labels, so a config is
// always a flat map of integers and prints with labels.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fb {

struct AttentionProblem;
struct DeviceInfo;

struct Axis {
  std::string name;
  std::vector<int64_t> values;
  std::vector<std::string> labels; // empty for numeric axes; else one label per value
  std::string help;

  std::string label_of(int64_t value) const;
  int64_t value_of(const std::string &label) const; // throws UserError
};

class Config {
public:
  Config() = default;
  explicit Config(std::map<std::string, int64_t> params) : params_(std::move(params)) {}

  int64_t get(const std::string &name) const; // throws std::out_of_range naming the parameter
  int64_t get_or(const std::string &name, int64_t fallback) const;
  void set(const std::string &name, int64_t value) { params_[name] = value; }
  bool has(const std::string &name) const { return params_.count(name) != 0; }
  const std::map<std::string, int64_t> &params() const { return params_; }
  bool empty() const { return params_.empty(); }
  bool operator==(const Config &) const = default;
  bool operator<(const Config &o) const { return params_ < o.params_; }

private:
  std::map<std::string, int64_t> params_;
};

class ConfigSpace {
public:
  // Returns a reason when a combination is invalid by construction (not device-dependent).
  using Constraint = std::function<std::optional<std::string>(const Config &)>;
  // A variant's default for one problem on one device: the base default with the axes that the problem's
  // head_dim, dtype, causality or length (or the device's shared memory) decide changed. Documented in the
  // variant's traits.hpp; it must give a config the variant supports wherever any config is supported
  // (tests/kernels/test_default_configs.cpp checks the whole support matrix).
  using DefaultRule =
      std::function<Config(Config base, const AttentionProblem &, const DeviceInfo &)>;

  ConfigSpace() = default;
  ConfigSpace(std::vector<Axis> axes, Config default_config, Constraint constraint = nullptr,
              DefaultRule default_rule = nullptr);

  const std::vector<Axis> &axes() const { return axes_; }
  // The base default: every axis at the value the variant's common problems (bf16 d128 prefill, or decode for a
  // decode variant) run best with. What `list` prints and what make() fills unnamed axes from.
  const Config &default_config() const { return default_; }
  // The default for p on dev: what `configs: default`, the dispatcher, `configs: tuned` without an entry, the
  // C API's "default" and `check` use. The base default where the variant has no rule.
  Config default_config(const AttentionProblem &p, const DeviceInfo &dev) const;
  // The same rule applied to `seed` in place of the base default, so that a rule may read axes a caller named
  // (deterministic, say) when it picks the others: complete_config (dispatch.hpp).
  Config default_config(const Config &seed, const AttentionProblem &p, const DeviceInfo &dev) const;
  const Axis *axis(const std::string &name) const;

  // Cartesian product of the axes, in axis order; each combination with the constraint's verdict.
  struct Entry {
    Config config;
    std::optional<std::string> invalid_reason;
  };
  std::vector<Entry> expand() const;
  size_t size() const;

  // Builds a config from user-given name -> value-or-label, filling unspecified axes from the default.
  // Throws UserError for unknown names, unknown labels, or values not on the axis.
  Config make(const std::map<std::string, std::string> &given) const;
  // The same, filling unspecified axes from `base` (e.g. default_config(p, dev)).
  Config make(const std::map<std::string, std::string> &given, const Config &base) const;
  std::optional<std::string> check(const Config &c) const;

  // "block_m=64,block_n=64,warp_layout=split_q"
  std::string to_string(const Config &c) const;
  nlohmann::json to_json(const Config &c) const;

private:
  std::vector<Axis> axes_;
  Config default_;
  Constraint constraint_;
  DefaultRule default_rule_;
};

// "a=1,b=on" -> {{a, 1}, {b, on}}, in order: the command line's --shape and --config, and the C API's config.
// Throws UserError "<what>: '<item>' is not name=value; e.g. <example>" for an item without a name and '='.
std::vector<std::pair<std::string, std::string>>
parse_assignments(const std::string &text, const std::string &what, const std::string &example);

} // namespace fb
