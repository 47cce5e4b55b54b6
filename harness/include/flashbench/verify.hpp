// Verification of one output against a reference: element-wise |out - ref| <= atol + rtol * |ref|, every element
// finite (outputs are poisoned with NaN before the run), and LSE within its own tolerance.
#pragma once

#include "flashbench/problem.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace fb {

struct Tolerance {
  double atol = 0, rtol = 0; // for O
  double lse_atol = 0;       // for LSE (natural log units)
  double lse_rtol = 0;       // ... plus this times |LSE|
  double rel_l2 = 0;         // ||out - ref|| / ||ref|| over O must not pass it; 0: not checked
  // e4m3: P is rounded to e4m3 (relative error <= 2^-4 in its normal range) before P V, so an element of O may be
  // off by up to p_round * sum_k p_k |v_k| / l: the bound adds p_round times the reference of |V| (ref_o_abs).
  double p_round = 0;
};
// Per dtype; stated in the README. fp16/bf16 inputs are rounded before the reference sees them, so these bound
// only the kernel's arithmetic (low-precision P and O, fp32 accumulation).
Tolerance tolerance_for(DType t);

struct VerifyResult {
  bool pass = false;
  double max_abs_error = 0; // max |out - ref| over O
  double worst_ratio = 0;   // max |out - ref| / (atol + rtol*|ref|); pass needs <= 1
  double rel_l2_error = 0;  // ||out - ref|| / ||ref||
  double lse_max_error = 0;
  int64_t nonfinite = 0;  // O elements that are NaN or inf (unwritten or overflowed)
  int64_t mismatches = 0; // O elements over tolerance, plus LSE mismatches
  std::string reference;  // "cpu_f64" or "gpu_f32"
  std::string detail;     // the first few mismatches, "o[b=0,s=3,h=1,d=7]: got 0.1 want 0.3"

  std::string summary() const; // one line
};

// out and lse_out are host copies of the kernel's outputs; ref_o/ref_lse the reference (any float type via
// template instantiations for double and float); ref_o_abs (where tol.p_round > 0) the reference's O of the same
// inputs with V replaced by |V|.
template <class RefT>
VerifyResult verify(const AttentionProblem &p, const float *out, const float *lse_out,
                    const RefT *ref_o, const RefT *ref_lse, const Tolerance &tol,
                    const RefT *ref_o_abs = nullptr);

void to_json(nlohmann::json &j, const VerifyResult &v);

} // namespace fb
