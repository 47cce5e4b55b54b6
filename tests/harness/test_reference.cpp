// The float64 reference against an independent CPU emulation of FA1's tiled online softmax (KV-outer order,
// O/l/m carried between K/V tiles exactly as the FA1 kernel carries them through HBM).
#include "flashbench/reference.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

using namespace fb;

namespace {

struct Inputs {
  std::vector<float> q, k, v;
};

Inputs random_inputs(const AttentionProblem &p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  Inputs in;
  for (auto *vec : {&in.q})
    vec->resize(p.q_elems());
  in.k.resize(p.kv_elems());
  in.v.resize(p.kv_elems());
  for (auto *vec : {&in.q, &in.k, &in.v})
    for (float &x : *vec)
      x = n(rng);
  return in;
}

// FA1 Algorithm 1: for each K/V tile j (outer), for each Q tile i (inner): update O_i, l_i, m_i.
ReferenceOutput fa1_emulation(const AttentionProblem &p, const Inputs &in, int64_t bm, int64_t bn) {
  const double ninf = -std::numeric_limits<double>::infinity();
  ReferenceOutput r;
  r.o.assign(p.q_elems(), 0.0);
  r.lse.assign(p.lse_elems(), ninf);
  std::vector<double> l(p.lse_elems(), 0.0), m(p.lse_elems(), ninf);
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  const double scale = p.softmax_scale();
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / p.group_size();
      for (int64_t j0 = 0; j0 < p.seqlen_kv; j0 += bn)
        for (int64_t i0 = 0; i0 < p.seqlen_q; i0 += bm)
          for (int64_t i = i0; i < std::min(i0 + bm, p.seqlen_q); ++i) {
            const int64_t row = (b * p.heads_q + h) * p.seqlen_q + i;
            std::vector<double> s;
            double mt = ninf;
            for (int64_t j = j0; j < std::min(j0 + bn, p.seqlen_kv); ++j) {
              double dot = 0;
              for (int64_t d = 0; d < p.head_dim; ++d)
                dot += double(in.q[b * qs.batch + i * qs.seq + h * qs.head + d]) *
                       in.k[b * ks.batch + j * ks.seq + hk * ks.head + d];
              s.push_back(j <= p.last_key(i) ? dot * scale : ninf);
              mt = std::max(mt, s.back());
            }
            const double m_new = std::max(m[row], mt);
            if (m_new == ninf)
              continue; // nothing visible yet
            const double a = std::exp(m[row] - m_new), c = mt == ninf ? 0.0 : std::exp(mt - m_new);
            double lt = 0;
            std::vector<double> pv(p.head_dim, 0.0);
            for (size_t t = 0; t < s.size(); ++t) {
              const double w = s[t] == ninf ? 0.0 : std::exp(s[t] - mt);
              lt += w;
              const int64_t j = j0 + int64_t(t);
              for (int64_t d = 0; d < p.head_dim; ++d)
                pv[d] += w * in.v[b * ks.batch + j * ks.seq + hk * ks.head + d];
            }
            const double l_new = a * l[row] + c * lt;
            double *o = &r.o[b * qs.batch + i * qs.seq + h * qs.head];
            for (int64_t d = 0; d < p.head_dim; ++d)
              o[d] = (l[row] * a * o[d] + c * pv[d]) / l_new;
            l[row] = l_new;
            m[row] = m_new;
          }
    }
  for (int64_t i = 0; i < p.lse_elems(); ++i)
    if (l[i] > 0)
      r.lse[i] = m[i] + std::log(l[i]);
  return r;
}

void expect_close(const ReferenceOutput &a, const ReferenceOutput &b, const std::string &what) {
  ASSERT_EQ(a.o.size(), b.o.size());
  for (size_t i = 0; i < a.o.size(); ++i)
    ASSERT_NEAR(a.o[i], b.o[i], 1e-12) << what << " o[" << i << "]";
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(a.lse[i])) {
      ASSERT_TRUE(std::isinf(b.lse[i])) << what << " lse[" << i << "]";
    } else {
      ASSERT_NEAR(a.lse[i], b.lse[i], 1e-12) << what << " lse[" << i << "]";
    }
  }
}

} // namespace

TEST(Reference, MatchesTiledOnlineSoftmaxEmulation) {
  std::random_device rd;
  struct Shape {
    int64_t b, hq, hkv, sq, skv, d;
    bool causal;
    Layout layout;
  };
  for (const Shape &s : {Shape{1, 1, 1, 1, 1, 8, false, Layout::bshd},
                         Shape{2, 4, 2, 37, 53, 16, false, Layout::bshd},
                         Shape{1, 4, 1, 53, 37, 16, true, Layout::bshd},
                         Shape{1, 2, 2, 29, 70, 8, true, Layout::bhsd}}) {
    AttentionProblem p;
    p.batch = s.b;
    p.heads_q = s.hq;
    p.heads_kv = s.hkv;
    p.seqlen_q = s.sq;
    p.seqlen_kv = s.skv;
    p.head_dim = s.d;
    p.causal = s.causal;
    p.layout = s.layout;
    const Inputs in = random_inputs(p, rd());
    const ReferenceOutput ref = cpu_reference(p, in.q.data(), in.k.data(), in.v.data());
    for (int64_t bm : {1, 16})
      for (int64_t bn : {7, 32})
        expect_close(ref, fa1_emulation(p, in, bm, bn), key(p));
  }
}

TEST(Reference, RowsThatSeeNoKeyGiveZeroAndMinusInfinity) {
  AttentionProblem p;
  p.heads_q = p.heads_kv = 1;
  p.seqlen_q = 5;
  p.seqlen_kv = 2; // causal bottom-right: rows 0..2 see nothing, row 3 sees key 0, row 4 keys 0..1
  p.head_dim = 4;
  p.causal = true;
  const Inputs in = random_inputs(p, 7);
  const ReferenceOutput r = cpu_reference(p, in.q.data(), in.k.data(), in.v.data());
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::isinf(r.lse[i]) && r.lse[i] < 0);
    for (int d = 0; d < 4; ++d)
      EXPECT_EQ(r.o[i * 4 + d], 0.0);
  }
  for (int d = 0; d < 4; ++d)
    EXPECT_NEAR(r.o[3 * 4 + d], in.v[d], 1e-7); // one visible key: O = V[0]
}
