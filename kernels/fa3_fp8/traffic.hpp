// fa3_fp8's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
//
// The kernel reads Q once (e4m3), writes O (bf16) and the LSE once, and every work item streams the K/V tiles
// (e4m3) its rows see; V is transposed in shared memory, so no byte of V^T reaches memory. Its work order is Q tile
// rank major (fa3_fp8.cu: tile_of): all (batch, head) pairs' first Q tile, then all their second, ..., so the items
// running side by side belong to as many heads as there are SMs, and a head comes back once per rank. Where those
// heads' K/V exceed the usable L2 (b16 h16 N1024: 132 heads x 256 KB = 34 MB), every rank reads K/V from DRAM again:
// the model walks the order in waves of the resident CTAs (kernels/common/traffic.hpp: kv_dram). The descales (one
// float per 128 tokens of Q and K per head, one per KV head for V) are under 0.1% and not counted. What is still
// dirty in L2 at the end has not reached DRAM when the counters stop (in_l2_at_end).
#pragma once

#include "kernels/common/traffic.hpp"
#include "kernels/fa3_fp8/traits.hpp"

namespace fb::fa3fp8 {

// K/V tiles that the work item of Q tile qt visits: all, or (causal, bottom-right aligned) up to the last key its
// last row sees. The host twin of fa3_fp8.cu's kv_tiles (device code).
inline int64_t kv_tiles_of(const AttentionProblem &p, int64_t qt, int64_t block_n) {
  const int64_t all = (p.seqlen_kv + block_n - 1) / block_n;
  if (!p.causal)
    return all;
  const int64_t last_key =
      std::min<int64_t>((qt + 1) * kBlockM, p.seqlen_q) - 1 + (p.seqlen_kv - p.seqlen_q);
  return last_key < 0 ? 0 : std::min<int64_t>(all, last_key / block_n + 1);
}

inline TrafficModel traffic(const AttentionProblem &p, const Params &c, const DeviceInfo &dev) {
  namespace t = fb::kernels::traffic;
  const double d = static_cast<double>(p.head_dim);
  const int64_t nq = num_q_tiles(p), pairs = p.heads_q * p.batch, items = nq * pairs;
  const int64_t group = std::max<int64_t>(1, p.group_size());
  const auto unit = [&](int64_t lin) {
    const int64_t rank = lin / pairs, x = lin % pairs, h = x % p.heads_q, b = x / p.heads_q;
    const int64_t qt = p.causal ? nq - 1 - rank : rank;
    return t::KvRead{
        b * p.heads_kv + h / group,
        2.0 * d *
            static_cast<double>(std::min(p.seqlen_kv, kv_tiles_of(p, qt, c.block_n) * c.block_n))};
  };
  // One CTA per SM (its shared memory and registers allow no second), persistent or one-shot, in item order.
  const int64_t resident = std::min<int64_t>(items, std::max(1, dev.sm_count));
  const double usable = t::usable_l2(dev);
  const t::KvDram kv = t::kv_dram(items, unit, resident, usable);
  const double q = static_cast<double>(p.q_elems());
  const double reads = q + kv.bytes;
  const double writes = 2.0 * q + 4.0 * static_cast<double>(p.lse_elems()); // O bf16, LSE
  return t::settle(reads, writes, usable, t::kv_regime(kv, usable));
}

// Without a device (no L2, one SM): every item's K/V from DRAM (the no-reuse bound), nothing left in L2.
inline double traffic_bytes(const AttentionProblem &p, const Params &c) {
  return traffic(p, c, DeviceInfo{}).bytes;
}

} // namespace fb::fa3fp8
