#include "flashbench/reference.hpp"

#include <cmath>
#include <limits>
#include <vector>

namespace fb {

bool use_cpu_reference(const AttentionProblem &p) {
  const double work = static_cast<double>(p.heads_q) *
                      static_cast<double>(unmasked_pairs_total(p)) *
                      static_cast<double>(p.head_dim);
  return work <= kCpuReferenceMaxWork;
}

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

} // namespace fb
