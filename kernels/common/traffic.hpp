// The L2 physics that every variant's traffic model shares; each variant's traffic.hpp applies it to its own
// schedule (grid order, resident CTAs, what each CTA reads). Host arithmetic only: like every traffic.hpp, the tuning
// tables' source hash leaves this file out (harness/source_hashes.cmake), so a better model leaves tuned entries
// fresh. docs/counters.md states the models; scripts/model_check.py checks them against CUPTI's DRAM bytes.
//
// Three quantities, one rule each:
//  1. usable_l2: what data read by CTAs on many SMs can use of the L2.
//  2. kv_dram: how often K/V reach DRAM, from the order in which the GPU starts the work (waves of resident CTAs).
//  3. in_l2_at_end: how much of what a kernel wrote is still dirty in L2 when the counters stop (L2 is write-back;
//     those lines reach DRAM after the kernel, when something else evicts them), which is why small problems measure
//     below bytes_min.
#pragma once

#include "flashbench/device.hpp"
#include "flashbench/traffic.hpp"
#include "kernels/common/bwd.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fb::kernels::traffic {

// Half the L2. H100 and H200 split the L2 into two partitions, each caching lines for the SMs attached to it, so a
// line that SMs on both sides read takes a place in both: data that every SM reads (K/V shared by a head's CTAs)
// has half the L2. The project's one L2 constant: fa3_pipelined's work order sizes its L2 sections by the same half.
// 0 without a device (dev.l2_bytes 0): the models then count no reuse at all, the no-reuse bound.
inline double usable_l2(const DeviceInfo &dev) {
  return dev.l2_bytes > 0 ? 0.5 * static_cast<double>(dev.l2_bytes) : 0.0;
}

// One work unit (a CTA, or one work tile of a persistent CTA) as the GPU starts it: the group of units that read the
// same K/V (a KV head of one batch entry, or one split of it), and the bytes of that K/V this unit reads (a prefix:
// causal units read up to their last visible key).
struct KvRead {
  int64_t group = 0;
  double bytes = 0;
};

struct KvDram {
  double bytes = 0;        // K/V bytes from DRAM
  double once = 0;         // K/V bytes if every group's largest read reached DRAM once
  double max_wave_set = 0; // the largest K/V set one wave streams
  double ratio() const { return once > 0 ? bytes / once : 1.0; }
};

// K/V bytes that reach DRAM when `units` work units start in order, `resident` at a time (SMs x CTAs per SM, or the
// persistent grid), unit_at(u) giving unit u's KvRead:
//  - units run in waves of `resident` consecutive ones, which stream their K/V tile by tile side by side: the units
//    of one wave that read one group's K/V read it from DRAM once (the largest of their reads);
//  - a group that comes back in a later wave still finds its K/V in L2 when the K/V streamed by the waves since its
//    last use (that wave's included) fits the usable L2; otherwise all of it has been evicted (LRU against a stream
//    larger than the cache keeps nothing of it) and it is read again.
// The wave set counts K/V only: each Q and O line passes through L2 once, while a group's K/V lines are touched by
// each of its units, so LRU evicts Q and O first.
template <class UnitAt>
KvDram kv_dram(int64_t units, UnitAt &&unit_at, int64_t resident, double usable) {
  KvDram out;
  resident = std::max<int64_t>(1, resident);
  struct Seen {
    int64_t wave;
    double cached, largest;
  };
  std::unordered_map<int64_t, Seen>
      seen; // group -> wave of its last use, its K/V in L2 then, its largest read
  std::vector<double> before{0.0}; // before[k]: K/V streamed by waves 0 .. k-1
  std::unordered_map<int64_t, double> wave;
  std::vector<int64_t> order; // the wave's groups in first-use order (deterministic sums)
  for (int64_t w0 = 0, k = 0; w0 < units; w0 += resident, ++k) {
    wave.clear();
    order.clear();
    for (int64_t u = w0, end = std::min(units, w0 + resident); u < end; ++u) {
      const KvRead r = unit_at(u);
      const auto [it, fresh] = wave.try_emplace(r.group, r.bytes);
      if (fresh)
        order.push_back(r.group);
      else
        it->second = std::max(it->second, r.bytes);
    }
    double set = 0;
    for (const int64_t g : order) {
      const double need = wave[g];
      set += need;
      const auto it = seen.find(g);
      if (it == seen.end()) {
        out.bytes += need;
        seen.emplace(g, Seen{k, need, need});
      } else if (before[k] - before[it->second.wave] <= usable) {
        out.bytes += std::max(0.0, need - it->second.cached);
        it->second = Seen{k, std::max(need, it->second.cached), std::max(need, it->second.largest)};
      } else {
        out.bytes += need;
        it->second = Seen{k, need, std::max(need, it->second.largest)};
      }
    }
    before.push_back(before.back() + set);
    out.max_wave_set = std::max(out.max_wave_set, set);
  }
  for (const auto &[g, s] : seen)
    out.once += s.largest;
  return out;
}

// Written bytes still dirty in L2 when the counters stop. L2 is write-back: a written line reaches DRAM only when
// it is evicted. When the kernel ends, the usable L2 holds the last lines the kernel brought in (lines read from
// DRAM, lines it wrote), the written ones in proportion writes / (reads + writes); when everything it moved fits
// the usable L2, nothing it wrote has been evicted yet.
inline double in_l2_at_end(double reads, double writes, double usable) {
  const double moved = reads + writes;
  return moved > 0 ? writes * std::min(1.0, usable / moved) : 0.0;
}

