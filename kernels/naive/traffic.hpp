// naive's traffic model on a device: what register.cpp's model_bytes (each kernel reads its inputs once and writes
// its outputs once, S and P through HBM, K and V once per KV head) leaves open. Host arithmetic only: like every
// traffic.hpp, the tuning tables' source hash leaves this file out.
//
// The count assumes that the cuBLAS GEMMs of one GQA group's q heads run side by side and share each KV head's K
// (and V) through L2. That holds while one KV head's K fits the usable L2; a longer K (decode at 131072 keys: 33.5
// MB of bf16 at d128) is streamed by the group's GEMMs at their own pace, and the L2 keeps only part of it between
// them: K and V reach DRAM between once per KV head and once per q head. The model then gives that range.
#pragma once

#include "flashbench/problem.hpp"
#include "kernels/common/traffic.hpp"

namespace fb::naive {

// `shared`: register.cpp's model_bytes (K and V once per KV head).
inline TrafficModel traffic(const AttentionProblem &p, double shared, const DeviceInfo &dev) {
  namespace t = fb::kernels::traffic;
  TrafficModel m;
  m.bytes = shared;
  m.reason = "S (fp32) and P written and read through DRAM; K and V once per KV head";
  const double usable = t::usable_l2(dev);
  const double head_k = dtype_bytes(p.dtype) * static_cast<double>(p.seqlen_kv * p.head_dim);
  if (usable > 0 && p.group_size() > 1 && head_k > usable) {
    m.low = shared;
    m.high = shared + static_cast<double>(p.group_size() - 1) * 2.0 * head_k *
                          static_cast<double>(p.batch * p.heads_kv);
    m.reason = "one KV head's K (" + t::mb(head_k) + ") exceeds the usable L2 (" + t::mb(usable) +
               "): the " + std::to_string(p.group_size()) +
               " q heads' GEMMs of a GQA group read K and V from DRAM between once and once each";
  }
  return m;
}

} // namespace fb::naive
