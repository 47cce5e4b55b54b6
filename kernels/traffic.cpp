// The catalog's traffic models (flashbench/traffic.hpp: traffic_model; catalog() installs them): each is its variant's traffic.hpp, which
// the tuning source hash leaves out, so that a better model changes none of the variant's hashed sources and no
// tuned entry goes stale. Variants without one here get their model_bytes(p, c, dev) and no reason.
#include "flashbench/traffic.hpp"

#include "kernels/fa1_kv_outer/traffic.hpp"
#include "kernels/fa2_q_outer/traffic.hpp"
#include "kernels/fa3_fp8/traffic.hpp"
#include "kernels/fa3_pipelined/traffic.hpp"
#include "kernels/flash_decoding/traffic.hpp"
#include "kernels/naive/traffic.hpp"

namespace fb {

std::optional<TrafficModel> catalog_traffic_models(const Variant &v, const AttentionProblem &p,
                                                   const Config &c, const DeviceInfo &dev) {
  const std::string name = v.name();
  if (name == "naive")
    return naive::traffic(p, v.model_bytes(p, c), dev);
  if (name == "fa1_kv_outer")
    return fa1::traffic(p, fa1::params_of(c), dev);
  if (name == "fa2_q_outer")
    return fa2::traffic(p, fa2::params_of(c), dev);
  if (name == "flash_decoding")
    return fdec::traffic(p, fdec::params_of(c), dev);
  if (name == "fa3_pipelined")
    return fa3::traffic(p, fa3::params_of(c), dev);
  if (name == "fa3_fp8")
    return fa3fp8::traffic(p, fa3fp8::params_of(c), dev);
  return std::nullopt;
}

} // namespace fb
