// fa2_bwd's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
#pragma once

#include "kernels/fa2_bwd/traits.hpp"

#include <algorithm>

namespace fb::fa2_bwd {

// The parts of the model, in bytes, for DESIGN.md's table and the tests.
struct Traffic {
  double preprocess = 0; // O, dO and LSE read; LSE₂, D and the zeroed dQ accumulator written
  double kv = 0;         // K and V read once per column block, dK and dV written once
  double q_rows = 0;     // Q, dO, LSE₂ and D read once per visited (row block, column block)
  double dq_add = 0;     // fp32 dQ partials reduced into the accumulator, once per visited pair
  double convert = 0;    // the accumulator read, dQ written
  double total() const { return preprocess + kv + q_rows + dq_add + convert; }
};

// The no-reuse bound of the loop structure: every read a CTA issues counted as HBM traffic, and every dQ partial
// counted once as 4 bytes an element. In practice L2 serves most of it: the column blocks of one (batch, head)
// run side by side and read the same Q/dO row blocks at about the same time, and the accumulator of one head
// (seqlen_q · head_dim · 4 bytes) stays in L2 while they reduce into it, so the measured DRAM bytes sit far below
// this bound on long sequences; the report shows both.
inline Traffic traffic(const AttentionProblem &p, const Params &c) {
  const double e = dtype_bytes(p.dtype), d = static_cast<double>(p.head_dim);
  const double rows_pad = static_cast<double>(padded_rows(p.seqlen_q, c.block_m));
  const double sq = static_cast<double>(p.seqlen_q), bm = c.block_m;
  Traffic t;
  const double q_heads = static_cast<double>(p.batch * p.heads_q);
  t.preprocess =
      q_heads * (2.0 * e * d * sq + 4.0 * sq + 2.0 * 4.0 * rows_pad + 4.0 * d * rows_pad);
  t.convert = q_heads * (4.0 * d * sq + e * d * sq);

  double kv_rows = 0, q_rows = 0, visits = 0; // per kv head, for one query head of its group
  for (int64_t n = 0, cols = num_col_blocks(p, c); n < cols; ++n) {
    kv_rows += static_cast<double>(std::min<int64_t>(c.block_n, p.seqlen_kv - n * c.block_n));
    const RowRange r = row_blocks_for(n, c.block_m, c.block_n, p.seqlen_q, p.seqlen_kv, p.causal);
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

} // namespace fb::fa2_bwd
