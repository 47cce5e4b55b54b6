#include "flashbench/verify.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace fb {

Tolerance tolerance_for(DType t) {
  // O: fp32 kernels only reorder fp32 sums; fp16/bf16 kernels round P and O to 10/7 mantissa bits
  // (2^-11 / 2^-8 relative), so rtol sits a few roundings above that. LSE is accumulated in fp32 everywhere.
  switch (t) {
  case DType::f32:
    return {1e-5, 1e-4, 1e-4};
  case DType::f16:
    return {2e-3, 5e-3, 2e-3};
  case DType::bf16:
    return {1e-2, 2e-2, 2e-3};
  // e4m3: the reference runs on the dequantized inputs, so what is left is the kernel's own rounding, and the
  // largest part of it is P rounded to e4m3 for P V (3 mantissa bits: up to 2^-4 relative; the kernel scales P by
  // 2^8 first, so that P down to 2^-14 is in e4m3's normal range). The other part is the scores: Hopper's fp8 MMA
  // keeps about 14 bits while it accumulates (DeepSeek-V3's report; measured on an H100: LSE off by up to 7e-4
  // relative, 2^-10.5, mostly low, as truncation), which moves P by ~1% more. An element of O is then within
  // p_round = 2^-4 + 0.0125 of the softmax-weighted mean of |V| (the reference over |V|) on top of bf16's bound
  // for O, and LSE within 5e-3 + 2^-10 |LSE|. Over the whole of O the errors average out: the norm bound (rel_l2
  // 5%; 1.3-1.7% measured) is the strict part.
  case DType::e4m3:
    return {1e-2, 2e-2, 5e-3, 0x1p-10, 5e-2, 0.075};
  }
  return {};
}

GradTolerance grad_tolerance_for(DType t) {
  // verify.hpp states the arithmetic behind each number; the README's tolerance section repeats them.
  switch (t) {
  case DType::bf16: {
    const double u = 0x1p-9;
    return {0x1p-16, 2 * u, 4 * u, 0.0, 8 * u};
  }
  case DType::f16: {
    const double u = 0x1p-11;
    return {0x1p-16, 2 * u, 4 * u, 0x1p-24, 8 * u};
  }
  case DType::f32: {
    const double u = 0x1p-24;
    return {0x1p-16, 2 * u, 0x1p-14, 0.0, 0x1p-14};
  }
  case DType::e4m3: // validate() refuses a backward of e4m3
    break;
  }
  return {};
}

std::string VerifyResult::summary() const {
  std::ostringstream os;
  os << (pass ? "pass" : "FAIL") << " vs " << reference << ": max_abs_error=" << max_abs_error
     << " worst/tol=" << worst_ratio << " rel_l2=" << rel_l2_error
     << " lse_max_error=" << lse_max_error;
  for (const TensorError &t : tensors)
    os << " " << t.name << ":{max_abs_error=" << t.max_abs_error << " worst/tol=" << t.worst_ratio
       << " rel_l2=" << t.rel_l2_error << "}";
  if (nonfinite)
    os << " nonfinite=" << nonfinite;
  if (mismatches)
    os << " mismatches=" << mismatches;
  if (!detail.empty())
    os << " [" << detail << "]";
  return os.str();
}

template <class RefT>
VerifyResult verify(const AttentionProblem &p, const float *out, const float *lse_out,
                    const RefT *ref_o, const RefT *ref_lse, const Tolerance &tol,
                    const RefT *ref_o_abs) {
  VerifyResult r;
  constexpr int kMaxReported = 3;
  int reported = 0;
  std::ostringstream detail;
  const Strides s = p.q_strides();
  double diff_sq = 0, ref_sq = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i)
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const int64_t idx = b * s.batch + i * s.seq + h * s.head + d;
          const double got = out[idx];
          const double want = static_cast<double>(ref_o[idx]);
          double bound = tol.atol + tol.rtol * std::abs(want);
          if (ref_o_abs && tol.p_round > 0)
            bound += tol.p_round * static_cast<double>(ref_o_abs[idx]);
          const double err = std::abs(got - want);
          bool bad = false;
          if (!std::isfinite(got)) {
            ++r.nonfinite;
            bad = true;
          } else {
            r.max_abs_error = std::max(r.max_abs_error, err);
            r.worst_ratio = std::max(r.worst_ratio, err / bound);
            diff_sq += err * err;
            bad = err > bound;
          }
          ref_sq += want * want;
          if (bad) {
            ++r.mismatches;
            if (reported++ < kMaxReported)
              detail << (reported > 1 ? "; " : "") << "o[b=" << b << ",s=" << i << ",h=" << h
                     << ",d=" << d << "]: got " << got << " want " << want;
          }
        }
  for (int64_t i = 0; i < p.lse_elems(); ++i) {
    const double got = lse_out[i];
    const double want = static_cast<double>(ref_lse[i]);
    bool bad;
    if (std::isinf(want) && want < 0) {
      bad = !(std::isinf(got) &&
              got < 0); // a row that sees no key must report -inf, not NaN or a number
    } else if (!std::isfinite(got)) {
      bad = true;
    } else {
      const double err = std::abs(got - want);
      r.lse_max_error = std::max(r.lse_max_error, err);
      bad = err > tol.lse_atol + tol.lse_rtol * std::abs(want);
    }
    if (bad) {
      ++r.mismatches;
      if (reported++ < kMaxReported)
        detail << (reported > 1 ? "; " : "") << "lse[" << i << "]: got " << got << " want " << want;
    }
  }
  if (r.nonfinite)
    r.max_abs_error = INFINITY;
  r.rel_l2_error = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
  r.pass = r.mismatches == 0;
  if (tol.rel_l2 > 0 && !(r.rel_l2_error <= tol.rel_l2)) {
    r.pass = false;
    detail << (reported ? "; " : "") << "rel_l2 " << r.rel_l2_error << " over its bound "
           << tol.rel_l2;
  }
  r.detail = detail.str();
  return r;
}

