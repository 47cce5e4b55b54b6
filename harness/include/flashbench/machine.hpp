// Which machine a run was measured on, for results files' context.machine: two runs of one build on
// two hosts of a pool differ by a few percent per point, so a reader must be able to tell them
// apart (GPU UUID, host id) and see the conditions (power limit, ECC, clocks and temperature at the
// start and the end). Read through NVML in the process that writes the file; NVML creates no CUDA
// context, so `run` and `tune` keep every context in workers.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace fb {

struct DeviceInfo;

// Clocks, temperature and power at one moment; -1 where NVML cannot say.
struct MachineState {
  int sm_clock_mhz = -1;
  int mem_clock_mhz = -1;
  int temperature_c = -1;
  double power_w = -1;
};

struct MachineIdentity {
  std::string host_id;        // /etc/machine-id, else the kernel's boot id
  std::string host_id_source; // "machine-id" | "boot-id" | "" (none readable)
  std::string boot_id;
  std::string host_name;
  std::string gpu_uuid; // "GPU-..." as nvidia-smi prints it
  std::string gpu_serial;
  std::string pci_bus_id;
  std::string driver;
  std::string vbios;
  double power_limit_w = -1; // enforced
  std::string ecc;           // "on" | "off" | "" (unknown or not supported)
  std::string source;        // "nvml" | "none"
  std::string reason;        // why NVML facts are missing, when they are
  MachineState start, end;
};

// The host's id from files under `root` ("/" on a real system): etc/machine-id, else
// proc/sys/kernel/random/boot_id. Sets *source to "machine-id" or "boot-id"; "" when neither is
// readable.
std::string read_host_id(const std::string &root, std::string *source);
// Everything above for the GPU at dev.pci_bus_id (no GPU: the host facts only), with `start`
// filled.
MachineIdentity query_machine(const DeviceInfo &dev);
MachineState query_machine_state(const std::string &pci_bus_id);

void to_json(nlohmann::json &j, const MachineState &s);
void to_json(nlohmann::json &j, const MachineIdentity &m);

} // namespace fb
