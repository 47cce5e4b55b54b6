// fa3_pipelined's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
//
// The kernel reads Q once, writes O and the LSE once, and every work tile streams the K/V tiles its rows see. The
// work order (traits.hpp: tile_order, tile_coord; plan_launch on the device's SMs and L2) cuts the (batch, head)
// pairs into L2 sections of whole GQA groups, so the tiles that run side by side share their K/V through L2: the
// model walks that order in waves of the resident CTAs (kernels/common/traffic.hpp: kv_dram). A stream-K tail
// (scheduler stream_k) adds one fp32 partial per chunk that starts inside a tile, written to the workspace and read
// back by the tile's first segment while still in L2. What is still dirty in L2 at the end has not reached DRAM
// when the counters stop (in_l2_at_end).
#pragma once

#include "kernels/common/traffic.hpp"
#include "kernels/fa3_pipelined/traits.hpp"

namespace fb::fa3 {

// One CTA per SM: the setmaxnreg budgets of every instantiation add up to 64512 of the SM's 65536 registers
// (traits.hpp: kProducerRegs, kConsumerRegs, kConsumerRegsWide).
constexpr int64_t kCtasPerSm = 1;

inline TrafficModel traffic(const AttentionProblem &p, const Params &c, const DeviceInfo &dev) {
  namespace t = fb::kernels::traffic;
  const double e = dtype_bytes(p.dtype), d = static_cast<double>(p.head_dim);
  const int64_t sms = std::max(1, dev.sm_count);
  const LaunchPlan plan = plan_launch(p, c, p.head_dim, sms, kCtasPerSm, dev.l2_bytes);
  const TileDecoder order(plan.order);
  const int64_t group = std::max<int64_t>(1, p.group_size());
  const auto unit = [&](int64_t u) {
    const TileCoord tc = tile_coord(order, static_cast<int>(u));
    const int64_t b = tc.bh / p.heads_q, h = tc.bh % p.heads_q;
    const int64_t tiles =
        kv_tiles_for(tc.qt, c.block_m, c.block_n, p.seqlen_q, p.seqlen_kv, p.causal);
    return t::KvRead{b * p.heads_kv + h / group,
                     2.0 * e * d * static_cast<double>(std::min(p.seqlen_kv, tiles * c.block_n))};
  };
  const double usable = t::usable_l2(dev);
  // Resident: the persistent grid, or a one-shot grid's CTAs one per SM, started in tile order.
  const int64_t resident = std::min<int64_t>(plan.total_tiles, sms * kCtasPerSm);
  const t::KvDram kv = t::kv_dram(plan.total_tiles, unit, resident, usable);
  // Stream-K: a chunk whose first K/V tile is not a tile's first writes its partial (per consumer warpgroup, every
  // thread's O accumulators, m and l).
  int64_t partials = 0;
  for (int k = 0; k < plan.split.ctas; ++k)
    partials += plan.split.lo(k) % plan.split.iters != 0;
  const double partial_bytes = static_cast<double>(partials) * c.consumers * 128.0 * 4.0 *
                               static_cast<double>(split_partial_floats(p.head_dim));
  const double q = e * static_cast<double>(p.q_elems());
  const double reads = q + kv.bytes;
  const double writes = q + 4.0 * static_cast<double>(p.lse_elems()) + partial_bytes;
  return t::settle(reads, writes, usable, t::kv_regime(kv, usable));
}

// Without a device (no L2, one SM): every work tile's K/V from DRAM (the no-reuse bound), nothing left in L2.
inline double traffic_bytes(const AttentionProblem &p, const Params &c) {
  return traffic(p, c, DeviceInfo{}).bytes;
}

} // namespace fb::fa3
