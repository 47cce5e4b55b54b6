// flashbench probe: device facts and measured ceilings (bf16 GEMM, device copy, read floor).
#include "commands.hpp"

#include "flashbench/check.hpp"
#include "flashbench/device.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/probe.hpp"
#include "flashbench/results.hpp"
#include "options.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

namespace fb::cli {

namespace {

struct ProbeArgs {
  std::string output;
  bool copy = false, no_counters = false;
  std::vector<std::string> read_floor;
};

int probe(const ProbeArgs &a, const Globals &g) {
  std::vector<size_t> read_sizes;
  for (const auto &t : a.read_floor)
    read_sizes.push_back(parse_byte_size(t, "--read-floor"));
  if (!a.output.empty())
    check_output_path(a.output, "-o", true, "");
  if (device_count() <= g.device) {
    std::fprintf(stderr, "flashbench: no CUDA device found; 'probe' needs a GPU\n");
    return kExitNoDevice;
  }
  FB_CUDA_CHECK(cudaSetDevice(g.device));
  const DeviceInfo dev = query_device(g.device);
  nlohmann::json j;
  j["device"] = dev;
  if (!a.read_floor.empty()) {
    j["read_floor"] = measure_read_floor(dev, read_sizes);
  } else if (a.copy) {
    const CopyProbe cp = run_copy_probe(dev, size_t(1) << 30, !a.no_counters);
    j["copy_kernel"] = {{"bytes_each_way", cp.bytes},
                        {"median_us", cp.median_us},
                        {"gbps", cp.gbps},
                        {"occupancy", cp.occupancy},
                        {"counters", summarize_counters(cp.counters)},
                        {"counters_reason", cp.counters.reason}};
  } else {
    j["ceilings"] = measure_ceilings(dev);
  }
  std::printf("%s\n", j.dump(2).c_str());
  if (!a.output.empty()) {
    std::ofstream os(a.output);
    os << j.dump(2) << "\n";
    if (!os)
      throw UserError("cannot write " + a.output + "; check the directory and the free space");
  }
  return 0;
}

} // namespace

Command add_probe(CLI::App &app, const Globals &g) {
  auto *sub =
      app.add_subcommand("probe", "device facts and measured ceilings (bf16 GEMM, device copy)");
  auto a = std::make_shared<ProbeArgs>();
  sub->add_option("-o,--output", a->output, "also write them as JSON here (replaced if present)");
  sub->add_flag("--copy-kernel", a->copy,
                "only the copy kernel, with its counters (the counters' sanity check)");
  sub->add_option("--read-floor", a->read_floor,
                  "only the read floor: fastest cold read of each size (bytes; K/M/G suffix = "
                  "KiB/MiB/GiB; 0 = "
                  "empty kernel), comma-separated")
      ->delimiter(',');
  sub->add_flag("--no-counters", a->no_counters,
                "with --copy-kernel: skip the CUPTI pass (e.g. under ncu)");
  return {sub, [a, &g] { return probe(*a, g); }};
}

} // namespace fb::cli
