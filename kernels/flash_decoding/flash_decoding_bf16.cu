// Flash-decoding instantiations for bf16 (every head_dim and tile width); the kernels are in
// flash_decoding.cuh. One file per dtype so that the two compile in parallel.
#include "kernels/flash_decoding/flash_decoding.cuh"

namespace fb::fdec {

void launch_bf16(const AttentionProblem &p, const Params &c, const SplitPlan &plan,
                 const LaunchArgs &args, cudaStream_t stream) {
  launch_typed<__nv_bfloat16>(p, c, plan, args, stream);
}

std::vector<KernelDesc> kernel_descs(const AttentionProblem &p, const Params &c,
                                     const SplitPlan &plan) {
  // The two dtypes' kernels have the same resources; the descriptor names the one that runs.
  if (p.dtype == DType::f16)
    return kernel_descs_fp16(p, c, plan);
  return kernel_descs_typed<__nv_bfloat16>(p, c, plan);
}

} // namespace fb::fdec
