// TrafficModel: what a variant's traffic model says about one point on one device. The bytes go into the results
// record as bytes_model (next to bytes_min and the measured DRAM bytes), the regime as bytes_model_reason, and, where
// the physics leaves the count open between two regimes, the range as bytes_model_range. docs/counters.md has the
// models; scripts/model_check.py checks them against measured bytes.
#pragma once

#include <optional>
#include <string>

namespace fb {

struct AttentionProblem;
class Config;
struct DeviceInfo;
class Variant;

struct TrafficModel {
  double bytes = -1; // expected DRAM bytes (read + write) inside the counters' window; -1: no model
  // The regime, one short line by rule (how often K/V reach DRAM, what stays in L2 at the end); empty where the
  // variant states none.
  std::string reason;
  // Where the regime is not certain (a working set near the usable L2), the bytes lie between these two (low <=
  // bytes <= high) and `reason` says why; -1 when the model commits to `bytes` alone.
  double low = -1, high = -1;

  bool has_range() const { return low >= 0 && high >= low; }
};

// The traffic model of a variant for one point on one device: the catalog's models (kernels/traffic.cpp), which
// catalog() installs when it is built, for the catalog's variants; model_bytes(p, c, dev) without a reason for any
// other variant (a test's) or before the catalog exists. Each catalog variant's model lives in its traffic.hpp,
// which the tuning source hash leaves out, so that a better model changes none of the variant's hashed sources.
TrafficModel traffic_model(const Variant &v, const AttentionProblem &p, const Config &c,
                           const DeviceInfo &dev);

// The catalog's models; nullptr when the variant has none there. Installed by catalog() (the harness core does not
// link the catalog: the catalog links the core).
using TrafficModels = std::optional<TrafficModel> (*)(const Variant &v, const AttentionProblem &p,
                                                      const Config &c, const DeviceInfo &dev);
void install_traffic_models(TrafficModels models);

} // namespace fb
