#include "nvml.hpp"

#include <dlfcn.h>

#include <mutex>
#include <type_traits>

namespace fb::nvml {

const Api &api() {
  static Api n;
  static std::once_flag once;
  std::call_once(once, [] {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      return;
    auto sym = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(lib, name));
    };
    sym(n.init, "nvmlInit_v2");
    sym(n.by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
    sym(n.clock, "nvmlDeviceGetClockInfo");
    sym(n.max_clock, "nvmlDeviceGetMaxClockInfo");
    sym(n.driver, "nvmlSystemGetDriverVersion");
    sym(n.reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
    sym(n.energy, "nvmlDeviceGetTotalEnergyConsumption");
    sym(n.uuid, "nvmlDeviceGetUUID");
    sym(n.serial, "nvmlDeviceGetSerial");
    sym(n.vbios, "nvmlDeviceGetVbiosVersion");
    sym(n.power_limit, "nvmlDeviceGetEnforcedPowerLimit");
    sym(n.power_usage, "nvmlDeviceGetPowerUsage");
    sym(n.ecc_mode, "nvmlDeviceGetEccMode");
    sym(n.temperature, "nvmlDeviceGetTemperature");
    n.ok = n.init && n.by_bus_id && n.clock && n.max_clock && n.driver && n.init() == 0;
  });
  return n;
}

} // namespace fb::nvml