// Miss fraction u of a set of `x` times the usable L2 that is re-read cyclically through a cache that evicts a random
// line per miss: a line survives the x·u·capacity misses between two of its reads with probability exp(-x·u), so
// 1 - u = exp(-x·u). u = 0 up to x = 1 (the set fits); 0.80 at x = 2, 0.98 at x = 4.
inline double cyclic_miss(double x) {
  if (!(x > 1.0))
    return 0.0;
  // Newton from u = 1: f(u) = 1 - u - exp(-x u) is concave and negative above its root, so the steps descend to
  // the root without overshooting (u = 0, the other root, is never reached).
  double u = 1.0;
  for (int i = 0; i < 100; ++i) {
    const double e = std::exp(-x * u), f = 1.0 - u - e, df = -1.0 + x * e;
    const double next = u - f / df;
    if (std::abs(next - u) < 1e-15)
      break;
    u = next;
  }
  return u;
}

// "12.3 MB" (or "8.2 kB" below 0.1 MB), for the reasons.
inline std::string mb(double bytes) {
  char buf[32];
  if (bytes < 1e5)
    std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

// "K/V 1.00x from DRAM (largest wave K/V set 16.8 MB, usable L2 26.2 MB)".
inline std::string kv_regime(const KvDram &kv, double usable) {
  char buf[160];
  if (usable <= 0)
    std::snprintf(buf, sizeof buf, "K/V %.2fx from DRAM (no device: no L2 reuse counted)",
                  kv.ratio());
  else
    std::snprintf(buf, sizeof buf, "K/V %.2fx from DRAM (largest wave K/V set %s, usable L2 %s)",
                  kv.ratio(), mb(kv.max_wave_set).c_str(), mb(usable).c_str());
  return buf;
}

// What is left in L2 at the end, for the reason.
inline std::string at_end(double reads, double writes, double usable) {
  if (usable <= 0 || writes <= 0)
    return "";
  const double left = in_l2_at_end(reads, writes, usable);
  if (reads + writes <= usable)
    return "all " + mb(reads + writes) + " moved fits the usable L2: the " + mb(writes) +
           " written is still in L2 when the counters stop";
  return mb(left) + " of the writes still in L2 when the counters stop";
}

// A model that commits to one count: reads plus the writes that have left L2 by the end, and its regime.
inline TrafficModel settle(double reads, double writes, double usable, const std::string &regime) {
  TrafficModel m;
  m.bytes = reads + writes - in_l2_at_end(reads, writes, usable);
  const std::string end = at_end(reads, writes, usable);
  m.reason = end.empty() ? regime : regime + "; " + end;
  return m;
}

// The no-reuse bound of a column-parallel backward (fa2_bwd, fa3_bwd), in parts for the variants' DESIGN.md and
// tests: a CTA holds one column block (block_n keys) of one kv head and walks the row blocks (block_m rows) of every
// query head of its GQA group, so K and V are read once per column block and dK, dV written once; Q, dO, LSE₂ and
// D are read, and the fp32 dQ partial (4 bytes an element) is added, once per visited (row block, column block,
// query head). L2 serves most of the row-block reads in practice (the column blocks of a head run side by side and
// read the same row blocks at about the same time, and a head's accumulator stays in L2 while they reduce into it),
// so the measured DRAM bytes sit far below this bound on long sequences; the report shows both.
struct BackwardBound {
  double preprocess = 0; // O, dO and LSE read; LSE₂, D and the zeroed dQ accumulator written
  double kv = 0;         // K and V read once per column block, dK and dV written once
  double q_rows = 0;     // Q, dO, LSE₂ and D read once per visited (row block, column block)
  double dq_add = 0;     // fp32 dQ partials reduced into the accumulator, once per visited pair
  double convert = 0;    // the accumulator read, dQ written
  double total() const { return preprocess + kv + q_rows + dq_add + convert; }
};
inline BackwardBound backward_bound(const AttentionProblem &p, int block_m, int block_n) {
  const double e = dtype_bytes(p.dtype), d = static_cast<double>(p.head_dim);
  const double rows_pad = static_cast<double>(bwd::padded_rows(p.seqlen_q, block_m));
  const double sq = static_cast<double>(p.seqlen_q), bm = block_m;
  BackwardBound t;
  const double q_heads = static_cast<double>(p.batch * p.heads_q);
  t.preprocess =
      q_heads * (2.0 * e * d * sq + 4.0 * sq + 2.0 * 4.0 * rows_pad + 4.0 * d * rows_pad);
  t.convert = q_heads * (4.0 * d * sq + e * d * sq);

  double kv_rows = 0, q_rows = 0, visits = 0; // per kv head, for one query head of its group
  for (int64_t n = 0, cols = (p.seqlen_kv + block_n - 1) / block_n; n < cols; ++n) {
    kv_rows += static_cast<double>(std::min<int64_t>(block_n, p.seqlen_kv - n * block_n));
    const bwd::RowRange r =
        bwd::row_blocks_for(n, block_m, block_n, p.seqlen_q, p.seqlen_kv, p.causal);
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

} // namespace fb::kernels::traffic
