// Parsing helpers the subcommands share: quick flags as a spec, GPU lists, byte sizes.
#pragma once

#include "flashbench/device.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace fb::cli {

// --variant/--shape/--config as a one-entry spec in YAML, so that they go through exactly the same
// parser and checks as spec files.
std::string quick_spec_yaml(const std::string &variant, const std::string &shape,
                            const std::string &config);

// "0,1,3" -> {0, 1, 3}; "" -> {}. Throws UserError naming `option`.
std::vector<int> parse_gpus(const std::string &csv, const std::string &option = "--gpus");

// "33554432", "32M", "1G" -> bytes (K/M/G are binary multiples). Throws UserError naming `option`.
size_t parse_byte_size(const std::string &text, const std::string &option);

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_csv(const std::string &csv);

// The device at `index` when there is one (*present = true), else nominal H100 limits for planning.
DeviceInfo device_or_nominal(int index, bool *present);

} // namespace fb::cli
