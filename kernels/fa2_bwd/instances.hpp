// The compiled slices of fa2_bwd, one per (dtype, head_dim) file: each returns the launch and kernel-list functions of a tile
// shape it holds, or nulls. Host code (register.cpp) dispatches through these without seeing CUDA code.
#pragma once

#include "kernels/fa2_bwd/traits.hpp"

namespace fb::fa2_bwd {

Instance pick_bf16_d64(const Params &c);
Instance pick_bf16_d128(const Params &c);
Instance pick_bf16_d256(const Params &c);
Instance pick_fp16_d64(const Params &c);
Instance pick_fp16_d128(const Params &c);
Instance pick_fp16_d256(const Params &c);

} // namespace fb::fa2_bwd
