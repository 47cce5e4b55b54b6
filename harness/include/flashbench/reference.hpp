// References that every point is verified against. Both read the same inputs as the kernel (already rounded to
// the problem's dtype), so the only differences left are the kernel's own arithmetic.
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

// Work (query-key pairs times head_dim) under which the CPU reference is used; above it the GPU one.
constexpr double kCpuReferenceMaxWork = 1.5e9;
bool use_cpu_reference(const AttentionProblem &p);

// fp32 on the GPU: S = Q·Kᵀ in fp32 through cuBLAS (TF32 off), softmax in float64, O = P·V in fp32, one
// (batch, head) slice and a bounded block of rows at a time. o_ref has q_elems() floats in the problem's layout;
// lse_ref lse_elems(). Synchronises the stream before it returns.
void gpu_reference(const AttentionProblem &p, const void *q, const void *k, const void *v,
                   float *o_ref, float *lse_ref, cudaStream_t stream);

} // namespace fb
