// NVML through dlopen: the library ships with the driver, not the toolkit, so linking it would stop the binary from
// starting on a machine without a driver (CI). Missing NVML only means clocks are reported as 0.
#include "flashbench/timing.hpp"

#include <dlfcn.h>

#include <mutex>

namespace fb {

namespace {

using nvmlReturn = int;
using nvmlDevice = void*;
constexpr int kNvmlClockSm = 1; // NVML_CLOCK_SM

struct Nvml {
  void* lib = nullptr;
  nvmlReturn (*init)() = nullptr;
  nvmlReturn (*by_bus_id)(const char*, nvmlDevice*) = nullptr;
  nvmlReturn (*clock)(nvmlDevice, int, unsigned*) = nullptr;
  nvmlReturn (*max_clock)(nvmlDevice, int, unsigned*) = nullptr;
  nvmlReturn (*driver)(char*, unsigned) = nullptr;
  nvmlReturn (*reasons)(nvmlDevice, unsigned long long*) = nullptr; // optional
  nvmlReturn (*energy)(nvmlDevice, unsigned long long*) = nullptr;  // optional (Volta and newer)
  bool ok = false;
};

const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    n.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n.lib) return;
    n.init = reinterpret_cast<nvmlReturn (*)()>(dlsym(n.lib, "nvmlInit_v2"));
    n.by_bus_id =
        reinterpret_cast<nvmlReturn (*)(const char*, nvmlDevice*)>(dlsym(n.lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    n.clock = reinterpret_cast<nvmlReturn (*)(nvmlDevice, int, unsigned*)>(dlsym(n.lib, "nvmlDeviceGetClockInfo"));
    n.max_clock =
        reinterpret_cast<nvmlReturn (*)(nvmlDevice, int, unsigned*)>(dlsym(n.lib, "nvmlDeviceGetMaxClockInfo"));
    n.driver = reinterpret_cast<nvmlReturn (*)(char*, unsigned)>(dlsym(n.lib, "nvmlSystemGetDriverVersion"));
    n.reasons = reinterpret_cast<nvmlReturn (*)(nvmlDevice, unsigned long long*)>(
        dlsym(n.lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    n.energy = reinterpret_cast<nvmlReturn (*)(nvmlDevice, unsigned long long*)>(
        dlsym(n.lib, "nvmlDeviceGetTotalEnergyConsumption"));
    n.ok = n.init && n.by_bus_id && n.clock && n.max_clock && n.driver && n.init() == 0;
  });
  return n;
}

} // namespace

ClockReader::ClockReader(const std::string& pci_bus_id) {
  const Nvml& n = nvml();
  if (!n.ok || pci_bus_id.empty()) return;
  nvmlDevice dev = nullptr;
  if (n.by_bus_id(pci_bus_id.c_str(), &dev) == 0) device_ = dev;
}

ClockReader::~ClockReader() = default;

int ClockReader::sm_clock_mhz() const {
  unsigned mhz = 0;
  if (device_ && nvml().clock(device_, kNvmlClockSm, &mhz) == 0) return static_cast<int>(mhz);
  return 0;
}

int ClockReader::sm_clock_max_mhz() const {
  unsigned mhz = 0;
  if (device_ && nvml().max_clock(device_, kNvmlClockSm, &mhz) == 0) return static_cast<int>(mhz);
  return 0;
}

unsigned long long ClockReader::slowdown_reasons() const {
  // NVML's clock event reasons: SW power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power
  // brake 0x80. Not idle (0x1), application clocks (0x2) or sync boost (0x10): those are not heat or power.
  constexpr unsigned long long kHeatOrPower = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;
  unsigned long long r = 0;
  if (device_ && nvml().reasons && nvml().reasons(device_, &r) == 0) return r & kHeatOrPower;
  return 0;
}

long long ClockReader::energy_mj() const {
  unsigned long long mj = 0;
  if (device_ && nvml().energy && nvml().energy(device_, &mj) == 0) return static_cast<long long>(mj);
  return -1;
}

std::string ClockReader::driver_version() const {
  char buf[96] = {};
  if (device_ && nvml().driver(buf, sizeof(buf)) == 0) return buf;
  return {};
}

} // namespace fb
