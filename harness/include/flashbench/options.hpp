// The environment options flashbench reads. Each is documented here, read once per process,
// written into every results file's context (context.options) and, where it can change a timing,
// into the tune-cache key. Workers inherit the supervisor's environment, so they read the same.
//
// FLASHBENCH_TUNING_DIR=DIR
//     Where tuning tables (GPU-SLUG.json) are read and written; default: the source tree's tuning/.
// FLASHBENCH_CACHE_DIR=DIR
//     Where `flashbench tune` keeps tune-cache.jsonl; default: $HOME/.cache/flashbench.
// FLASHBENCH_TEST_SLOWDOWN=VARIANT:FRACTION
//     Test only. Each timed sample of VARIANT is made FRACTION slower (0 < FRACTION <= 1; 0.03 is
//     3%) by a calibrated GPU spin queued after the variant's launch, to check a regression gate
//     end to end. Verification and counters are untouched.
// FLASHBENCH_NO_STREAM_HOLD=1
//     Time without holding the stream behind a spinning kernel: the method for tools that
//     serialise launches, such as Nsight Compute.
// FLASHBENCH_SIMULATE_CUPTI_FAILURE=REASON
//     Test only. Hardware counters report themselves unavailable with REASON.
// FLASHBENCH_TEST_VARIANTS=1
//     Test only. The catalog also lists the test_* variants that fail on purpose.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <string>

namespace fb {

struct EnvOptions {
  std::string tuning_dir;
  std::string cache_dir;
  std::string test_slowdown_variant; // empty: no slowdown
  double test_slowdown_fraction = 0;
  bool no_stream_hold = false;
  std::string simulate_cupti_failure; // empty: no simulation
  bool test_variants = false;

  // The slowdown fraction for `variant` (0 when it is not the slowed one).
  double slowdown_for(const std::string &variant) const;
};

// Parses the options from `lookup` (a getenv); throws UserError naming the variable for a malformed
// value.
EnvOptions parse_env_options(const std::function<const char *(const char *)> &lookup);
// The process's options, read from the environment on the first call.
const EnvOptions &env_options();
// Reads them again: for tests that set or unset a variable in their own process (every test binary's tests share
// one process when it is run by hand rather than by ctest). Not for use while other threads read them.
void reload_env_options();

// Every option by its variable name: its value, or null when unset. For the results context.
void to_json(nlohmann::json &j, const EnvOptions &o);
// The options that change what a timing measures, as a short string for cache keys ("" when none is
// set).
std::string timing_options_key(const EnvOptions &o);

// Test slowdown: the GPU spin (ns) that makes a sample of base_us take (1 + fraction) x base_us,
// when queueing the spin itself costs overhead_us (a launch and its gap); 0 when the overhead alone
// reaches the target.
double slowdown_spin_ns(double base_us, double overhead_us, double fraction);

} // namespace fb
