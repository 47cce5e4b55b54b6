#include "flashbench/config.hpp"

#include "flashbench/errors.hpp"

#include <nlohmann/json.hpp>

#include <charconv>
#include <sstream>
#include <stdexcept>

namespace fb {

namespace {
std::string join_values(const Axis &a) {
  std::ostringstream os;
  for (size_t i = 0; i < a.values.size(); ++i)
    os << (i ? ", " : "") << a.label_of(a.values[i]);
  return os.str();
}
} // namespace

std::string Axis::label_of(int64_t value) const {
  if (!labels.empty()) {
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i] == value)
        return labels[i];
  }
  return std::to_string(value);
}

int64_t Axis::value_of(const std::string &text) const {
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] == text)
      return values[i];
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size())
    throw UserError("'" + text + "' is not a value of " + name +
                    "; use one of: " + join_values(*this));
  for (int64_t allowed : values)
    if (allowed == v)
      return v;
  throw UserError(name + " = " + text + " is not on the axis; use one of: " + join_values(*this));
}

int64_t Config::get(const std::string &name) const {
  auto it = params_.find(name);
  if (it == params_.end())
    throw std::out_of_range("config has no parameter '" + name + "'");
  return it->second;
}

int64_t Config::get_or(const std::string &name, int64_t fallback) const {
  auto it = params_.find(name);
  return it == params_.end() ? fallback : it->second;
}

ConfigSpace::ConfigSpace(std::vector<Axis> axes, Config default_config, Constraint constraint,
                         DefaultRule default_rule)
    : axes_(std::move(axes)), default_(std::move(default_config)),
      constraint_(std::move(constraint)), default_rule_(std::move(default_rule)) {}

Config ConfigSpace::default_config(const AttentionProblem &p, const DeviceInfo &dev) const {
  return default_rule_ ? default_rule_(default_, p, dev) : default_;
}

Config ConfigSpace::default_config(const Config &seed, const AttentionProblem &p,
                                   const DeviceInfo &dev) const {
  return default_rule_ ? default_rule_(seed, p, dev) : seed;
}

const Axis *ConfigSpace::axis(const std::string &name) const {
  for (const auto &a : axes_)
    if (a.name == name)
      return &a;
  return nullptr;
}

size_t ConfigSpace::size() const {
  size_t n = 1;
  for (const auto &a : axes_)
    n *= a.values.size();
  return axes_.empty() ? 1 : n;
}

std::vector<ConfigSpace::Entry> ConfigSpace::expand() const {
  std::vector<Entry> out;
  std::vector<size_t> idx(axes_.size(), 0);
  const size_t total = size();
  out.reserve(total);
  for (size_t n = 0; n < total; ++n) {
    Config c;
    for (size_t a = 0; a < axes_.size(); ++a)
      c.set(axes_[a].name, axes_[a].values[idx[a]]);
    out.push_back({c, check(c)});
    // Odometer increment, last axis fastest.
    for (size_t a = axes_.size(); a-- > 0;) {
      if (++idx[a] < axes_[a].values.size())
        break;
      idx[a] = 0;
    }
  }
  return out;
}

std::optional<std::string> ConfigSpace::check(const Config &c) const {
  return constraint_ ? constraint_(c) : std::nullopt;
}

Config ConfigSpace::make(const std::map<std::string, std::string> &given) const {
  return make(given, default_);
}

Config ConfigSpace::make(const std::map<std::string, std::string> &given,
                         const Config &base) const {
  Config c = base;
  for (const auto &[name, text] : given) {
    const Axis *a = axis(name);
    if (!a) {
      std::ostringstream os;
      os << "unknown config parameter '" << name << "'";
      if (axes_.empty()) {
        os << "; this variant has no config parameters";
      } else {
        os << "; known: ";
        for (size_t i = 0; i < axes_.size(); ++i)
          os << (i ? ", " : "") << axes_[i].name;
      }
      throw UserError(os.str());
    }
    c.set(name, a->value_of(text));
  }
  return c;
}

std::string ConfigSpace::to_string(const Config &c) const {
  std::ostringstream os;
  bool first = true;
  for (const auto &a : axes_) {
    if (!c.has(a.name))
      continue;
    os << (first ? "" : ",") << a.name << "=" << a.label_of(c.get(a.name));
    first = false;
  }
  // Parameters outside the declared axes (test knobs) still print, after the axes.
  for (const auto &[name, value] : c.params())
    if (!axis(name))
      os << (std::exchange(first, false) ? "" : ",") << name << "=" << value;
  return first ? "default" : os.str();
}

nlohmann::json ConfigSpace::to_json(const Config &c) const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto &[name, value] : c.params()) {
    const Axis *a = axis(name);
    if (a && !a->labels.empty())
      j[name] = a->label_of(value);
    else
      j[name] = value;
  }
  return j;
}

std::vector<std::pair<std::string, std::string>>
parse_assignments(const std::string &text, const std::string &what, const std::string &example) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UserError(what + ": '" + item + "' is not name=value; e.g. " + example);
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return out;
}

} // namespace fb
