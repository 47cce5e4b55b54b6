#include "flashbench/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace fb {

bool use_cpu_reference(const AttentionProblem &p) { return flops(p) / 4 <= kCpuReferenceMaxWork; }

ReferenceOutput cpu_reference(const AttentionProblem &p, const float *q, const float *k,
                              const float *v) {
  ReferenceOutput r;
  r.o.assign(static_cast<size_t>(p.q_elems()), 0.0);
  r.lse.assign(static_cast<size_t>(p.lse_elems()), -std::numeric_limits<double>::infinity());
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  const double scale = p.softmax_scale();
  std::vector<double> scores(static_cast<size_t>(p.seqlen_kv));
  std::vector<double> acc(static_cast<size_t>(p.head_dim));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / p.group_size();
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        // Each entry against its own length (kv_lens); K/V rows past it are never read.
        const int64_t last = std::min(p.last_key(i, b), p.kv_len(b) - 1);
        if (last < 0)
          continue; // sees no key: O = 0, LSE = -inf
        const float *qrow = q + b * qs.batch + i * qs.seq + h * qs.head;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= last; ++j) {
          const float *krow = k + b * ks.batch + j * ks.seq + hk * ks.head;
          double dot = 0;
          for (int64_t d = 0; d < p.head_dim; ++d)
            dot += static_cast<double>(qrow[d]) * krow[d];
          scores[j] = dot * scale;
          mx = std::max(mx, scores[j]);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= last; ++j) {
          const double w = std::exp(scores[j] - mx);
          sum += w;
          const float *vrow = v + b * ks.batch + j * ks.seq + hk * ks.head;
          for (int64_t d = 0; d < p.head_dim; ++d)
            acc[d] += w * vrow[d];
        }
        double *orow = r.o.data() + b * qs.batch + i * qs.seq + h * qs.head;
        for (int64_t d = 0; d < p.head_dim; ++d)
          orow[d] = acc[d] / sum;
        r.lse[(b * p.heads_q + h) * p.seqlen_q + i] = mx + std::log(sum);
      }
    }
  return r;
}

BackwardReference cpu_reference_backward(const AttentionProblem &p, const float *q, const float *k,
                                         const float *v, const float *o, const float *dout,
                                         const float *lse) {
  BackwardReference r;
  for (GradientReference *g : {&r.dq, &r.dk, &r.dv}) {
    const size_t n = static_cast<size_t>(g == &r.dq ? p.q_elems() : p.kv_elems());
    g->value.assign(n, 0.0);
    g->abs.assign(n, 0.0);
    g->floor.assign(n, 0.0);
  }
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  const double scale = p.softmax_scale();
  const int64_t dim = p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / p.group_size();
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const int64_t last = std::min(p.last_key(i), p.seqlen_kv - 1);
        const double row_lse = lse[(b * p.heads_q + h) * p.seqlen_q + i];
        // A row that sees no key has no softmax: it adds nothing anywhere (its LSE is -inf, exp would be NaN).
        if (last < 0 || !std::isfinite(row_lse))
          continue;
        const int64_t qoff = b * qs.batch + i * qs.seq + h * qs.head;
        const float *qrow = q + qoff, *orow = o + qoff, *dorow = dout + qoff;
        double *dq = r.dq.value.data() + qoff, *dq_abs = r.dq.abs.data() + qoff,
               *dq_floor = r.dq.floor.data() + qoff;
        double d_row = 0; // D = rowsum(dO * O)
        for (int64_t d = 0; d < dim; ++d)
          d_row += static_cast<double>(dorow[d]) * orow[d];
        for (int64_t j = 0; j <= last; ++j) {
          const int64_t koff = b * ks.batch + j * ks.seq + hk * ks.head;
          const float *krow = k + koff, *vrow = v + koff;
          double s = 0, dp = 0;
          for (int64_t d = 0; d < dim; ++d) {
            s += static_cast<double>(qrow[d]) * krow[d];
            dp += static_cast<double>(dorow[d]) * vrow[d];
          }
          const double pij = std::exp(scale * s - row_lse);
          const double ds = pij * (dp - d_row);
          double *dk = r.dk.value.data() + koff, *dk_abs = r.dk.abs.data() + koff,
                 *dk_floor = r.dk.floor.data() + koff;
          double *dv = r.dv.value.data() + koff, *dv_abs = r.dv.abs.data() + koff,
                 *dv_floor = r.dv.floor.data() + koff;
          for (int64_t d = 0; d < dim; ++d) {
            const double dod = dorow[d], kd = krow[d], qd = qrow[d];
            dv[d] += pij * dod;
            dv_abs[d] += pij * std::abs(dod);
            dv_floor[d] += std::abs(dod);
            dq[d] += scale * ds * kd;
            dq_abs[d] += scale * std::abs(ds * kd);
            dq_floor[d] += scale * std::abs(kd);
            dk[d] += scale * ds * qd;
            dk_abs[d] += scale * std::abs(ds * qd);
            dk_floor[d] += scale * std::abs(qd);
          }
        }
      }
    }
  return r;
}

} // namespace fb
