// flashbench ncu-cmd: the ncu command line that profiles one point of a run.
#include "commands.hpp"

#include "flashbench/errors.hpp"
#include "flashbench/sweep.hpp"
#include "flashbench/variant.hpp"
#include "options.hpp"

#include <cstdio>
#include <memory>

namespace fb::cli {

namespace {
struct NcuArgs {
  std::string variant, shape, config = "default", set = "full";
};
} // namespace

Command add_ncu_cmd(CLI::App &app, const Globals &g) {
  auto *sub =
      app.add_subcommand("ncu-cmd", "print the ncu command line that profiles one point of a run");
  auto a = std::make_shared<NcuArgs>();
  sub->add_option("--variant", a->variant, "variant")->required();
  sub->add_option("--shape", a->shape, "as for run --shape")->required();
  sub->add_option("--config", a->config, "one config, as for run --config");
  sub->add_option("--set", a->set, "ncu section set (full, detailed, basic)");
  return {
      sub, [a, &g] {
        if (a->config == "all")
          throw UserError("ncu-cmd profiles one point: give one --config, not 'all'");
        const SweepSpec spec =
            parse_spec(quick_spec_yaml(a->variant, a->shape, a->config), "<command line>");
        const auto points = plan(spec, catalog(), nominal_device());
        if (points.size() != 1)
          throw UserError("ncu-cmd needs exactly one point; the shape expands to " +
                          std::to_string(points.size()));
        Result r;
        r.variant = points[0].variant->name();
        r.config_str = points[0].variant->space().to_string(points[0].config);
        r.problem = points[0].problem;
        // One kernel per call for most variants; multi-kernel ones (naive: cuBLAS GEMMs + softmax)
        // need a larger --launch-count to cover a whole call.
        std::printf(
            "ncu --nvtx --nvtx-include 'flashbench@%s/time/' --launch-count 1 --cache-control all "
            "--clock-control none --set %s -o %s \\\n    %s run --variant %s --shape %s --config "
            "%s "
            "--no-counters --no-ceilings --timeout 2 --force -o /tmp/flashbench-ncu.json\n",
            nvtx_name(r).c_str(), a->set.c_str(), r.variant.c_str(), g.argv0.c_str(),
            r.variant.c_str(), a->shape.c_str(), a->config.c_str());
        return 0;
      }};
}

} // namespace fb::cli
