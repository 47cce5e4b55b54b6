// cuTensorMapEncodeTiled through the runtime's driver entry point: see tensor_map.hpp.
#include "kernels/common/hopper/tensor_map.hpp"

#include "flashbench/check.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>

namespace fb::hopper {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                   cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !f)
      throw CudaError(
          "TMA tensor maps: the driver has no cuTensorMapEncodeTiled (needs a CUDA 12 driver)",
          cudaErrorNotSupported);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

} // namespace

CUtensorMap make_map(const void *base, CUtensorMapDataType type, int elem_bytes, int64_t head_dim,
                     int64_t seqlen, int64_t heads, int64_t batch, const Strides &strides,
                     int box_cols, int box_rows, CUtensorMapSwizzle swizzle) {
  CUtensorMap map{};
  const cuuint64_t e = cuuint64_t(elem_bytes);
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(seqlen), cuuint64_t(heads),
                              cuuint64_t(batch)};
  // Byte strides of dims 1..3 (dim 0 is contiguous); all multiples of 16 since a head_dim row is a
  // multiple of 64 bytes.
  const cuuint64_t byte_strides[3] = {cuuint64_t(strides.seq) * e, cuuint64_t(strides.head) * e,
                                      cuuint64_t(strides.batch) * e};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r =
      encode_fn()(&map, type, 4, const_cast<void *>(base), dims, byte_strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw CudaError("cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)) +
                        " (dims " + std::to_string(head_dim) + "x" + std::to_string(seqlen) + "x" +
                        std::to_string(heads) + "x" + std::to_string(batch) + ", box " +
                        std::to_string(box_cols) + "x" + std::to_string(box_rows) + ")",
                    cudaErrorInvalidValue);
  return map;
}

CUtensorMap make_tile_map(const void *base, DType dtype, int64_t head_dim, int64_t seqlen,
                          int64_t heads, int64_t batch, const Strides &strides, int box_rows) {
  return make_map(base,
                  dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                  2, head_dim, seqlen, heads, batch, strides, 64, box_rows);
}

} // namespace fb::hopper
