// NVML through dlopen, shared by the clock reader (timing.hpp) and the machine identity
// (machine.hpp). The library ships with the driver, not the toolkit, so linking it would stop the
// binary from starting on a machine without a driver (CI). Every entry point but the first few is
// optional: a missing one reads as "unknown".
#pragma once

namespace fb::nvml {

using Return = int; // nvmlReturn_t; 0 = NVML_SUCCESS
using Device = void *;
constexpr int kClockSm = 1;        // NVML_CLOCK_SM
constexpr int kClockMem = 2;       // NVML_CLOCK_MEM
constexpr int kTemperatureGpu = 0; // NVML_TEMPERATURE_GPU

struct Api {
  Return (*init)() = nullptr;
  Return (*by_bus_id)(const char *, Device *) = nullptr;
  Return (*clock)(Device, int, unsigned *) = nullptr;
  Return (*max_clock)(Device, int, unsigned *) = nullptr;
  Return (*driver)(char *, unsigned) = nullptr;
  // optional
  Return (*reasons)(Device, unsigned long long *) = nullptr;
  Return (*energy)(Device, unsigned long long *) = nullptr;
  Return (*uuid)(Device, char *, unsigned) = nullptr;
  Return (*serial)(Device, char *, unsigned) = nullptr;
  Return (*vbios)(Device, char *, unsigned) = nullptr;
  Return (*power_limit)(Device, unsigned *) = nullptr; // enforced limit, mW
  Return (*power_usage)(Device, unsigned *) = nullptr; // mW
  Return (*ecc_mode)(Device, int *, int *) = nullptr;  // current, pending
  Return (*temperature)(Device, int, unsigned *) = nullptr;
  bool ok = false; // loaded and initialised
};

// The process's NVML, loaded and initialised on the first call (never throws; !ok when
// unavailable).
const Api &api();

} // namespace fb::nvml
