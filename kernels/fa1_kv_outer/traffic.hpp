// fa1_kv_outer's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
#pragma once

#include "kernels/fa1_kv_outer/traits.hpp"

namespace fb::fa1 {

// What of the per-step re-reads stays in L2. Every resident CTA re-reads its Q chunk and its O/l/m chunk at each
// K/V step, and the CTAs of one head (adjacent in the grid, so co-resident) read the same K/V tiles. Against half
// the L2 (H100/H200 split it in two partitions):
//   all:    Q and O/l/m chunks of all resident CTAs fit: Q, K/V and the fp32 O/l/m reach HBM once each;
//   q_only: only the Q chunks fit: Q once per CTA, but the O/l/m round trips thrash L2, so K/V re-reads per CTA and
//           the O/l/m round trips are HBM traffic;
//   none:   every re-read is HBM traffic (also the model without a device).
// Checked against CUPTI DRAM bytes of the quick sweep on an H200 (reports/baselines/nvidia-h200/quick.json).
enum class L2Reuse { none, q_only, all };

inline L2Reuse l2_reuse(const AttentionProblem &p, const Params &c, const DeviceInfo &dev) {
  if (dev.l2_bytes <= 0 || dev.sm_count <= 0)
    return L2Reuse::none;
  const double rows = static_cast<double>(tiles_per_cta(p, c) * c.block_m);
  const double grid = static_cast<double>(num_q_chunks(p, c) * p.heads_q * p.batch);
  const double resident =
      std::min(grid, static_cast<double>(ctas_per_sm(p, c, dev) * dev.sm_count));
  const double q_set = resident * rows * dtype_bytes(p.dtype) * p.head_dim;
  const double state_set = resident * rows * (4.0 * p.head_dim + 8.0);
  const double budget = 0.5 * static_cast<double>(dev.l2_bytes);
  if (q_set + state_set <= budget)
    return L2Reuse::all;
  if (q_set <= budget)
    return L2Reuse::q_only;
  return L2Reuse::none;
}

inline double traffic_bytes(const AttentionProblem &p, const Params &c,
                            L2Reuse reuse = L2Reuse::none) {
  const double e = dtype_bytes(p.dtype), d = static_cast<double>(p.head_dim);
  const double row_state = 4.0 * d + 8.0; // O (fp32) + l + m of one row
  const double row_final = e * d + 4.0;   // O (dtype) + LSE of one row
  const int64_t tiles = num_q_tiles(p, c), per_cta = tiles_per_cta(p, c);
  double per_head = 0;
  for (int64_t t0 = 0; t0 < tiles; t0 += per_cta) {
    const int64_t t1 = std::min(tiles, t0 + per_cta);
    // K and V: each K/V tile up to the CTA's last one, loaded once per CTA.
    const int64_t j_end =
        last_kv_tile(t1 - 1, c.block_m, c.block_n, p.seqlen_q, p.seqlen_kv, p.causal) + 1;
    if (reuse != L2Reuse::all) // with full reuse K/V are counted once per KV head, below
      per_head +=
          2.0 * e * d * static_cast<double>(std::min<int64_t>(p.seqlen_kv, j_end * c.block_n));
    for (int64_t i = t0; i < t1; ++i) {
      const double rows =
          static_cast<double>(std::min<int64_t>(c.block_m, p.seqlen_q - i * c.block_m));
      const double steps = static_cast<double>(
          last_kv_tile(i, c.block_m, c.block_n, p.seqlen_q, p.seqlen_kv, p.causal) + 1);
      if (steps == 0) { // a tile no row of which sees a key: written once as O = 0, LSE = -inf
        per_head += rows * row_final;
        continue;
      }
      // Q_i: re-read at every K/V step it takes part in, unless it stays in L2.
      per_head += (reuse == L2Reuse::none ? steps : 1.0) * rows * e * d;
      if (reuse == L2Reuse::all) {
        if (steps > 1)
          per_head += rows * row_state; // the fp32 O/l/m lines written back once, when evicted
      } else {
        per_head +=
            2.0 * (steps - 1) * rows * row_state; // O/l/m read at steps 1.., written at ..last-1
      }
      per_head += rows * row_final; // the last step writes the final O and the LSE
    }
  }
  double total = per_head * static_cast<double>(p.batch * p.heads_q);
  if (reuse == L2Reuse::all)
    total += 2.0 * e * d * static_cast<double>(p.kv_elems() / p.head_dim);
  return total;
}

} // namespace fb::fa1
