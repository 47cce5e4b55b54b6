#include "flashbench/verify.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <sstream>
#include <thread>
#include <vector>

namespace fb {

namespace {

// A problem's outputs are compared in chunks of consecutive rows, on up to 16 host threads: a 33.5 M-element O
// (16384 tokens x 2048) takes ~0.25 s on one core, which every verified point, and every tuner measurement, pays.
// The chunks depend on the problem only, and partial sums are merged in chunk order, so a result does not depend
// on the machine's thread count; the mismatches reported are the first ones in the serial walk's order.
constexpr int kMaxReported = 3;
constexpr int64_t kMaxChunks = 64;
constexpr int64_t kSerialElements = int64_t(1)
                                    << 20; // below this, threads cost more than they save

struct Partial {
  double max_abs = 0, worst = 0, diff_sq = 0, ref_sq = 0;
  int64_t nonfinite = 0, mismatches = 0;
  std::vector<std::string> reports; // the chunk's first kMaxReported mismatches
};

// Runs body(c, partial) for c in [0, chunks) and returns the partials in chunk order.
template <class Body> std::vector<Partial> run_chunks(int64_t chunks, int64_t elements, Body body) {
  std::vector<Partial> parts(static_cast<size_t>(chunks));
  const int64_t workers =
      elements < kSerialElements
          ? 1
          : std::min<int64_t>({chunks, 16, std::max(1u, std::thread::hardware_concurrency())});
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t c; (c = next.fetch_add(1)) < chunks;)
      body(c, parts[static_cast<size_t>(c)]);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < workers; ++t)
    pool.emplace_back(work);
  work();
  for (auto &t : pool)
    t.join();
  return parts;
}

// [begin, end) of chunk c when `units` rows are split into `chunks` consecutive ranges.
std::pair<int64_t, int64_t> chunk_range(int64_t units, int64_t chunks, int64_t c) {
  return {units * c / chunks, units * (c + 1) / chunks};
}

// One element's comparison into a partial; `where` names the element for a report.
template <class Where>
void compare(Partial &q, double got, double want, double bound, Where where) {
  const double err = std::abs(got - want);
  bool bad = false;
  if (!std::isfinite(got)) {
    ++q.nonfinite;
    bad = true;
  } else {
    q.max_abs = std::max(q.max_abs, err);
    q.worst = std::max(q.worst, err / bound);
    q.diff_sq += err * err;
    bad = err > bound;
  }
  q.ref_sq += want * want;
  if (bad && q.mismatches++ < kMaxReported)
    q.reports.push_back(where());
}

// Partials merged in order; `reported` counts the reports already in `detail`.
Partial merge(const std::vector<Partial> &parts, int &reported, std::ostringstream &detail) {
  Partial m;
  for (const Partial &q : parts) {
    m.max_abs = std::max(m.max_abs, q.max_abs);
    m.worst = std::max(m.worst, q.worst);
    m.diff_sq += q.diff_sq;
    m.ref_sq += q.ref_sq;
    m.nonfinite += q.nonfinite;
    m.mismatches += q.mismatches;
    for (const std::string &line : q.reports)
      if (reported++ < kMaxReported)
        detail << (reported > 1 ? "; " : "") << line;
  }
  return m;
}

} // namespace

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
  int reported = 0;
  std::ostringstream detail;
  const Strides s = p.q_strides();
  // Chunks of consecutive (batch, head) pairs; each walks its rows and columns as the serial loop did.
  const int64_t units = p.batch * p.heads_q;
  const int64_t chunks = std::min(units, kMaxChunks);
  const auto parts = run_chunks(chunks, p.q_elems(), [&](int64_t c, Partial &q) {
    const auto [u0, u1] = chunk_range(units, chunks, c);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / p.heads_q, h = u % p.heads_q;
      for (int64_t i = 0; i < p.seqlen_q; ++i)
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const int64_t idx = b * s.batch + i * s.seq + h * s.head + d;
          const double got = out[idx];
          const double want = static_cast<double>(ref_o[idx]);
          double bound = tol.atol + tol.rtol * std::abs(want);
          if (ref_o_abs && tol.p_round > 0)
            bound += tol.p_round * static_cast<double>(ref_o_abs[idx]);
          compare(q, got, want, bound, [&] {
            std::ostringstream os;
            os << "o[b=" << b << ",s=" << i << ",h=" << h << ",d=" << d << "]: got " << got
               << " want " << want;
            return os.str();
          });
        }
    }
  });
  const Partial m = merge(parts, reported, detail);
  r.max_abs_error = m.max_abs;
  r.worst_ratio = m.worst;
  r.nonfinite = m.nonfinite;
  r.mismatches = m.mismatches;
  const double diff_sq = m.diff_sq, ref_sq = m.ref_sq;
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

// One gradient against its reference; appends its first mismatches to detail while `reported` < kMaxReported.
TensorError check_gradient(const char *name, const float *got, const GradientReference &ref,
                           int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                           const GradTolerance &tol, int &reported, std::ostringstream &detail) {
  // bshd, dense: chunks of consecutive (b, s) rows, each walking (h, d) in memory order.
  const int64_t units = batch * seqlen, row = heads * head_dim;
  const int64_t chunks = std::min(units, kMaxChunks);
  const auto parts = run_chunks(chunks, units * row, [&](int64_t c, Partial &q) {
    const auto [u0, u1] = chunk_range(units, chunks, c);
    for (int64_t idx = u0 * row; idx < u1 * row; ++idx) {
      const size_t i = static_cast<size_t>(idx);
      const double g = got[idx], want = ref.value[i];
      const double bound =
          tol.atol + tol.rtol * std::abs(want) + tol.term * ref.abs[i] + tol.floor * ref.floor[i];
      compare(q, g, want, bound, [&] {
        const int64_t d = idx % head_dim, h = idx / head_dim % heads, bs = idx / row;
        std::ostringstream os;
        os << name << "[b=" << bs / seqlen << ",s=" << bs % seqlen << ",h=" << h << ",d=" << d
           << "]: got " << g << " want " << want << " (bound " << bound << ")";
        return os.str();
      });
    }
  });
  const Partial m = merge(parts, reported, detail);
  TensorError e;
  e.name = name;
  e.max_abs_error = m.nonfinite ? INFINITY : m.max_abs;
  e.worst_ratio = m.worst;
  e.nonfinite = m.nonfinite;
  e.mismatches = m.mismatches;
  e.rel_l2_error = m.ref_sq > 0 ? std::sqrt(m.diff_sq / m.ref_sq) : std::sqrt(m.diff_sq);
  return e;
}

} // namespace

VerifyResult verify_backward(const AttentionProblem &p, const float *dq, const float *dk,
                             const float *dv, const BackwardReference &ref,
                             const GradTolerance &tol) {
  VerifyResult r;
  int reported = 0;
  std::ostringstream detail;
  r.tensors.push_back(check_gradient("dq", dq, ref.dq, p.batch, p.seqlen_q, p.heads_q, p.head_dim,
                                     tol, reported, detail));
  r.tensors.push_back(check_gradient("dk", dk, ref.dk, p.batch, p.seqlen_kv, p.heads_kv, p.head_dim,
                                     tol, reported, detail));
  r.tensors.push_back(check_gradient("dv", dv, ref.dv, p.batch, p.seqlen_kv, p.heads_kv, p.head_dim,
                                     tol, reported, detail));
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
