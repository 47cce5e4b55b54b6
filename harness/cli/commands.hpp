// The flashbench subcommands, one file each (list.cpp, run.cpp, ...). Each add_* registers its
// options on the app and returns the subcommand with the function that runs it; main.cpp parses and
// dispatches. A command throws UserError for what the user must fix (main prints it as one line,
// exit 2); every output path is checked before any device is touched (check_output in results.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

namespace fb::cli {

constexpr int kExitNoDevice = 3;

// Options every subcommand shares.
struct Globals {
  int device = 0;    // --device
  std::string argv0; // this executable, as invoked (ncu-cmd prints it)
};

struct Command {
  CLI::App *app = nullptr;
  std::function<int()> run;
};

Command add_list(CLI::App &app, const Globals &g);
Command add_run(CLI::App &app, const Globals &g);
Command add_plan(CLI::App &app, const Globals &g);
Command add_check(CLI::App &app, const Globals &g);
Command add_probe(CLI::App &app, const Globals &g);
Command add_tune(CLI::App &app, const Globals &g);
Command add_merge(CLI::App &app, const Globals &g);
Command add_model(CLI::App &app, const Globals &g);
Command add_worker(CLI::App &app, const Globals &g);
Command add_ncu_cmd(CLI::App &app, const Globals &g);
Command add_fp8_error(CLI::App &app, const Globals &g);

} // namespace fb::cli
