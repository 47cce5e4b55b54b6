// flashbench plan: a spec's expanded problems as JSON (for scripts/peers.py), each with the
// harness's key, FLOPs, minimum bytes and verification tolerance, so that Python's copy of the
// problem math can be checked against this.
#include "commands.hpp"

#include "flashbench/spec.hpp"
#include "flashbench/verify.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

namespace fb::cli {

Command add_plan(CLI::App &app, const Globals &) {
  auto *sub =
      app.add_subcommand("plan", "print a spec's expanded problems as JSON (for scripts/peers.py)");
  auto spec_path = std::make_shared<std::string>();
  sub->add_option("spec", *spec_path, "sweep spec (YAML)")->required();
  return {sub, [spec_path] {
            const SweepSpec spec = load_spec(*spec_path);
            nlohmann::json j;
            j["spec"] = {{"name", spec.name}, {"path", spec.path}};
            j["problems"] = spec.problems;
            // Beside the problems, not inside them: readers take each problem object as given.
            nlohmann::json derived = nlohmann::json::array();
            for (const auto &p : spec.problems) {
              nlohmann::json tol;
              if (p.pass == Pass::bwd) { // the gradients' bound (verify.hpp, GradTolerance)
                const GradTolerance t = grad_tolerance_for(p.dtype);
                tol = {{"atol", t.atol}, {"rtol", t.rtol},   {"rel_l2", t.rel_l2},
                       {"term", t.term}, {"floor", t.floor}, {"p_round", 0.0}};
              } else {
                const Tolerance t = tolerance_for(p.dtype);
                tol = {{"atol", t.atol},
                       {"rtol", t.rtol},
                       {"rel_l2", t.rel_l2},
                       {"p_round", t.p_round}};
              }
              derived.push_back({{"key", key(p)},
                                 {"flops", flops(p)},
                                 {"bytes_min", min_bytes(p)},
                                 {"kv_bytes", kv_bytes(p)},
                                 {"tolerance", tol}});
            }
            j["derived"] = derived;
            j["timing_policy"] = spec.timing;
            std::printf("%s\n", j.dump(1).c_str());
            return 0;
          }};
}

} // namespace fb::cli
