// The compiled slices of fa3_bwd, one per (dtype, head_dim) file: each returns the launch and kernel-list functions
// of its kernels (fa3_bwd.cuh, pick_tile). Host code (register.cpp) dispatches through these without seeing CUDA
// code.
#pragma once

#include "kernels/fa3_bwd/traits.hpp"

namespace fb::fa3_bwd {

Instance pick_bf16_d64(const Params &c);
Instance pick_bf16_d128(const Params &c);
Instance pick_fp16_d64(const Params &c);
Instance pick_fp16_d128(const Params &c);

} // namespace fb::fa3_bwd
