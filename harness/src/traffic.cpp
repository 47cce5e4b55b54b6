#include "flashbench/traffic.hpp"

#include "flashbench/variant.hpp"

#include <atomic>

namespace fb {

namespace {
std::atomic<TrafficModels> installed{nullptr};
} // namespace

void install_traffic_models(TrafficModels models) { installed.store(models); }

TrafficModel traffic_model(const Variant &v, const AttentionProblem &p, const Config &c,
                           const DeviceInfo &dev) {
  if (const TrafficModels models = installed.load())
    if (std::optional<TrafficModel> m = models(v, p, c, dev))
      return *m;
  TrafficModel m;
  m.bytes = v.model_bytes(p, c, dev);
  return m;
}

} // namespace fb
