// One compiled slice of fa2_bwd (bf16, head_dim 128): the kernels live in fa2_bwd.cuh; the slices are separate
// files only so that they compile in parallel.
#include "kernels/fa2_bwd/fa2_bwd.cuh"
#include "kernels/fa2_bwd/instances.hpp"

namespace fb::fa2_bwd {
Instance pick_bf16_d128(const Params &c) { return pick_tile<__nv_bfloat16, 128>(c); }
} // namespace fb::fa2_bwd
