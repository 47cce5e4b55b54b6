// flashbench model: this build's traffic model for every point of a results file, on the device the file recorded
// (context.device: L2 size, SMs, shared memory, registers). The models change with the code while measured bytes do
// not, so scripts/model_check.py compares a file's measured DRAM bytes with these, not with the bytes_model the
// file was written with.
#include "commands.hpp"

#include "flashbench/device.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/results.hpp"
#include "flashbench/traffic.hpp"
#include "flashbench/variant.hpp"
#include "flashbench/version.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>

namespace fb::cli {

namespace {

struct ModelArgs {
  std::string input, output;
  bool force = false;
};

// The record's config as the user-facing name -> value-or-label map that ConfigSpace::make takes.
std::map<std::string, std::string> given_config(const nlohmann::json &config) {
  std::map<std::string, std::string> given;
  for (const auto &[k, v] : config.items())
    given[k] = v.is_string() ? v.get<std::string>() : v.dump();
  return given;
}

nlohmann::json model_points(const nlohmann::json &doc, const DeviceInfo &dev,
                            const std::string &path) {
  nlohmann::json points = nlohmann::json::array();
  size_t index = 0;
  for (const auto &rec : doc.at("benchmarks")) {
    const std::string where = path + ": benchmarks[" + std::to_string(index++) + "]";
    nlohmann::json out;
    out["name"] = rec.value("name", std::string());
    const std::string name = rec.value("variant", std::string());
    out["variant"] = name;
    const Variant *v = catalog().find(name);
    if (!v) { // a peer's record (cuDNN, torch SDPA): no traffic model of ours
      out["bytes_model"] = nullptr;
      out["bytes_model_reason"] = "not a variant of this build's catalog";
      points.push_back(out);
      continue;
    }
    AttentionProblem p;
    Config c;
    try {
      p = rec.at("problem").get<AttentionProblem>();
      c = v->space().make(given_config(rec.value("config", nlohmann::json::object())));
    } catch (const UserError &e) {
      throw UserError(where + ": " + e.what());
    } catch (const nlohmann::json::exception &e) {
      throw UserError(where + ": " + e.what() + "; give a results file that flashbench wrote");
    }
    const TrafficModel m = traffic_model(*v, p, c, dev);
    out["bytes_min"] = min_bytes(p);
    out["bytes_model"] = m.bytes;
    out["bytes_model_reason"] = m.reason;
    if (m.has_range())
      out["bytes_model_range"] = {m.low, m.high};
    points.push_back(out);
  }
  return points;
}

} // namespace

Command add_model(CLI::App &app, const Globals &) {
  auto *sub = app.add_subcommand(
      "model", "this build's traffic model (bytes, regime, range) for every point of a results "
               "file, on the device the file recorded");
  auto a = std::make_shared<ModelArgs>();
  sub->add_option("results", a->input, "results file (flashbench run)")->required();
  sub->add_option("-o,--output", a->output,
                  "write the models as JSON here (default: a table on stdout)");
  sub->add_flag("--force", a->force, "replace an existing -o file");
  return {sub, [a] {
            if (!a->output.empty())
              check_output_path(a->output, "-o", a->force,
                                "pass --force to replace it, or choose another -o");
            const nlohmann::json doc = read_results_file(a->input);
            const nlohmann::json *device = nullptr;
            if (doc.contains("context") && doc["context"].contains("device"))
              device = &doc["context"]["device"];
            if (!device)
              throw UserError(a->input + ": no context.device; the traffic models need the device "
                                         "the results were measured on");
            const DeviceInfo dev = device_from_json(*device, a->input + ": context.device");
            const nlohmann::json points = model_points(doc, dev, a->input);
            if (a->output.empty()) {
              std::printf("%-90s %10s %10s  %s\n", "point", "model MB", "min MB", "regime");
              for (const auto &pt : points) {
                if (pt["bytes_model"].is_null())
                  continue;
                std::printf("%-90s %10.1f %10.1f  %s\n", pt["name"].get<std::string>().c_str(),
                            pt["bytes_model"].get<double>() / 1e6,
                            pt["bytes_min"].get<double>() / 1e6,
                            pt["bytes_model_reason"].get<std::string>().c_str());
              }
              return 0;
            }
            nlohmann::json j;
            j["source"] = a->input;
            j["device"] = *device;
            j["model_build"] = {{"version", version()},
                                {"source_sha", git_sha()},
                                {"options", build_options()},
                                {"toolkit", toolkit()}};
            j["points"] = points;
            const std::string tmp = a->output + ".tmp";
            {
              std::ofstream os(tmp);
              os << j.dump(1) << "\n";
              if (!os.flush())
                throw UserError(a->output + ": cannot write (disk full?); choose another -o");
            }
            if (std::rename(tmp.c_str(), a->output.c_str()) != 0) {
              std::remove(tmp.c_str());
              throw UserError(a->output + ": cannot write; choose another -o");
            }
            return 0;
          }};
}

} // namespace fb::cli
