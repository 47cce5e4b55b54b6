// flash_decoding's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
#pragma once

#include "kernels/flash_decoding/traits.hpp"

namespace fb::fdec {

// HBM bytes the kernels move: each group reads K and V up to its kv_end once (row blocks beyond the
// first re-read them), Q once per group, O and LSE written once; groups that use more than one split
// write and read back their partials.
inline double traffic_bytes(const AttentionProblem &p, const Params &c, const SplitPlan &plan) {
  const double e = dtype_bytes(p.dtype), d = double(p.head_dim);
  const int64_t rows = packed_rows(p), mbs = row_blocks(p);
  double bytes = 2.0 * e * double(p.q_elems()) + 4.0 * double(p.lse_elems()); // Q, O, LSE
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t mb = 0; mb < mbs; ++mb) {
      const int64_t kv_end = group_kv_end(p, b, mb);
      bytes += double(p.heads_kv) * 2.0 * e * d * double(kv_end);
      const int64_t active =
          (kv_end + plan.keys_per_split - 1) / std::max<int64_t>(plan.keys_per_split, 1);
      if (active >= 2) {
        const double rows_here = double(std::min<int64_t>(kRowsPerCta, rows - mb * kRowsPerCta));
        bytes += double(p.heads_kv) * 2.0 * double(active) * rows_here * (4.0 * d + 4.0);
      }
    }
  (void)c;
  return bytes;
}

} // namespace fb::fdec
