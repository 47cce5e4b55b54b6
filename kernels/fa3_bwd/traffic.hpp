// fa3_bwd's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
#pragma once

#include "kernels/fa3_bwd/traits.hpp"

#include <algorithm>

namespace fb::fa3_bwd {

// The parts of the model, in bytes, for DESIGN.md and the tests.
struct Traffic {
  double preprocess = 0; // O, dO and LSE read; LSE₂, D and the zeroed dQ accumulator written
  double kv = 0;         // K and V read once per column block, dK and dV written once
  double q_rows = 0;     // Q, dO, LSE₂ and D read once per visited (row block, column block)
  double dq_add = 0;     // fp32 dQ partials reduced into the accumulator, once per visited pair
  double convert = 0;    // the accumulator read, dQ written
  double total() const { return preprocess + kv + q_rows + dq_add + convert; }
};

// The no-reuse bound of the loop structure (fa2_bwd's, with kBlockM x kBlockN blocks); the config does not change it: every TMA load a CTA
// issues counted as HBM traffic, and every dQ partial counted once as 4 bytes an element. A CTA holds one column
// block of one kv head and walks the row blocks of every query head of its GQA group, so K and V are read once per
// column block and Q, dO, LSE₂ and D once per visited (row block, column block, query head). In practice L2 serves
// most of the row-block reads: the column blocks of one (batch, kv head) run side by side (natural order) and read
// the same Q/dO row blocks at about the same time, and a head's accumulator (seqlen_q · head_dim · 4 bytes) stays
// in L2 while they reduce into it; the report shows this bound beside the measured bytes.
inline Traffic traffic(const AttentionProblem &p, const Params &) {
  const double e = dtype_bytes(p.dtype), d = static_cast<double>(p.head_dim);
  const double rows_pad = static_cast<double>(padded_rows(p.seqlen_q, kBlockM));
  const double sq = static_cast<double>(p.seqlen_q), bm = kBlockM;
  Traffic t;
  const double q_heads = static_cast<double>(p.batch * p.heads_q);
  t.preprocess =
      q_heads * (2.0 * e * d * sq + 4.0 * sq + 2.0 * 4.0 * rows_pad + 4.0 * d * rows_pad);
  t.convert = q_heads * (4.0 * d * sq + e * d * sq);

  double kv_rows = 0, q_rows = 0, visits = 0; // per kv head, for one query head of its group
  for (int64_t n = 0, cols = num_col_blocks(p); n < cols; ++n) {
    kv_rows += static_cast<double>(std::min<int64_t>(kBlockN, p.seqlen_kv - n * kBlockN));
    const RowRange r = row_blocks_for(n, kBlockM, kBlockN, p.seqlen_q, p.seqlen_kv, p.causal);
    if (r.first >= r.end)
      continue;
    visits += static_cast<double>(r.end - r.first);
    q_rows += sq - static_cast<double>(r.first) * bm;
  }
  const double kv_heads = static_cast<double>(p.batch * p.heads_kv);
  const double group = static_cast<double>(p.group_size());
  t.kv = kv_heads * 4.0 * e * d * kv_rows;
  t.q_rows = kv_heads * group * (2.0 * e * d * q_rows + 2.0 * 4.0 * bm * visits);
  t.dq_add = kv_heads * group * 4.0 * d * bm * visits;
  return t;
}

inline double traffic_bytes(const AttentionProblem &p, const Params &c) {
  return traffic(p, c).total();
}

} // namespace fb::fa3_bwd
