// One compiled slice of fa3_pipelined (bf16, head_dim 256); the kernel lives in fa3_pipelined.cuh.
// Built for sm_90a only (kernels/fa3_pipelined/CMakeLists.txt).
#include "kernels/fa3_pipelined/fa3_pipelined.cuh"
#include "kernels/fa3_pipelined/instances.hpp"

namespace fb::fa3 {
LaunchFn pick_launch_bf16_d256(const Params &c) { return pick_launch<__nv_bfloat16, 256>(c); }
KernelFn pick_kernel_bf16_d256(const Params &c) { return pick_kernel<__nv_bfloat16, 256>(c); }
} // namespace fb::fa3
