// One compiled slice of fa2_bwd (fp16, head_dim 256): the kernels live in fa2_bwd.cuh; the slices are separate
// files only so that they compile in parallel.
#include "kernels/fa2_bwd/fa2_bwd.cuh"
#include "kernels/fa2_bwd/instances.hpp"

namespace fb::fa2_bwd {
Instance pick_fp16_d256(const Params &c) { return pick_tile<__half, 256>(c); }
} // namespace fb::fa2_bwd
