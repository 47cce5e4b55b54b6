// flashbench merge: shard results files of one plan and one source build joined into one file.
#include "commands.hpp"

#include "flashbench/results.hpp"
#include "flashbench/sweep.hpp"

#include <iostream>
#include <memory>
#include <vector>

namespace fb::cli {

namespace {
struct MergeArgs {
  std::vector<std::string> inputs;
  std::string output;
  bool allow_missing = false, force = false;
};
} // namespace

Command add_merge(CLI::App &app, const Globals &) {
  auto *sub = app.add_subcommand("merge",
                                 "join shard result files (same spec, same source build) into one");
  auto a = std::make_shared<MergeArgs>();
  sub->add_option("inputs", a->inputs, "shard result files")->required();
  sub->add_option("-o,--output", a->output, "merged results file")->required();
  sub->add_flag("--allow-missing", a->allow_missing, "merge even when some shards are absent");
  sub->add_flag("--force", a->force, "replace an existing merged file");
  return {sub, [a] {
            check_output_path(a->output, "-o", a->force,
                              "pass --force to replace it, or choose another -o");
            merge_results(a->inputs, a->output, a->allow_missing, std::cout);
            return 0;
          }};
}

} // namespace fb::cli
