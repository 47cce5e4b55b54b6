// One compiled slice of fa3_bwd (bf16, head_dim 128); the kernels live in fa3_bwd.cuh. Built for sm_90a only
// (kernels/fa3_bwd/CMakeLists.txt).
#include "kernels/fa3_bwd/fa3_bwd.cuh"
#include "kernels/fa3_bwd/instances.hpp"

namespace fb::fa3_bwd {
Instance pick_bf16_d128(const Params &c) { return pick_tile<__nv_bfloat16, 128>(c); }
} // namespace fb::fa3_bwd
