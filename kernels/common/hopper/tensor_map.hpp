// Host side of the TMA copies: CUtensorMap descriptors for Q, K, V and O, encoded by the driver's
// cuTensorMapEncodeTiled. The function is looked up once through the runtime
// (cudaGetDriverEntryPointByVersion), so nothing links against libcuda directly. Host-only; no
// device work, safe inside launch().
#pragma once

#include "flashbench/problem.hpp"

#include <cuda.h>

#include <cstdint>

namespace fb::hopper {

// A 4-D map over one of Q/K/V: dims (head_dim, seqlen, heads, batch), innermost first, with the
// layout's element strides; the box is 64 head_dim columns (128 bytes, the 128B-swizzle span) by
// `box_rows` sequence rows of one head of one batch entry. Rows past seqlen read as zeros. Throws
// fb::CudaError on failure.
CUtensorMap make_tile_map(const void *base, DType dtype, int64_t head_dim, int64_t seqlen,
                          int64_t heads, int64_t batch, const Strides &strides, int box_rows);
// The same for any element type and swizzle: `box_cols` elements of `elem_bytes` bytes must make one
// swizzle row, 128 bytes under CU_TENSOR_MAP_SWIZZLE_128B (64 for fp16/bf16, 128 for e4m3:
// CU_TENSOR_MAP_DATA_TYPE_UINT8), 64 under CU_TENSOR_MAP_SWIZZLE_64B (64 e4m3: fa3_fp8 at head_dim 64).
CUtensorMap make_map(const void *base, CUtensorMapDataType type, int elem_bytes, int64_t head_dim,
                     int64_t seqlen, int64_t heads, int64_t batch, const Strides &strides,
                     int box_cols, int box_rows,
                     CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B);

} // namespace fb::hopper
