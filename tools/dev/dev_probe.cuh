// Shared by the standalone dev probes (tools/dev/fdec_trace.cu, tools/dev/read_probe.cu): each builds with one
// nvcc line and no CMake target, so it cannot use FB_CUDA_CHECK (that needs libflashbench_core) or the harness's
// flush kernel (harness/src/timer.cu keeps it in an anonymous namespace).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// A CUDA check that prints where and exits.
#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e = (x);                                                                           \
    if (e != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));               \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

// The harness's read flush: 16-byte loads over 2x L2, nothing written, so the L2 is left full of clean lines.
__global__ void read_flush(const uint4 *buf, size_t n, unsigned *sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(buf + i);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0xdeadbeefu)
    *sink = acc;
}
