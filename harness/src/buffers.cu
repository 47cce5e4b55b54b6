// Device memory and input generation. Inputs come from a counter-based hash of (seed, index) so
// that generation is one parallel pass with no state, every run can draw fresh values, and any one
// run replays from its seed.
#include "flashbench/buffers.hpp"
#include "flashbench/check.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace fb {

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0)
    FB_CUDA_CHECK(cudaMalloc(&ptr_, bytes)); // cudaMalloc aligns to at least 256 bytes
}

DeviceBuffer::~DeviceBuffer() {
  // No throwing from a destructor; a failed free here means the context is already broken and the
  // error surfaces at the next checked call.
  if (ptr_)
    cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer &&o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&o) noexcept {
  if (this != &o) {
    if (ptr_)
      cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Box–Muller on two 32-bit uniforms taken from one 64-bit hash. u1 is in (0, 1] so log(u1) is
// finite.
__device__ __forceinline__ float normal_from_hash(uint64_t h) {
  const float u1 = (static_cast<float>(static_cast<uint32_t>(h >> 32)) + 1.0f) * 0x1p-32f;
  const float u2 = static_cast<float>(static_cast<uint32_t>(h)) * 0x1p-32f;
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

template <class T> __device__ __forceinline__ T cast_from_float(float x);
template <> __device__ __forceinline__ float cast_from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half cast_from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 cast_from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <class T>
__global__ void fill_normal_kernel(T *dst, int64_t n, uint64_t seed, float stddev) {
  // Mixing the seed once and adding the index keeps element i's value independent of the launch
  // shape.
  const uint64_t base = splitmix64(seed);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] =
        cast_from_float<T>(normal_from_hash(splitmix64(base + static_cast<uint64_t>(i))) * stddev);
}

} // namespace

void fill_normal(void *dst, DType t, int64_t n, uint64_t seed, float stddev, cudaStream_t stream) {
  if (n <= 0)
    return;
  constexpr int kThreads = 256;
  const int64_t blocks64 = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(blocks64 < 65536 * 4 ? blocks64 : 65536 * 4);
  switch (t) {
  case DType::f32:
    fill_normal_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<float *>(dst), n, seed, stddev);
    break;
  case DType::f16:
    fill_normal_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__half *>(dst), n, seed,
                                                        stddev);
    break;
  case DType::bf16:
    fill_normal_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16 *>(dst), n, seed,
                                                        stddev);
    break;
  }
  FB_CHECK_LAUNCH();
}

void poison(void *dst, size_t bytes, cudaStream_t stream) {
  if (bytes == 0)
    return;
  FB_CUDA_CHECK(cudaMemsetAsync(dst, 0xFF, bytes, stream));
}

int64_t count_nonzero_bytes(const void *device_src, size_t bytes) {
  if (bytes == 0)
    return 0;
  std::vector<unsigned char> raw(bytes);
  FB_CUDA_CHECK(cudaMemcpy(raw.data(), device_src, bytes, cudaMemcpyDeviceToHost));
  return std::count_if(raw.begin(), raw.end(), [](unsigned char x) { return x != 0; });
}

std::vector<float> download_as_float(const void *device_src, DType t, int64_t n) {
  if (n <= 0)
    return {};
  std::vector<unsigned char> raw(static_cast<size_t>(n) * static_cast<size_t>(dtype_bytes(t)));
  // cudaMemcpy (legacy default stream) waits for prior work on blocking streams; callers that used
  // a non-blocking stream synchronise it first.
  FB_CUDA_CHECK(cudaMemcpy(raw.data(), device_src, raw.size(), cudaMemcpyDeviceToHost));
  return to_float(raw.data(), t, n);
}

} // namespace fb
