// fa2_q_outer's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
//
// The kernel reads Q once, writes O and the LSE once, and every CTA (one Q tile) streams the K/V tiles its rows see.
// The grid is (Q tile, q head, batch) with the Q tile fastest (heaviest tile first), so the CTAs of one q head, and
// the q heads of one GQA group, start side by side: the L2 serves a KV head's K/V to all of them from one DRAM read
// (kernels/common/traffic.hpp: kv_dram, waves of the SMs' resident CTAs). What is still dirty in L2 at the end has
// not reached DRAM when the counters stop (in_l2_at_end).
#pragma once

#include "kernels/common/traffic.hpp"
#include "kernels/fa2_q_outer/traits.hpp"

namespace fb::fa2 {

// CTAs of a config resident on one SM: shared memory (plus the 1 KB the runtime keeps per block), warps, and
// registers. The register count is register_estimate's score (calibrated against ptxas: the shapes at or under the
// budget compile spill-free), rounded up to ptxas's allocation unit of 8 and capped at 255 (__launch_bounds__(W, 1)
// lets ptxas take up to 255). 1 without a device.
inline int64_t ctas_per_sm(const AttentionProblem &p, const Params &c, const DeviceInfo &dev) {
  if (dev.smem_per_sm <= 0 || dev.regs_per_sm <= 0 || dev.max_threads_per_sm <= 0)
    return 1;
  const int64_t threads = 32 * int64_t(c.warps);
  const int est =
      register_estimate(static_cast<int>(p.head_dim), c.block_m, c.block_n, c.warps, split_q(c));
  const int64_t regs = std::min<int64_t>(255, (est + 7) / 8 * 8);
  const int64_t by_smem = dev.smem_per_sm / (smem_bytes(p.head_dim, c) + 1024);
  const int64_t by_regs = dev.regs_per_sm / (regs * threads);
  const int64_t by_threads = dev.max_threads_per_sm / threads;
  int64_t n = std::min({by_smem, by_regs, by_threads});
  if (dev.max_blocks_per_sm > 0)
    n = std::min<int64_t>(n, dev.max_blocks_per_sm);
  return std::max<int64_t>(1, n);
}

inline TrafficModel traffic(const AttentionProblem &p, const Params &c, const DeviceInfo &dev) {
  namespace t = fb::kernels::traffic;
  const double e = dtype_bytes(p.dtype), d = static_cast<double>(p.head_dim);
  const int64_t nq = num_q_tiles(p, c), group = std::max<int64_t>(1, p.group_size());
  const int64_t units = nq * p.heads_q * p.batch;
  const auto unit = [&](int64_t u) {
    const int64_t qt = nq - 1 - u % nq, h = (u / nq) % p.heads_q, b = u / (nq * p.heads_q);
    const int64_t tiles = kv_tiles_for(qt, c.block_m, c.block_n, p.seqlen_q, p.seqlen_kv, p.causal);
    return t::KvRead{b * p.heads_kv + h / group,
                     2.0 * e * d * static_cast<double>(std::min(p.seqlen_kv, tiles * c.block_n))};
  };
  const double usable = t::usable_l2(dev);
  const t::KvDram kv =
      t::kv_dram(units, unit, std::max(1, dev.sm_count) * ctas_per_sm(p, c, dev), usable);
  const double q = e * static_cast<double>(p.q_elems());
  const double reads = q + kv.bytes;
  const double writes = q + 4.0 * static_cast<double>(p.lse_elems()); // O in the input dtype, LSE
  return t::settle(reads, writes, usable, t::kv_regime(kv, usable));
}

// Without a device: every CTA's K/V from DRAM (the no-reuse bound), nothing left in L2.
inline double traffic_bytes(const AttentionProblem &p, const Params &c) {
  return traffic(p, c, DeviceInfo{}).bytes;
}

} // namespace fb::fa2
