// The nightly specs guard every catalog variant: each has points that run (not only skipped ones)
// on Hopper.
#include "flashbench/device.hpp"
#include "flashbench/spec.hpp"
#include "kernels/catalog.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace fb;

namespace {

// Every variant of the catalog (the test-only ones are registered only under FLASHBENCH_TEST_VARIANTS), so that a
// variant added to the catalog fails these tests until the nightly specs guard it too.
std::vector<std::string> every_variant() { return catalog().names(); }

std::map<std::string, int> runnable_points(const std::string &rel) {
  const SweepSpec s = load_spec(std::string(FLASHBENCH_SOURCE_DIR) + "/" + rel);
  std::map<std::string, int> n;
  for (const auto &pt : plan(s, catalog(), nominal_device())) // nominal: an H100 SXM
    if (!pt.skip_reason)
      ++n[pt.variant->name()];
  return n;
}

std::string run_dry(const std::string &rel) {
  const std::string cmd = std::string(FLASHBENCH_BIN) + " run --dry-run " +
                          std::string(FLASHBENCH_SOURCE_DIR) + "/" + rel + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE *)> p(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p.get()))
    out += buf;
  return out;
}

} // namespace

TEST(NightlySpec, GuardsEveryVariant) {
  const auto n = runnable_points("sweeps/nightly.yaml");
  for (const std::string &v : every_variant())
    EXPECT_GT(n.count(v) ? n.at(v) : 0, 0) << v << " has no runnable point";
}

TEST(NightlySpec, DispatchedVariantsRunAtTheDefaultAndTunedConfigs) {
  const SweepSpec s = load_spec(std::string(FLASHBENCH_SOURCE_DIR) + "/sweeps/nightly.yaml");
  std::map<std::string, std::set<std::string>> configs;
  std::map<std::string, std::set<std::string>>
      defaults_run; // "problem key|config" of the runnable points
  const DeviceInfo dev = nominal_device();
  for (const auto &pt : plan(s, catalog(), dev))
    if (!pt.skip_reason) {
      const std::string c = pt.variant->space().to_string(pt.config);
      configs[pt.variant->name()].insert(c);
      defaults_run[pt.variant->name()].insert(key(pt.problem) + "|" + c);
    }
  for (const char *v : {"fa3_pipelined", "fa2_q_outer", "flash_decoding"}) {
    const Variant &var = catalog().get(v);
    // Every problem the variant runs includes that problem's own default ({} in the spec).
    for (const auto &pt : plan(s, catalog(), dev))
      if (!pt.skip_reason && pt.variant == &var)
        EXPECT_TRUE(defaults_run[v].count(
            key(pt.problem) + "|" +
            var.space().to_string(var.space().default_config(pt.problem, dev))))
            << v << ": no default on " << key(pt.problem);
    EXPECT_GE(configs[v].size(), 2u) << v << ": the default only";
  }
}

TEST(NightlySpec, DryRunListsEveryVariant) {
  const std::string out = run_dry("sweeps/nightly.yaml");
  for (const std::string &v : every_variant())
    EXPECT_NE(out.find(v), std::string::npos) << v << " missing from:\n" << out;
}

TEST(NightlySpec, SmokeSpecCoversEveryVariantWithTwelvePoints) {
  const auto n = runnable_points("sweeps/ci/nightly-smoke.yaml");
  int total = 0;
  for (const std::string &v : every_variant()) {
    EXPECT_GT(n.count(v) ? n.at(v) : 0, 0) << v;
    total += n.count(v) ? n.at(v) : 0;
  }
  EXPECT_GE(total, 12);
}
