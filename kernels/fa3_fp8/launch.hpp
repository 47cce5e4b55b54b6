// fa3_fp8's host entry points into its sm_90a object library (fa3_fp8.cu).
#pragma once

#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"
#include "kernels/fa3_fp8/traits.hpp"

#include <cuda_runtime_api.h>

namespace fb::fa3fp8 {

// Queues the forward pass (e4m3 Q, K, V with their descales; O bf16). Throws std::invalid_argument
// on a problem supports() turns down, CudaError on a failed launch.
void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream);
// The __global__ function of config c at head_dim (64, 128 or 256), for the occupancy report.
const void *kernel_ptr(const Params &c, int head_dim);

} // namespace fb::fa3fp8
