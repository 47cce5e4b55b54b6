// DeviceInfo: the facts about a GPU that decide what a variant supports and what a result means.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace fb {

struct DeviceInfo {
  bool present = false; // false: no CUDA device (dry runs use nominal limits)
  int index = 0;
  std::string name;
  std::string pci_bus_id;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int64_t smem_per_block_optin = 0; // the most dynamic shared memory a block may ask for
  int64_t smem_per_sm = 0;
  int regs_per_sm = 0;
  int max_threads_per_sm = 0;
  int max_blocks_per_sm = 0;
  int64_t total_mem_bytes = 0;
  int sm_clock_max_mhz = 0; // from NVML when available, else the runtime's clock attribute
  int mem_clock_max_mhz = 0;
  int mem_bus_width_bits = 0;
  int driver_version = 0; // e.g. 13000
  int runtime_version = 0;
  std::string driver_version_string; // NVML's, e.g. "580.159.04"

  int cc() const { return cc_major * 10 + cc_minor; }
  // "nvidia-h100-80gb-hbm3": lower-case name, non-alphanumerics folded to '-'. Names tuning tables and baselines.
  std::string slug() const;
};

int device_count(); // 0 when there is no driver or device; never throws
DeviceInfo query_device(int index);
// Limits of an H100 SXM, for planning (--dry-run) on a machine without a GPU. `present` stays false.
DeviceInfo nominal_device();

void to_json(nlohmann::json &j, const DeviceInfo &d);

} // namespace fb
