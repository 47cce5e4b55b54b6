#include "flashbench/options.hpp"

#include "flashbench/errors.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace fb {

namespace {

std::string get(const std::function<const char *(const char *)> &lookup, const char *name) {
  const char *v = lookup(name);
  return v ? std::string(v) : std::string();
}

bool flag(const std::function<const char *(const char *)> &lookup, const char *name) {
  const std::string v = get(lookup, name);
  if (v.empty() || v == "0")
    return false;
  if (v == "1")
    return true;
  throw UserError(std::string(name) + "=" + v + " is not a switch; set it to 1 (on) or unset it");
}

} // namespace

double EnvOptions::slowdown_for(const std::string &variant) const {
  return !test_slowdown_variant.empty() && variant == test_slowdown_variant ? test_slowdown_fraction
                                                                            : 0.0;
}

EnvOptions parse_env_options(const std::function<const char *(const char *)> &lookup) {
  EnvOptions o;
  o.tuning_dir = get(lookup, "FLASHBENCH_TUNING_DIR");
  o.cache_dir = get(lookup, "FLASHBENCH_CACHE_DIR");
  o.no_stream_hold = flag(lookup, "FLASHBENCH_NO_STREAM_HOLD");
  o.simulate_cupti_failure = get(lookup, "FLASHBENCH_SIMULATE_CUPTI_FAILURE");
  o.test_variants = flag(lookup, "FLASHBENCH_TEST_VARIANTS");
  const std::string slow = get(lookup, "FLASHBENCH_TEST_SLOWDOWN");
  if (!slow.empty()) {
    const auto colon = slow.find(':');
    const std::string bad =
        "FLASHBENCH_TEST_SLOWDOWN=" + slow +
        " is not VARIANT:FRACTION; give e.g. fa2_q_outer:0.03 for 3% slower samples of fa2_q_outer";
    if (colon == std::string::npos || colon == 0)
      throw UserError(bad);
    const std::string frac = slow.substr(colon + 1);
    char *end = nullptr;
    const double f = std::strtod(frac.c_str(), &end);
    if (frac.empty() || *end != '\0' || !std::isfinite(f) || f <= 0 || f > 1)
      throw UserError(bad);
    o.test_slowdown_variant = slow.substr(0, colon);
    o.test_slowdown_fraction = f;
  }
  return o;
}

namespace {
EnvOptions read_env() {
  return parse_env_options([](const char *n) { return std::getenv(n); });
}
EnvOptions &env_storage() {
  static EnvOptions o = read_env();
  return o;
}
} // namespace

const EnvOptions &env_options() { return env_storage(); }

void reload_env_options() { env_storage() = read_env(); }

void to_json(nlohmann::json &j, const EnvOptions &o) {
  auto str = [](const std::string &s) { return s.empty() ? nlohmann::json() : nlohmann::json(s); };
  j = nlohmann::json{
      {"FLASHBENCH_TUNING_DIR", str(o.tuning_dir)},
      {"FLASHBENCH_CACHE_DIR", str(o.cache_dir)},
      {"FLASHBENCH_TEST_SLOWDOWN", o.test_slowdown_variant.empty()
                                       ? nlohmann::json()
                                       : nlohmann::json{{"variant", o.test_slowdown_variant},
                                                        {"fraction", o.test_slowdown_fraction}}},
      {"FLASHBENCH_NO_STREAM_HOLD", o.no_stream_hold},
      {"FLASHBENCH_SIMULATE_CUPTI_FAILURE", str(o.simulate_cupti_failure)},
      {"FLASHBENCH_TEST_VARIANTS", o.test_variants}};
}

std::string timing_options_key(const EnvOptions &o) {
  std::string k;
  if (!o.test_slowdown_variant.empty())
    k += "slowdown=" + o.test_slowdown_variant + ":" +
         nlohmann::json(o.test_slowdown_fraction).dump() + ";";
  if (o.no_stream_hold)
    k += "no_stream_hold;";
  return k;
}

double slowdown_spin_ns(double base_us, double overhead_us, double fraction) {
  const double extra_us = fraction * base_us - std::max(0.0, overhead_us);
  return extra_us > 0 ? extra_us * 1e3 : 0.0;
}

} // namespace fb
