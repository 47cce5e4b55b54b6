// flashbench: list | run | plan | check | probe | tune | merge | model | ncu-cmd | fp8-error (and the internal
// worker), one file each. Every user error is one line on stderr and exit code 2, raised before any output
// file is created.
#include "commands.hpp"

#include "flashbench/errors.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <vector>

int main(int argc, char **argv) {
  CLI::App app{"flashbench: verify, time and profile FlashAttention-style kernels"};
  app.require_subcommand(1);
  fb::cli::Globals g;
  g.argv0 = argv[0];
  app.add_option("--device", g.device, "CUDA device index")->check(CLI::NonNegativeNumber);
  const std::vector<fb::cli::Command> commands = {
      fb::cli::add_list(app, g),  fb::cli::add_run(app, g),      fb::cli::add_ncu_cmd(app, g),
      fb::cli::add_plan(app, g),  fb::cli::add_check(app, g),    fb::cli::add_worker(app, g),
      fb::cli::add_merge(app, g), fb::cli::add_tune(app, g),     fb::cli::add_probe(app, g),
      fb::cli::add_model(app, g), fb::cli::add_fp8_error(app, g)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp &e) {
    return app.exit(e);
  } catch (const CLI::ParseError &e) {
    std::fprintf(stderr, "flashbench: error: %s; run 'flashbench --help'\n", e.what());
    return fb::kExitUserError;
  }

  try {
    for (const auto &c : commands)
      if (*c.app)
        return c.run();
  } catch (const fb::UserError &e) {
    std::fprintf(stderr, "flashbench: error: %s\n", e.what());
    return fb::kExitUserError;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "flashbench: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
