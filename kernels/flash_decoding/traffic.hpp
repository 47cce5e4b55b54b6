// flash_decoding's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
//
// The split kernel's grid is (split, KV head x row block, batch) with the split fastest: CTA (s, hkv, mb, b) reads
// Q of its 16 packed rows once and keys [s x keys_per_split, min(kv_end, (s + 1) x keys_per_split)) of its KV head,
// where kv_end is the row block's last visible key (traits.hpp: group_kv_end). The row blocks of one KV head are
// neighbours in the grid, so the L2 serves each split's K/V to all of them from one DRAM read (kernels/common/
// traffic.hpp: kv_dram over groups (batch, KV head, split), waves of the resident CTAs). A row block that uses two
// or more splits writes one fp32 partial (O and LSE) per split and row; the fused combine (its last CTA) reads them
// back while they are still in L2, the two-kernel combine after all split CTAs, from DRAM for the part that has
// left L2. Partials, O and LSE are written; what is still dirty in L2 at the end has not reached DRAM when the
// counters stop (in_l2_at_end), which is most of the partials on a small problem.
#pragma once

#include "kernels/common/traffic.hpp"
#include "kernels/flash_decoding/traits.hpp"

namespace fb::fdec {

// The split plan on a device (its SMs and shared memory), as register.cpp's plan() makes it on the current one.
inline SplitPlan plan_on(const AttentionProblem &p, const Params &c, const DeviceInfo &dev) {
  DeviceFacts f;
  if (dev.sm_count > 0)
    f = DeviceFacts{dev.sm_count, dev.smem_per_sm, dev.smem_per_block_optin};
  return split_plan(p, c, f);
}

inline TrafficModel traffic(const AttentionProblem &p, const Params &c, const SplitPlan &plan,
                            const DeviceInfo &dev) {
  namespace t = fb::kernels::traffic;
  const double e = dtype_bytes(p.dtype), d = static_cast<double>(p.head_dim);
  const int64_t rows = packed_rows(p), mbs = row_blocks(p);
  const int64_t splits = std::max(1, plan.splits);
  const int64_t kps = std::max<int64_t>(plan.keys_per_split, 1);
  const int64_t units = splits * p.heads_kv * mbs * p.batch;
  const auto unit = [&](int64_t u) {
    const int64_t s = u % splits, y = (u / splits) % (p.heads_kv * mbs),
                  b = u / (splits * p.heads_kv * mbs);
    const int64_t hkv = y / mbs, mb = y % mbs;
    const int64_t end = std::min(group_kv_end(p, b, mb), (s + 1) * kps);
    return t::KvRead{(b * p.heads_kv + hkv) * splits + s,
                     2.0 * e * d * static_cast<double>(std::max<int64_t>(0, end - s * kps))};
  };
  double partials = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t mb = 0; mb < mbs; ++mb) {
      const int64_t active = (group_kv_end(p, b, mb) + kps - 1) / kps;
      if (active >= 2)
        partials += static_cast<double>(p.heads_kv) * static_cast<double>(active) *
                    static_cast<double>(std::min<int64_t>(kRowsPerCta, rows - mb * kRowsPerCta)) *
                    (4.0 * d + 4.0);
    }
  const double usable = t::usable_l2(dev);
  const int64_t resident = std::max(1, dev.sm_count) * int64_t(std::max(1, plan.ctas_per_sm));
  const t::KvDram kv = t::kv_dram(units, unit, resident, usable);
  const double q = e * static_cast<double>(p.q_elems());
  double reads = q + kv.bytes;
  const double writes = q + 4.0 * static_cast<double>(p.lse_elems()) + partials; // O, LSE, partials
  // The partials read back: fused, by the row block's last CTA right after its neighbours wrote them (from L2, on
  // a device); two kernels, after every split CTA, from DRAM for the part no longer in L2 (the same proportion as
  // for the written lines: in_l2_at_end).
  if (partials > 0 && (c.fused == 0 || usable <= 0))
    reads += partials * (1.0 - t::in_l2_at_end(reads, writes, usable) / writes);
  return t::settle(reads, writes, usable, t::kv_regime(kv, usable));
}

inline TrafficModel traffic(const AttentionProblem &p, const Params &c, const DeviceInfo &dev) {
  return traffic(p, c, plan_on(p, c, dev), dev);
}

// Without a device (no L2): every split's K/V from DRAM once per row block (the no-reuse bound), the partials
// written and read back, nothing left in L2.
inline double traffic_bytes(const AttentionProblem &p, const Params &c, const SplitPlan &plan) {
  return traffic(p, c, plan, DeviceInfo{}).bytes;
}

} // namespace fb::fdec
