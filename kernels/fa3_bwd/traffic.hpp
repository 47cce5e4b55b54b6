// fa3_bwd's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
#pragma once

#include "kernels/fa3_bwd/traits.hpp"

#include "kernels/common/traffic.hpp"

namespace fb::fa3_bwd {

// The no-reuse bound of the column-parallel loop (kernels/common/traffic.hpp, backward_bound) with this variant's
// blocks (the config's block_m x kBlockN).
using Traffic = kernels::traffic::BackwardBound;
inline Traffic traffic(const AttentionProblem &p, const Params &c) {
  return kernels::traffic::backward_bound(p, c.block_m, kBlockN);
}

inline double traffic_bytes(const AttentionProblem &p, const Params &c) {
  return traffic(p, c).total();
}

} // namespace fb::fa3_bwd
