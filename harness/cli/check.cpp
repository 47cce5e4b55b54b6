// flashbench check: every variant x config against the reference on built-in awkward shapes (needs
// a GPU).
#include "commands.hpp"

#include "flashbench/device.hpp"
#include "flashbench/sweep.hpp"
#include "flashbench/variant.hpp"

#include <cstdio>
#include <iostream>
#include <memory>
#include <vector>

namespace fb::cli {

Command add_check(CLI::App &app, const Globals &g) {
  auto *sub = app.add_subcommand(
      "check", "correctness of every variant x config on built-in awkward shapes");
  auto only = std::make_shared<std::vector<std::string>>();
  sub->add_option("--variant", *only, "only these variants");
  auto configs = std::make_shared<std::string>("all");
  sub->add_option("--configs", *configs,
                  "all (every valid config) | default (each shape's default config)")
      ->check(CLI::IsMember({"all", "default"}));
  return {sub, [only, configs, &g] {
            for (const auto &n : *only)
              catalog().get(n); // unknown names are user errors
            if (device_count() <= g.device) {
              std::fprintf(stderr, "flashbench: no CUDA device found; 'check' needs a GPU\n");
              return kExitNoDevice;
            }
            return run_check(g.device, *only, std::cout, *configs == "default");
          }};
}

} // namespace fb::cli
