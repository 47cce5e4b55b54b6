// One compiled slice of fa2_q_outer (fp16, head_dim 64, split_q): the kernel lives in fa2_q_outer.cuh; the slices are
// separate files only so that they compile in parallel.
#include "kernels/fa2_q_outer/fa2_q_outer.cuh"
#include "kernels/fa2_q_outer/instances.hpp"

namespace fb::fa2 {
LaunchFn pick_fp16_d64_split_q(const Params &c) { return pick_tile<__half, 64, true>(c); }
} // namespace fb::fa2
