// The compiled slices of fa3_pipelined, one per (dtype, head_dim) file: each returns the launch
// function (or the
// __global__ function) of the instantiation a config needs, or nullptr. Host code dispatches
// through these.
#pragma once

#include "kernels/fa3_pipelined/traits.hpp"

namespace fb::fa3 {

#define FB_FA3_SLICE(T, D)                                                                         \
  LaunchFn pick_launch_##T##_d##D(const Params &c);                                                \
  KernelFn pick_kernel_##T##_d##D(const Params &c);
FB_FA3_SLICE(bf16, 64)
FB_FA3_SLICE(bf16, 128)
FB_FA3_SLICE(bf16, 256)
FB_FA3_SLICE(fp16, 64)
FB_FA3_SLICE(fp16, 128)
FB_FA3_SLICE(fp16, 256)
#undef FB_FA3_SLICE

} // namespace fb::fa3
