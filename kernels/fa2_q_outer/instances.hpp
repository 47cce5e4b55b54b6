// The compiled slices of fa2_q_outer, one per (dtype, head_dim, warp layout) file: each returns the launch function
// of a tile shape it holds, or nullptr. Host code (register.cpp) dispatches through these without seeing CUDA code.
#pragma once

#include "kernels/fa2_q_outer/traits.hpp"

namespace fb::fa2 {

#define FB_FA2_SLICE(T, D)                                                                         \
  LaunchFn pick_##T##_d##D##_split_q(const Params &c);                                             \
  LaunchFn pick_##T##_d##D##_split_k(const Params &c);
FB_FA2_SLICE(bf16, 64)
FB_FA2_SLICE(bf16, 128)
FB_FA2_SLICE(bf16, 256)
FB_FA2_SLICE(fp16, 64)
FB_FA2_SLICE(fp16, 128)
FB_FA2_SLICE(fp16, 256)
#undef FB_FA2_SLICE

} // namespace fb::fa2
