// Verification of one output against a reference: element-wise |out - ref| <= atol + rtol * |ref|, every element
// finite (outputs are poisoned with NaN before the run), and LSE within its own tolerance. The backward checks dQ,
// dK and dV the same way, with a bound that scales with each element's terms (GradTolerance).
#pragma once

#include "flashbench/problem.hpp"
#include "flashbench/reference.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

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

// The backward's gradients (dQ, dK, dV) against BackwardReference (reference.hpp). Element-wise, with u the unit
// roundoff of the dtype (bf16 2^-9, fp16 2^-11, fp32 2^-24):
//   |got - ref| <= atol + rtol * |ref| + term * abs + floor * floor_sum
// where abs and floor_sum are the reference's two sums for the element. A kernel rounds P (for dV = P^T dO) and
// dS (for dQ and dK) to the dtype, each term's factor after at most two roundings: error <= 2u * abs; term = 4u
// doubles that for exp2 approximations and the fp32 sums of the kernel (and of the GPU reference). rtol = 2u: the
// gradient's own rounding to the dtype, doubled. floor: fp16's subnormals (P or dS below 2^-14) round to a spacing
// of 2^-24, an absolute error <= 2^-25 a term, doubled; bf16 and fp32 have no such range in play (0). atol =
// 2^-16 covers what the sums leave out: the kernel's fp32 dP - D and S before exp. For fp32 kernels (no rounding
// of P or dS) term = 2^-14 bounds the fp32 accumulation over up to 2^16 terms (sqrt(n) u, times 4).
// Over each whole tensor: ||got - ref|| / ||ref|| <= rel_l2 = 8u (2^-14 for fp32): random rounding errors give
// about u to 2u, while a dropped block of keys or a wrong scale gives percents. Stated in the README. An emulation
// of an FA2 backward's arithmetic on the CPU (tests/harness/test_verify.cpp) uses about 0.55 of its worst element's
// bound (the gradient's own rounding alone may take half) and about 1.2u of the norm bound.
struct GradTolerance {
  double atol = 0, rtol = 0, term = 0, floor = 0, rel_l2 = 0;
};
GradTolerance grad_tolerance_for(DType t);

// One gradient tensor's errors (a backward result has three: dq, dk, dv).
struct TensorError {
  std::string name;
  double max_abs_error = 0, worst_ratio = 0, rel_l2_error = 0;
  int64_t nonfinite = 0, mismatches = 0;
};

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
  // Backward: dq, dk and dv, each on its own; the fields above then hold the worst over them (max_abs_error,
  // worst_ratio, rel_l2_error) and their sums (nonfinite, mismatches), and lse_max_error is 0 (LSE is an input).
  std::vector<TensorError> tensors;

  std::string summary() const; // one line
};

// out and lse_out are host copies of the kernel's outputs; ref_o/ref_lse the reference (any float type via
// template instantiations for double and float); ref_o_abs (where tol.p_round > 0) the reference's O of the same
// inputs with V replaced by |V|.
template <class RefT>
VerifyResult verify(const AttentionProblem &p, const float *out, const float *lse_out,
                    const RefT *ref_o, const RefT *ref_lse, const Tolerance &tol,
                    const RefT *ref_o_abs = nullptr);

// The backward: dq [batch, seqlen_q, heads_q, head_dim], dk and dv [batch, seqlen_kv, heads_kv, head_dim] (host
// copies of the kernel's outputs) against the reference. Mismatches are named like "dk[b=0,s=3,h=1,d=7]".
VerifyResult verify_backward(const AttentionProblem &p, const float *dq, const float *dk,
                             const float *dv, const BackwardReference &ref,
                             const GradTolerance &tol);

void to_json(nlohmann::json &j, const VerifyResult &v);

} // namespace fb
