// References that every point is verified against, forward and backward. Both read the same inputs as the kernel
// (already rounded to the problem's dtype), so the only differences left are the kernel's own arithmetic.
#pragma once

#include "flashbench/problem.hpp"

#include <cuda_runtime_api.h>

#include <vector>

namespace fb {

// O in the problem's layout, LSE as [batch, heads_q, seqlen_q] (natural log; -inf for rows that see no key).
struct ReferenceOutput {
  std::vector<double> o;
  std::vector<double> lse;
};

// float64 on the CPU, two passes per row (max, then exp-sum and weighted sum). Exact up to float64 rounding.
ReferenceOutput cpu_reference(const AttentionProblem &p, const float *q, const float *k,
                              const float *v);

// Work under which the CPU reference is used; above it the GPU one. The work is flops(p) / 4: query-key pairs
// times head_dim times heads for the forward, kBwdFlopsFactor times that for the backward.
constexpr double kCpuReferenceMaxWork = 1.5e9;
bool use_cpu_reference(const AttentionProblem &p);

// ---- The backward (p.pass == bwd; dense bshd, validate()).
//
// From Q, K, V, O, dO (as the kernel reads them, already rounded to the problem's dtype) and the forward's LSE
// (fp32, as the kernel reads it), with D = rowsum(dO * O) and under the forward's mask (bottom-right causal):
//   P = exp(scale * Q K^T - LSE),  dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dQ = scale * dS K,
//   dK = scale * dS^T Q.
// Under GQA dK and dV sum over the query heads of their group. A row that sees no key (LSE = -inf) adds nothing:
// its dQ is 0, and it adds 0 to every dK and dV.
//
// Each gradient comes with two sums per element, the scales of a low-precision kernel's rounding error
// (GradTolerance in verify.hpp):
//   abs:   the sum of the absolute values of the terms the element adds up (dV[j]: sum_i P_ij |dO_i|; dQ[i]:
//          scale * sum_j |dS_ij| |K_j|; dK[j]: scale * sum_i |dS_ij| |Q_i|): a kernel that rounds P or dS to the
//          dtype before the GEMM is off by at most a few units of its rounding times this;
//   floor: the same with the rounded factor replaced by 1 over the unmasked terms (dV[j]: sum_i |dO_i|, dQ[i]:
//          scale * sum_j |K_j|, dK[j]: scale * sum_i |Q_i|): where P or dS falls below the dtype's normal range
//          (fp16's subnormals) the rounding error is absolute, at most half the subnormal spacing a term.
struct GradientReference {
  std::vector<double> value, abs, floor;
};
struct BackwardReference {
  GradientReference dq; // like Q: [batch, seqlen_q, heads_q, head_dim]
  GradientReference dk; // like K: [batch, seqlen_kv, heads_kv, head_dim]
  GradientReference dv; // like V
};

// float64 on the CPU. lse is fp32 [batch, heads_q, seqlen_q].
BackwardReference cpu_reference_backward(const AttentionProblem &p, const float *q, const float *k,
                                         const float *v, const float *o, const float *dout,
                                         const float *lse);

// fp32 on the GPU through cuBLAS (TF32 off), one (batch, KV head) slice and a bounded block of query rows at a
// time; D in float64. Inputs are device pointers in the problem's dtype (lse fp32); the outputs are device fp32
// arrays of q_elems() (dq_*) and kv_elems() (dk_*, dv_*) floats in bshd. Synchronises the stream before it returns.
struct BackwardReferenceDevice {
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float *dq_abs = nullptr, *dk_abs = nullptr, *dv_abs = nullptr;
  float *dq_floor = nullptr, *dk_floor = nullptr, *dv_floor = nullptr;
};
void gpu_reference_backward(const AttentionProblem &p, const void *q, const void *k, const void *v,
                            const void *o, const void *dout, const float *lse,
                            const BackwardReferenceDevice &out, cudaStream_t stream);

// fp32 on the GPU: S = Q·Kᵀ in fp32 through cuBLAS (TF32 off), softmax in float64, O = P·V in fp32, one
// (batch, head) slice and a bounded block of rows at a time. o_ref has q_elems() floats in the problem's layout;
// lse_ref lse_elems(). Synchronises the stream before it returns.
void gpu_reference(const AttentionProblem &p, const void *q, const void *k, const void *v,
                   float *o_ref, float *lse_ref, cudaStream_t stream);

} // namespace fb
