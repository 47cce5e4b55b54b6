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

// ---- The backward reference: against central differences of f = sum(O * dO) in float64, where O is the float64
// forward reference of the same inputs (the gradient of f is exactly what dQ, dK and dV are).
namespace {

struct BackwardInputs {
  AttentionProblem p; // pass bwd
  std::vector<float> q, k, v, dout, o, lse;
};

AttentionProblem forward_of(AttentionProblem p) {
  p.pass = Pass::fwd;
  return p;
}

BackwardInputs backward_inputs(const AttentionProblem &p, uint64_t seed) {
  BackwardInputs in;
  in.p = p;
  const Inputs fwd = random_inputs(p, seed);
  in.q = fwd.q;
  in.k = fwd.k;
  in.v = fwd.v;
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> n(0.f, 1.f);
  in.dout.resize(static_cast<size_t>(p.q_elems()));
  for (float &x : in.dout)
    x = n(rng);
  const ReferenceOutput r = cpu_reference(forward_of(p), in.q.data(), in.k.data(), in.v.data());
  in.o.assign(r.o.begin(), r.o.end());
  in.lse.assign(r.lse.begin(), r.lse.end());
  return in;
}

double objective(const BackwardInputs &in) {
  const ReferenceOutput r = cpu_reference(forward_of(in.p), in.q.data(), in.k.data(), in.v.data());
  double f = 0;
  for (size_t i = 0; i < r.o.size(); ++i)
    f += r.o[i] * in.dout[i];
  return f;
}

// Central differences of every element of `x` (one of in's q, k, v) against `grad`. The step is taken in float
// and the quotient uses the step actually taken, so the only errors are the O(h^2) truncation and the reference
// reading O and LSE rounded to fp32 (relative ~1e-7 of each term): both well under 1e-5 of the terms' sum.
void expect_gradient(BackwardInputs &in, std::vector<float> &x, const GradientReference &grad,
                     const char *name) {
  constexpr double h = 1e-3;
  ASSERT_EQ(x.size(), grad.value.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    const float xp = static_cast<float>(x0 + h), xm = static_cast<float>(x0 - h);
    x[i] = xp;
    const double fp = objective(in);
    x[i] = xm;
    const double fm = objective(in);
    x[i] = x0;
    const double fd = (fp - fm) / (static_cast<double>(xp) - xm);
    EXPECT_NEAR(grad.value[i], fd, 1e-6 + 1e-5 * grad.abs[i])
        << name << "[" << i << "] of " << key(in.p);
    EXPECT_TRUE(std::isfinite(grad.value[i]));
    EXPECT_GE(grad.abs[i], std::abs(grad.value[i]) * (1 - 1e-12));
    EXPECT_GE(grad.floor[i], 0);
  }
}

AttentionProblem bwd_problem(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                             bool causal) {
  AttentionProblem p;
  p.batch = b;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = sq;
  p.seqlen_kv = skv;
  p.head_dim = d;
  p.causal = causal;
  p.pass = Pass::bwd;
  return p;
}

} // namespace

TEST(Reference, BackwardMatchesCentralDifferences) {
  std::random_device rd;
  for (const AttentionProblem &p : {
           bwd_problem(1, 1, 1, 1, 1, 4, false), // length 1
           bwd_problem(2, 4, 2, 5, 7, 3, false), // GQA 2, odd lengths and head_dim
           bwd_problem(1, 4, 1, 7, 4, 4, true),  // causal Sq > Skv: rows 0..2 see no key; MQA
           bwd_problem(1, 2, 2, 3, 6, 5, true),  // causal Sq < Skv
           bwd_problem(1, 2, 1, 1, 5, 4, true),  // one query over every key, GQA 2
       }) {
    const uint64_t seed = rd();
    SCOPED_TRACE("seed " + std::to_string(seed));
    BackwardInputs in = backward_inputs(p, seed);
    const BackwardReference r = cpu_reference_backward(p, in.q.data(), in.k.data(), in.v.data(),
                                                       in.o.data(), in.dout.data(), in.lse.data());
    ASSERT_EQ(r.dq.value.size(), static_cast<size_t>(p.q_elems()));
    ASSERT_EQ(r.dk.value.size(), static_cast<size_t>(p.kv_elems()));
    expect_gradient(in, in.q, r.dq, "dq");
    expect_gradient(in, in.k, r.dk, "dk");
    expect_gradient(in, in.v, r.dv, "dv");
  }
}

