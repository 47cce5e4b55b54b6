// The SM clock, slowdown reasons and energy of one GPU from NVML (nvml.hpp: loaded at run time,
// optional); missing NVML only means clocks are reported as 0.
#include "flashbench/timing.hpp"

#include "nvml.hpp"

namespace fb {

namespace {

using nvmlDevice = nvml::Device;
constexpr int kNvmlClockSm = nvml::kClockSm;
const nvml::Api &lib() { return nvml::api(); }

} // namespace

ClockReader::ClockReader(const std::string &pci_bus_id) {
  const nvml::Api &n = lib();
  if (!n.ok || pci_bus_id.empty())
    return;
  nvmlDevice dev = nullptr;
  if (n.by_bus_id(pci_bus_id.c_str(), &dev) == 0)
    device_ = dev;
}

ClockReader::~ClockReader() = default;

int ClockReader::sm_clock_mhz() const {
  unsigned mhz = 0;
  if (device_ && lib().clock(device_, kNvmlClockSm, &mhz) == 0)
    return static_cast<int>(mhz);
  return 0;
}

int ClockReader::sm_clock_max_mhz() const {
  unsigned mhz = 0;
  if (device_ && lib().max_clock(device_, kNvmlClockSm, &mhz) == 0)
    return static_cast<int>(mhz);
  return 0;
}

unsigned long long ClockReader::slowdown_reasons() const {
  // NVML's clock event reasons: SW power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal
  // 0x40, HW power brake 0x80. Not idle (0x1), application clocks (0x2) or sync boost (0x10): those
  // are not heat or power.
  constexpr unsigned long long kHeatOrPower = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;
  unsigned long long r = 0;
  if (device_ && lib().reasons && lib().reasons(device_, &r) == 0)
    return r & kHeatOrPower;
  return 0;
}

long long ClockReader::energy_mj() const {
  unsigned long long mj = 0;
  if (device_ && lib().energy && lib().energy(device_, &mj) == 0)
    return static_cast<long long>(mj);
  return -1;
}

std::string ClockReader::driver_version() const {
  char buf[96] = {};
  if (device_ && lib().driver(buf, sizeof(buf)) == 0)
    return buf;
  return {};
}

} // namespace fb
