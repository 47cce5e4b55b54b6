// One compiled slice of fa2_q_outer (bf16, head_dim 64, split_k): the kernel lives in fa2_q_outer.cuh; the slices are
// separate files only so that they compile in parallel.
#include "kernels/fa2_q_outer/fa2_q_outer.cuh"
#include "kernels/fa2_q_outer/instances.hpp"

namespace fb::fa2 {
LaunchFn pick_bf16_d64_split_k(const Params &c) { return pick_tile<__nv_bfloat16, 64, false>(c); }
} // namespace fb::fa2