template VerifyResult verify<double>(const AttentionProblem &, const float *, const float *,
                                     const double *, const double *, const Tolerance &,
                                     const double *);
template VerifyResult verify<float>(const AttentionProblem &, const float *, const float *,
                                    const float *, const float *, const Tolerance &, const float *);

namespace {

// One gradient against its reference; appends up to `budget` mismatches to detail.
TensorError check_gradient(const char *name, const float *got, const GradientReference &ref,
                           int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                           const GradTolerance &tol, int &reported, int max_reported,
                           std::ostringstream &detail) {
  TensorError e;
  e.name = name;
  double diff_sq = 0, ref_sq = 0;
  // bshd, dense: the index walks (b, s, h, d) in memory order.
  int64_t idx = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seqlen; ++s)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < head_dim; ++d, ++idx) {
          const size_t i = static_cast<size_t>(idx);
          const double g = got[idx], want = ref.value[i];
          const double bound = tol.atol + tol.rtol * std::abs(want) + tol.term * ref.abs[i] +
                               tol.floor * ref.floor[i];
          const double err = std::abs(g - want);
          bool bad;
          if (!std::isfinite(g)) {
            ++e.nonfinite;
            bad = true;
          } else {
            e.max_abs_error = std::max(e.max_abs_error, err);
            e.worst_ratio = std::max(e.worst_ratio, err / bound);
            diff_sq += err * err;
            bad = err > bound;
          }
          ref_sq += want * want;
          if (bad) {
            ++e.mismatches;
            if (reported++ < max_reported)
              detail << (reported > 1 ? "; " : "") << name << "[b=" << b << ",s=" << s << ",h=" << h
                     << ",d=" << d << "]: got " << g << " want " << want << " (bound " << bound
                     << ")";
          }
        }
  if (e.nonfinite)
    e.max_abs_error = INFINITY;
  e.rel_l2_error = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
  return e;
}

} // namespace

VerifyResult verify_backward(const AttentionProblem &p, const float *dq, const float *dk,
                             const float *dv, const BackwardReference &ref,
                             const GradTolerance &tol) {
  VerifyResult r;
  constexpr int kMaxReported = 3;
  int reported = 0;
  std::ostringstream detail;
  r.tensors.push_back(check_gradient("dq", dq, ref.dq, p.batch, p.seqlen_q, p.heads_q, p.head_dim,
                                     tol, reported, kMaxReported, detail));
  r.tensors.push_back(check_gradient("dk", dk, ref.dk, p.batch, p.seqlen_kv, p.heads_kv, p.head_dim,
                                     tol, reported, kMaxReported, detail));
  r.tensors.push_back(check_gradient("dv", dv, ref.dv, p.batch, p.seqlen_kv, p.heads_kv, p.head_dim,
                                     tol, reported, kMaxReported, detail));
  bool l2_ok = true;
  for (const TensorError &t : r.tensors) {
    r.max_abs_error = std::max(r.max_abs_error, t.max_abs_error);
    r.worst_ratio = std::max(r.worst_ratio, t.worst_ratio);
    r.rel_l2_error = std::max(r.rel_l2_error, t.rel_l2_error);
    r.nonfinite += t.nonfinite;
    r.mismatches += t.mismatches;
    if (tol.rel_l2 > 0 && !(t.rel_l2_error <= tol.rel_l2)) {
      l2_ok = false;
      detail << (reported++ ? "; " : "") << t.name << " rel_l2 " << t.rel_l2_error
             << " over its bound " << tol.rel_l2;
    }
  }
  r.pass = r.mismatches == 0 && l2_ok;
  r.detail = detail.str();
  return r;
}

void to_json(nlohmann::json &j, const VerifyResult &v) {
  auto num = [](double x) {
    return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
  };
  j = nlohmann::json{{"pass", v.pass},
                     {"max_error", num(v.max_abs_error)},
                     {"worst_over_tolerance", num(v.worst_ratio)},
                     {"rel_l2_error", num(v.rel_l2_error)},
                     {"lse_max_error", num(v.lse_max_error)},
                     {"nonfinite", v.nonfinite},
                     {"mismatches", v.mismatches},
                     {"verified_against", v.reference}};
  if (!v.tensors.empty()) {
    nlohmann::json t = nlohmann::json::object();
    for (const TensorError &e : v.tensors)
      t[e.name] = {{"max_error", num(e.max_abs_error)},
                   {"worst_over_tolerance", num(e.worst_ratio)},
                   {"rel_l2_error", num(e.rel_l2_error)},
                   {"nonfinite", e.nonfinite},
                   {"mismatches", e.mismatches}};
    j["tensors"] = t;
  }
}

} // namespace fb
