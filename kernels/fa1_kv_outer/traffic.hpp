// fa1_kv_outer's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
//
// The kernel's walk (fa1_kv_outer.cu): a CTA owns a chunk of Q tiles; at every K/V step it reads the K/V tile,
// and for each of its Q tiles that still sees keys it reads the Q rows and the fp32 running state O/l/m (not at
// step 0) and writes the state back (the final O and LSE at the tile's last step). What of that reaches DRAM:
//  - K/V: the CTAs of one head (and the q heads of a GQA group) are neighbours in the grid (Q chunk fastest) and
//    step through the same K/V tiles side by side: kernels/common/traffic.hpp's kv_dram over waves of resident CTAs.
//  - Q and the state: between two steps of a CTA, all resident CTAs touch their Q rows and state once, the per-step
//    set S = resident CTAs x rows per CTA x (Q row + state row). Against x = S / usable L2, the re-reads miss with
//    the fraction u(x) of a cache that evicts a random line per miss (cyclic_miss: 0 up to x = 1, 0.80 at x = 2);
//    every missed state read also cost a state write-back. Without misses Q is read once and the state written
//    back once.
//  - Between x = 1/2 and x = 4 the hit rate is not decided by the sizes alone: which SMs share a line decides
//    whether it occupies one L2 partition or both (the usable L2 is then between half and all of it), and the
//    replacement policy is not documented (LRU misses everything past x = 1, random replacement keeps 20% at
//    x = 2). Measured on H100 and H200: 3% of the re-reads miss at x = 1.01, 70-95% at 1.7, 75-100% at 2. There the
//    model gives the whole range, all re-reads hitting to all missing, with the random-replacement count as its
//    estimate, and says why (bytes_model_reason).
//  - What is still dirty in L2 at the end has not reached DRAM when the counters stop (in_l2_at_end).
#pragma once

#include "kernels/common/traffic.hpp"
#include "kernels/fa1_kv_outer/traits.hpp"

#include <vector>