TEST(Reference, BackwardRowsThatSeeNoKeyGiveZeroNeverNaN) {
  // Causal bottom-right, Sq 7 > Skv 4: rows 0..2 see no key (LSE -inf). Their dQ is exactly 0, and dO of those
  // rows, however large, moves no dK or dV.
  const AttentionProblem p = bwd_problem(1, 2, 1, 7, 4, 4, true);
  BackwardInputs in = backward_inputs(p, 11);
  for (int64_t i = 0; i < 3; ++i)
    ASSERT_TRUE(std::isinf(in.lse[static_cast<size_t>(i)]) && in.lse[static_cast<size_t>(i)] < 0);
  const BackwardReference a = cpu_reference_backward(p, in.q.data(), in.k.data(), in.v.data(),
                                                     in.o.data(), in.dout.data(), in.lse.data());
  const Strides qs = p.q_strides();
  for (int64_t h = 0; h < p.heads_q; ++h)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t d = 0; d < p.head_dim; ++d) {
        const size_t e = static_cast<size_t>(i * qs.seq + h * qs.head + d);
        EXPECT_EQ(a.dq.value[e], 0.0);
        EXPECT_EQ(a.dq.floor[e], 0.0);
        in.dout[e] = 1e6f;
      }
  const BackwardReference b = cpu_reference_backward(p, in.q.data(), in.k.data(), in.v.data(),
                                                     in.o.data(), in.dout.data(), in.lse.data());
  EXPECT_EQ(a.dk.value, b.dk.value);
  EXPECT_EQ(a.dv.value, b.dv.value);
  for (const auto *g : {&b.dq, &b.dk, &b.dv})
    for (double x : g->value)
      EXPECT_TRUE(std::isfinite(x));
}

TEST(Reference, BackwardSumsWithOneKey) {
  // One key: P = 1 for every row, so dV[0] = sum over rows and the group's heads of dO, and both of its sums are
  // sum |dO|; dQ's floor is scale |K[0]| a row.
  const AttentionProblem p = bwd_problem(1, 3, 1, 4, 1, 2, false);
  const BackwardInputs in = backward_inputs(p, 5);
  const BackwardReference r = cpu_reference_backward(p, in.q.data(), in.k.data(), in.v.data(),
                                                     in.o.data(), in.dout.data(), in.lse.data());
  for (int64_t d = 0; d < p.head_dim; ++d) {
    double sum = 0, abs_sum = 0;
    for (int64_t i = 0; i < p.seqlen_q; ++i)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const double x = in.dout[static_cast<size_t>((i * p.heads_q + h) * p.head_dim + d)];
        sum += x;
        abs_sum += std::abs(x);
      }
    EXPECT_NEAR(r.dv.value[static_cast<size_t>(d)], sum, 1e-6);
    EXPECT_NEAR(r.dv.abs[static_cast<size_t>(d)], abs_sum, 1e-6);
    EXPECT_NEAR(r.dv.floor[static_cast<size_t>(d)], abs_sum, 1e-12);
    for (int64_t i = 0; i < p.q_elems() / p.head_dim; ++i)
      EXPECT_NEAR(r.dq.floor[static_cast<size_t>(i * p.head_dim + d)],
                  p.softmax_scale() * std::abs(in.k[static_cast<size_t>(d)]), 1e-12);
  }
}
