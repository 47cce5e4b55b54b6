#include "flashbench/errors.hpp"
#include "flashbench/variant.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace fb {

Support support_for(const Variant &v, const AttentionProblem &p, const Config &c,
                    const DeviceInfo &dev) {
  if (v.pass() != p.pass)
    return Support::no(v.name() + " computes the " +
                       (v.pass() == Pass::fwd ? "forward pass" : "backward pass") +
                       "; this point is a " + (p.pass == Pass::fwd ? "forward" : "backward") +
                       " (pass: " + to_string(p.pass) + ")");
  return v.supports(p, c, dev);
}

void Registry::add(std::unique_ptr<Variant> v) {
  if (find(v->name())) {
    std::fprintf(stderr, "flashbench: internal error: variant '%s' registered twice\n",
                 v->name().c_str());
    std::abort();
  }
  variants_.push_back(std::move(v));
}

const Variant *Registry::find(const std::string &name) const {
  for (const auto &v : variants_)
    if (v->name() == name)
      return v.get();
  return nullptr;
}

const Variant &Registry::get(const std::string &name) const {
  if (const Variant *v = find(name))
    return *v;
  std::ostringstream os;
  os << "unknown variant '" << name << "'; known variants: ";
  for (size_t i = 0; i < variants_.size(); ++i)
    os << (i ? ", " : "") << variants_[i]->name();
  os << " (see 'flashbench list')";
  throw UserError(os.str());
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> out;
  for (const auto &v : variants_)
    out.push_back(v->name());
  return out;
}

} // namespace fb
