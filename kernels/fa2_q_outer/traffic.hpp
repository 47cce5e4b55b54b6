// fa2_q_outer's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
#pragma once

#include "kernels/fa2_q_outer/traits.hpp"

namespace fb::fa2 {

// HBM bytes of the loop structure: Q read once, O and LSE written once, and each CTA reads the K/V tiles it visits
// (the model counts a K/V tile once per CTA; in practice L2 serves some of the re-reads by neighbouring CTAs and
// by the q heads of one GQA group, which the measured DRAM bytes show).
inline double traffic_bytes(const AttentionProblem &p, const Params &c) {
  const double e = dtype_bytes(p.dtype), d = static_cast<double>(p.head_dim);
  double kv_rows = 0;
  for (int64_t i = 0, n = num_q_tiles(p, c); i < n; ++i) {
    const int64_t tiles = kv_tiles_for(i, c.block_m, c.block_n, p.seqlen_q, p.seqlen_kv, p.causal);
    kv_rows += static_cast<double>(std::min<int64_t>(p.seqlen_kv, tiles * c.block_n));
  }
  const double per_head = 2.0 * e * d * static_cast<double>(p.seqlen_q) +
                          4.0 * static_cast<double>(p.seqlen_q) + 2.0 * e * d * kv_rows;
  return per_head * static_cast<double>(p.batch * p.heads_q);
}

} // namespace fb::fa2