namespace fb::fa1 {

// Per-step working set over the usable L2 between which the re-reads' hit rate is open (above).
constexpr double kOpenFrom = 0.5, kOpenTo = 4.0;

// The walk of one (batch, q head), in bytes, and each chunk's K/V (the CTA's reads up to its last K/V tile).
struct Walk {
  double q_once = 0, q_every_step = 0; // Q rows read once / at every step they take part in
  double state_once = 0;        // the fp32 state written back once (tiles with more than one step)
  double state_round_trips = 0; // state read at steps 1.., written at steps ..last-1 (each way)
  double finals = 0;            // the final O (dtype) and LSE
  std::vector<double> chunk_kv;
};

inline Walk walk(const AttentionProblem &p, const Params &c) {
  const double e = dtype_bytes(p.dtype), d = static_cast<double>(p.head_dim);
  const double row_state = 4.0 * d + 8.0; // O (fp32) + l + m of one row
  const double row_final = e * d + 4.0;   // O (dtype) + LSE of one row
  const int64_t tiles = num_q_tiles(p, c), per_cta = tiles_per_cta(p, c);
  Walk w;
  for (int64_t t0 = 0; t0 < tiles; t0 += per_cta) {
    const int64_t t1 = std::min(tiles, t0 + per_cta);
    const int64_t j_end =
        last_kv_tile(t1 - 1, c.block_m, c.block_n, p.seqlen_q, p.seqlen_kv, p.causal) + 1;
    w.chunk_kv.push_back(2.0 * e * d *
                         static_cast<double>(std::min<int64_t>(p.seqlen_kv, j_end * c.block_n)));
    for (int64_t i = t0; i < t1; ++i) {
      const double rows =
          static_cast<double>(std::min<int64_t>(c.block_m, p.seqlen_q - i * c.block_m));
      const double steps = static_cast<double>(
          last_kv_tile(i, c.block_m, c.block_n, p.seqlen_q, p.seqlen_kv, p.causal) + 1);
      w.finals +=
          rows *
          row_final; // a tile no row of which sees a key is written once as O = 0, LSE = -inf
      if (steps == 0)
        continue;
      w.q_once += rows * e * d;
      w.q_every_step += steps * rows * e * d;
      if (steps > 1)
        w.state_once += rows * row_state;
      w.state_round_trips += (steps - 1) * rows * row_state;
    }
  }
  return w;
}

inline TrafficModel traffic(const AttentionProblem &p, const Params &c, const DeviceInfo &dev) {
  namespace t = fb::kernels::traffic;
  const Walk w = walk(p, c);
  const int64_t chunks = static_cast<int64_t>(w.chunk_kv.size());
  const int64_t group = std::max<int64_t>(1, p.group_size()), units = chunks * p.heads_q * p.batch;
  const auto unit = [&](int64_t u) {
    const int64_t h = (u / chunks) % p.heads_q, b = u / (chunks * p.heads_q);
    return t::KvRead{b * p.heads_kv + h / group, w.chunk_kv[static_cast<size_t>(u % chunks)]};
  };
  const double usable = t::usable_l2(dev);
  const int64_t resident =
      std::min(units, dev.sm_count > 0 ? dev.sm_count * ctas_per_sm(p, c, dev) : int64_t(1));
  const t::KvDram kv = t::kv_dram(units, unit, resident, usable);
  const double heads = static_cast<double>(p.batch * p.heads_q);
  const double e = dtype_bytes(p.dtype), d = static_cast<double>(p.head_dim);
  const double step_set =
      static_cast<double>(resident * tiles_per_cta(p, c) * c.block_m) * (e * d + 4.0 * d + 8.0);
  const double x = usable > 0 ? step_set / usable : INFINITY;
  // DRAM bytes when a fraction `miss` of the Q and state re-reads misses.
  const auto at = [&](double miss) {
    const double reads =
        heads * (w.q_once + miss * (w.q_every_step - w.q_once + w.state_round_trips)) + kv.bytes;
    const double writes =
        heads * ((1.0 - miss) * w.state_once + miss * w.state_round_trips + w.finals);
    return std::pair{reads, writes};
  };
  const double miss = usable > 0 ? t::cyclic_miss(x) : 1.0;
  const auto [reads, writes] = at(miss);
  char regime[240];
  std::snprintf(regime, sizeof regime,
                "Q and O/l/m re-reads %.0f%% from DRAM (per-step set %s, %.2fx the usable L2)",
                100.0 * miss, t::mb(step_set).c_str(), x);
  TrafficModel m = t::settle(reads, writes, usable, t::kv_regime(kv, usable) + "; " + regime);
  if (usable > 0 && x >= kOpenFrom && x < kOpenTo) {
    const auto none = at(0.0), all = at(1.0);
    m.low = none.first; // no re-read misses, every write still in L2: the least the counters see
    m.high = all.first + all.second; // every re-read misses, nothing left in L2
    std::snprintf(regime, sizeof regime,
                  "the per-step set (%s) is %.2fx the usable L2 (%s), where the L2's partitions "
                  "and replacement "
                  "policy, not the sizes, decide how many of its re-reads hit",
                  t::mb(step_set).c_str(), x, t::mb(usable).c_str());
    m.reason = std::string(regime) + "; estimate: " + m.reason;
  }
  return m;
}

// register.cpp's device overload hands the device through l2_reuse(); the model is traffic() above.
struct L2Reuse {
  DeviceInfo dev; // a default DeviceInfo (no L2): the no-reuse bound
};
inline L2Reuse l2_reuse(const AttentionProblem &, const Params &, const DeviceInfo &dev) {
  return {dev};
}

inline double traffic_bytes(const AttentionProblem &p, const Params &c, const L2Reuse &reuse = {}) {
  return traffic(p, c, reuse.dev).bytes;
}

} // namespace fb::fa1
