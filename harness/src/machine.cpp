#include "flashbench/machine.hpp"

#include "flashbench/device.hpp"
#include "nvml.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <fstream>

namespace fb {

namespace {

std::string first_line(const std::string &path) {
  std::ifstream is(path);
  std::string s;
  if (!is || !std::getline(is, s))
    return {};
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
    s.pop_back();
  return s;
}

nvml::Device handle(const std::string &pci_bus_id) {
  const nvml::Api &n = nvml::api();
  nvml::Device d = nullptr;
  if (!n.ok || pci_bus_id.empty() || n.by_bus_id(pci_bus_id.c_str(), &d) != 0)
    return nullptr;
  return d;
}

template <class Fn> std::string text(Fn fn, nvml::Device d) {
  char buf[128] = {};
  if (fn && fn(d, buf, sizeof(buf)) == 0)
    return buf;
  return {};
}

} // namespace

std::string read_host_id(const std::string &root, std::string *source) {
  const std::string base = root.empty() || root.back() == '/' ? root : root + "/";
  if (std::string id = first_line(base + "etc/machine-id"); !id.empty()) {
    *source = "machine-id";
    return id;
  }
  if (std::string id = first_line(base + "proc/sys/kernel/random/boot_id"); !id.empty()) {
    *source = "boot-id";
    return id;
  }
  source->clear();
  return {};
}

MachineState query_machine_state(const std::string &pci_bus_id) {
  MachineState s;
  const nvml::Api &n = nvml::api();
  nvml::Device d = handle(pci_bus_id);
  if (!d)
    return s;
  unsigned v = 0;
  if (n.clock(d, nvml::kClockSm, &v) == 0)
    s.sm_clock_mhz = static_cast<int>(v);
  if (n.clock(d, nvml::kClockMem, &v) == 0)
    s.mem_clock_mhz = static_cast<int>(v);
  if (n.temperature && n.temperature(d, nvml::kTemperatureGpu, &v) == 0)
    s.temperature_c = static_cast<int>(v);
  if (n.power_usage && n.power_usage(d, &v) == 0)
    s.power_w = v * 1e-3;
  return s;
}

MachineIdentity query_machine(const DeviceInfo &dev) {
  MachineIdentity m;
  m.host_id = read_host_id("/", &m.host_id_source);
  m.boot_id = first_line("/proc/sys/kernel/random/boot_id");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  m.host_name = host;
  m.pci_bus_id = dev.pci_bus_id;
  m.source = "none";
  const nvml::Api &n = nvml::api();
  if (!dev.present) {
    m.reason = "no GPU";
    return m;
  }
  if (!n.ok) {
    m.reason = "NVML unavailable (libnvidia-ml.so.1 not loadable or nvmlInit failed)";
    return m;
  }
  nvml::Device d = handle(dev.pci_bus_id);
  if (!d) {
    m.reason = "NVML has no device at PCI bus id " + dev.pci_bus_id;
    return m;
  }
  m.source = "nvml";
  m.gpu_uuid = text(n.uuid, d);
  m.gpu_serial = text(n.serial, d);
  m.vbios = text(n.vbios, d);
  char drv[96] = {};
  if (n.driver(drv, sizeof(drv)) == 0)
    m.driver = drv;
  unsigned mw = 0;
  if (n.power_limit && n.power_limit(d, &mw) == 0)
    m.power_limit_w = mw * 1e-3;
  int cur = 0, pending = 0;
  if (n.ecc_mode && n.ecc_mode(d, &cur, &pending) == 0)
    m.ecc = cur ? "on" : "off";
  m.start = query_machine_state(dev.pci_bus_id);
  return m;
}

void to_json(nlohmann::json &j, const MachineState &s) {
  auto num = [](double v) { return v < 0 ? nlohmann::json() : nlohmann::json(v); };
  j = nlohmann::json{{"sm_clock_mhz", num(s.sm_clock_mhz)},
                     {"mem_clock_mhz", num(s.mem_clock_mhz)},
                     {"temperature_c", num(s.temperature_c)},
                     {"power_w", num(s.power_w)}};
}

void to_json(nlohmann::json &j, const MachineIdentity &m) {
  auto str = [](const std::string &s) { return s.empty() ? nlohmann::json() : nlohmann::json(s); };
  j = nlohmann::json{
      {"host_id", str(m.host_id)},
      {"host_id_source", str(m.host_id_source)},
      {"boot_id", str(m.boot_id)},
      {"host_name", str(m.host_name)},
      {"gpu_uuid", str(m.gpu_uuid)},
      {"gpu_serial", str(m.gpu_serial)},
      {"pci_bus_id", str(m.pci_bus_id)},
      {"driver", str(m.driver)},
      {"vbios", str(m.vbios)},
      {"power_limit_w", m.power_limit_w < 0 ? nlohmann::json() : nlohmann::json(m.power_limit_w)},
      {"ecc", str(m.ecc)},
      {"source", m.source},
      {"reason", str(m.reason)},
      {"start", m.start},
      {"end", m.end}};
}

} // namespace fb
