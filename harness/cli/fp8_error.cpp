// flashbench fp8-error: FP8 attention's error on inputs with outliers, with and without incoherent processing
// (the Hadamard rotation of Q and K), and the rotation's cost (fp8_error.hpp; docs/fp8.md).
#include "commands.hpp"

#include "flashbench/device.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/fp8_error.hpp"
#include "flashbench/results.hpp"
#include "flashbench/spec.hpp"
#include "flashbench/variant.hpp"
#include "options.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>

namespace fb::cli {

namespace {

struct Fp8ErrorArgs {
  std::string output, variant = "fa3_fp8";
  std::vector<std::string> shapes;
  uint64_t seed = 0;
  bool seed_given = false;
  OutlierSpec outliers;
};

// --shape as for run, in e4m3: a shape that names no dtype is e4m3; one that names another is refused.
std::vector<AttentionProblem> problems_from(const Fp8ErrorArgs &a) {
  if (a.shapes.empty())
    return default_fp8_error_problems();
  std::vector<AttentionProblem> out;
  for (const std::string &shape : a.shapes) {
    const bool names_dtype = shape.find("dtype=") != std::string::npos;
    const std::string s = names_dtype ? shape : shape + ",dtype=e4m3";
    for (AttentionProblem p : parse_spec(quick_spec_yaml(a.variant, s, ""), "--shape").problems) {
      if (p.dtype != DType::e4m3)
        throw UserError("--shape " + shape +
                        ": fp8-error measures e4m3 inputs; drop dtype or use "
                        "dtype=e4m3");
      p.quant = Quant::block; // both quantizations are measured
      out.push_back(p);
    }
  }
  return out;
}

int fp8_error(const Fp8ErrorArgs &a, const Globals &g) {
  validate(a.outliers);
  catalog().get(a.variant); // an unknown name is bad input, before any device
  Fp8ErrorOptions o;
  o.variant = a.variant;
  o.problems = problems_from(a);
  o.outliers = a.outliers;
  o.timing = fp8_error_timing_policy();
  o.seed = a.seed_given
               ? a.seed
               : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  if (!a.output.empty())
    check_output_path(a.output, "-o", true, "");
  if (device_count() <= g.device) {
    std::fprintf(stderr, "flashbench: no CUDA device found; 'fp8-error' needs a GPU\n");
    return kExitNoDevice;
  }
  // The file is rewritten after each row, so that a run cut short (a job's time limit, a lost machine) keeps its
  // finished rows; "complete" says whether it got through.
  const auto write = [&](const nlohmann::json &doc) {
    const std::string tmp = a.output + ".tmp";
    {
      std::ofstream os(tmp);
      os << doc.dump(2) << "\n";
      if (!os)
        throw UserError("cannot write " + tmp + "; check the directory and the free space");
    }
    std::filesystem::rename(tmp, a.output);
  };
  std::function<void(const nlohmann::json &)> on_rows;
  if (!a.output.empty())
    on_rows = write;
  const nlohmann::json doc = run_fp8_error(o, g.device, std::cout, on_rows);
  if (!a.output.empty()) {
    write(doc);
    std::printf("wrote %s\n", a.output.c_str());
  }
  return 0;
}

} // namespace

Command add_fp8_error(CLI::App &app, const Globals &g) {
  auto *sub = app.add_subcommand(
      "fp8-error", "FP8 attention error on inputs with outliers, with and without the Hadamard "
                   "rotation of Q and K, and the rotation's cost (needs a GPU)");
  auto a = std::make_shared<Fp8ErrorArgs>();
  sub->add_option("-o,--output", a->output,
                  "also write the rows as JSON here (replaced if present)");
  sub->add_option("--shape", a->shapes,
                  "a problem as for run --shape (e4m3; repeatable); default: d128 N 2048-16384 "
                  "causal and not, GQA 32/8, d64 and d256");
  sub->add_option("--variant", a->variant, "the FP8 variant to run (its default config)");
  sub->add_option("--seed", a->seed, "input seed (default: fresh; recorded)")
      ->each([a](const std::string &) { a->seed_given = true; });
  sub->add_option(
      "--outliers", a->outliers.kind,
      "normal: the FlashAttention-3 paper's N(0,1) + N(0,scale^2) Bernoulli(fraction) in Q, "
      "K and V (default); uniform: elements of Q and K replaced by +-U(min, max)");
  sub->add_option("--outlier-fraction", a->outliers.fraction,
                  "probability that an element is an outlier (default 0.001)");
  sub->add_option("--outlier-scale", a->outliers.scale,
                  "normal: the added term's standard deviation (default 10)");
  sub->add_option("--outlier-min", a->outliers.lo, "uniform: smallest magnitude (default 20)");
  sub->add_option("--outlier-max", a->outliers.hi, "uniform: largest magnitude (default 100)");
  return {sub, [a, &g] { return fp8_error(*a, g); }};
}

} // namespace fb::cli
