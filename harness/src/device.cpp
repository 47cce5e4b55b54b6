#include "flashbench/device.hpp"

#include "flashbench/check.hpp"
#include "flashbench/timing.hpp"

#include <nlohmann/json.hpp>

#include <cctype>

namespace fb {

std::string DeviceInfo::slug() const {
  std::string out;
  for (char ch : name.empty() ? std::string("no-gpu") : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c))
      out += static_cast<char>(std::tolower(c));
    else if (!out.empty() && out.back() != '-')
      out += '-';
  }
  while (!out.empty() && out.back() == '-')
    out.pop_back();
  return out;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); // clear "no driver" / "no device" so later calls start clean
    return 0;
  }
  return n;
}

DeviceInfo query_device(int index) {
  DeviceInfo d;
  cudaDeviceProp prop{};
  FB_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  d.present = true;
  d.index = index;
  d.name = prop.name;
  char bus[32] = {};
  FB_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), index));
  d.pci_bus_id = bus;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.sm_count = prop.multiProcessorCount;
  d.l2_bytes = prop.l2CacheSize;
  d.smem_per_block_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  d.smem_per_sm = static_cast<int64_t>(prop.sharedMemPerMultiprocessor);
  d.regs_per_sm = prop.regsPerMultiprocessor;
  d.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
  d.max_blocks_per_sm = prop.maxBlocksPerMultiProcessor;
  d.total_mem_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  d.mem_bus_width_bits = prop.memoryBusWidth;
  int clock_khz = 0, mem_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, index);
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, index);
  d.sm_clock_max_mhz = clock_khz / 1000;
  d.mem_clock_max_mhz = mem_khz / 1000;
  cudaDriverGetVersion(&d.driver_version);
  cudaRuntimeGetVersion(&d.runtime_version);
  ClockReader nvml(d.pci_bus_id);
  if (nvml.available()) {
    if (int mhz = nvml.sm_clock_max_mhz(); mhz > 0)
      d.sm_clock_max_mhz = mhz;
    d.driver_version_string = nvml.driver_version();
  }
  return d;
}

DeviceInfo nominal_device() {
  DeviceInfo d;
  d.present = false;
  d.name = "nominal H100 SXM (no GPU present)";
  d.cc_major = 9;
  d.cc_minor = 0;
  d.sm_count = 132;
  d.l2_bytes = 50 * 1024 * 1024;
  d.smem_per_block_optin = 227 * 1024;
  d.smem_per_sm = 228 * 1024;
  d.regs_per_sm = 65536;
  d.max_threads_per_sm = 2048;
  d.max_blocks_per_sm = 32;
  d.total_mem_bytes = 80LL * 1000 * 1000 * 1000;
  d.sm_clock_max_mhz = 1980;
  return d;
}

void to_json(nlohmann::json &j, const DeviceInfo &d) {
  j = nlohmann::json{{"present", d.present},
                     {"name", d.name},
                     {"slug", d.slug()},
                     {"index", d.index},
                     {"pci_bus_id", d.pci_bus_id},
                     {"cc", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
                     {"sm_count", d.sm_count},
                     {"l2_bytes", d.l2_bytes},
                     {"smem_per_block_optin", d.smem_per_block_optin},
                     {"smem_per_sm", d.smem_per_sm},
                     {"regs_per_sm", d.regs_per_sm},
                     {"max_threads_per_sm", d.max_threads_per_sm},
                     {"max_blocks_per_sm", d.max_blocks_per_sm},
                     {"total_mem_bytes", d.total_mem_bytes},
                     {"sm_clock_max_mhz", d.sm_clock_max_mhz},
                     {"mem_clock_max_mhz", d.mem_clock_max_mhz},
                     {"mem_bus_width_bits", d.mem_bus_width_bits},
                     {"driver_version", d.driver_version},
                     {"driver_version_string", d.driver_version_string},
                     {"runtime_version", d.runtime_version}};
}

} // namespace fb
