// Flash-decoding instantiations for fp16 (every head_dim and tile width); the kernels are in
// flash_decoding.cuh. One file per dtype so that the two compile in parallel.
#include "kernels/flash_decoding/flash_decoding.cuh"

namespace fb::fdec {

void launch_fp16(const AttentionProblem &p, const Params &c, const SplitPlan &plan,
                 const LaunchArgs &args, cudaStream_t stream) {
  launch_typed<__half>(p, c, plan, args, stream);
}

std::vector<KernelDesc> kernel_descs_fp16(const AttentionProblem &p, const Params &c,
                                          const SplitPlan &plan) {
  return kernel_descs_typed<__half>(p, c, plan);
}

} // namespace fb::fdec
