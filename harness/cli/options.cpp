#include "options.hpp"

#include "flashbench/errors.hpp"
#include "flashbench/spec.hpp"

#include <algorithm>
#include <sstream>
#include <utility>

namespace fb::cli {

std::string quick_spec_yaml(const std::string &variant, const std::string &shape,
                            const std::string &config) {
  std::ostringstream y;
  y << "name: command-line\nproblems:\n  - {";
  const auto yaml_map = [&](const std::vector<std::pair<std::string, std::string>> &items) {
    for (size_t i = 0; i < items.size(); ++i)
      y << (i ? ", " : "") << items[i].first << ": " << items[i].second;
  };
  yaml_map(fb::parse_assignments(
      shape, "--shape",
      "--shape batch=1,heads=16,seqlen=4096,head_dim=128,causal=true,dtype=bf16"));
  y << "}\nvariants:\n  " << variant << ":\n    configs: ";
  if (config.empty() || config == "default" || config == "all" || config == "tuned") {
    y << (config.empty() ? "default" : config) << "\n";
  } else {
    y << "\n      - {";
    yaml_map(fb::parse_assignments(config, "--config", "--config block_m=64,block_n=64"));
    y << "}\n";
  }
  return y.str();
}

std::vector<int> parse_gpus(const std::string &csv, const std::string &option) {
  std::vector<int> out;
  std::istringstream is(csv);
  for (std::string g; std::getline(is, g, ',');) {
    try {
      size_t used = 0;
      const int v = std::stoi(g, &used);
      if (used != g.size() || v < 0)
        throw std::invalid_argument(g);
      if (std::find(out.begin(), out.end(), v) != out.end())
        throw std::invalid_argument(g);
      out.push_back(v);
    } catch (const std::exception &) {
      throw UserError(option + " '" + csv + "': expected distinct device indices like 0,1,2");
    }
  }
  return out;
}

size_t parse_byte_size(const std::string &text, const std::string &option) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &pos);
  } catch (const std::exception &) {
    pos = 0;
  }
  const std::string suffix = pos ? text.substr(pos) : "";
  const unsigned long long mult = suffix.empty()  ? 1
                                  : suffix == "K" ? 1ull << 10
                                  : suffix == "M" ? 1ull << 20
                                  : suffix == "G" ? 1ull << 30
                                                  : 0;
  if (pos == 0 || mult == 0 || text[0] == '-')
    throw UserError(option + ": '" + text +
                    "' is not a size; give bytes, optionally with K, M or G (e.g. 32M)");
  return static_cast<size_t>(v * mult);
}

std::vector<std::string> split_csv(const std::string &csv) {
  std::vector<std::string> out;
  std::istringstream is(csv);
  for (std::string m; std::getline(is, m, ',');)
    if (!m.empty())
      out.push_back(m);
  return out;
}

DeviceInfo device_or_nominal(int index, bool *present) {
  *present = device_count() > index;
  return *present ? query_device(index) : nominal_device();
}

} // namespace fb::cli
