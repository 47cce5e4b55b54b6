// Device memory and input generation. Inputs come from a counter-based hash of (seed, index) so
// that generation is one parallel pass with no state, every run can draw fresh values, and any one
// run replays from its seed.
#include "flashbench/buffers.hpp"
#include "flashbench/check.hpp"
#include "flashbench/quantize.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
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

__global__ void normal_outliers_kernel(float *dst, int64_t n, uint64_t seed, double fraction,
                                       bool additive, float a, float b) {
  const uint64_t base = splitmix64(seed);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix64(base + static_cast<uint64_t>(i));
    const uint64_t pick = splitmix64(h ^ 0x6f75746c69657273ull), mag = splitmix64(pick);
    float x = normal_from_hash(h);
    if (double(pick >> 11) * 0x1p-53 < fraction) // this element is an outlier
      x = additive ? x + a * normal_from_hash(mag)
                   : (mag >> 63 ? -1.f : 1.f) * (a + (b - a) * float(uint32_t(mag)) * 0x1p-32f);
    dst[i] = x;
  }
}

// e4m3 inputs' values (fill_blocked_normal): one CTA per (token block, head, batch entry). The value of logical
// element (b, h, t, d) comes from the hash of its logical index, whatever the layout.
constexpr int kQuantThreads = 256;

struct QuantBlock {
  int64_t t0, rows, b, h;
  __device__ QuantBlock(int64_t seqlen, int64_t block) {
    b = blockIdx.z;
    h = blockIdx.y;
    t0 = int64_t(blockIdx.x) * block;
    rows = seqlen - t0 < block ? seqlen - t0 : block;
  }
};

__global__ void blocked_normal_kernel(float *dst, int64_t seqlen, int64_t heads, int64_t head_dim,
                                      Strides s, int64_t block, uint64_t seed) {
  const QuantBlock q(seqlen, block);
  const uint64_t base = splitmix64(seed);
  const uint64_t blk = (uint64_t(q.b) * heads + q.h) * gridDim.x + blockIdx.x;
  // Magnitude 2^u, u uniform in [-1, 1): blocks differ by up to 4x.
  const float mag =
      exp2f(float(splitmix64(base ^ (blk * 0x9e3779b97f4a7c15ull + 1)) >> 40) * 0x1p-23f - 1.f);
  for (int64_t i = threadIdx.x; i < q.rows * head_dim; i += kQuantThreads) {
    const int64_t t = q.t0 + i / head_dim, d = i % head_dim;
    const uint64_t logical = ((uint64_t(q.b) * heads + q.h) * seqlen + t) * head_dim + d;
    dst[q.b * s.batch + t * s.seq + q.h * s.head + d] =
        normal_from_hash(splitmix64(base + logical)) * mag;
  }
}

__global__ void dequantize_e4m3_kernel(float *dst, const __nv_fp8_storage_t *src,
                                       const float *descale, int64_t seqlen, int64_t heads,
                                       int64_t head_dim, Strides s, int64_t block) {
  const QuantBlock q(seqlen, block);
  const float ds = descale[(uint64_t(q.b) * heads + q.h) * gridDim.x + blockIdx.x];
  for (int64_t i = threadIdx.x; i < q.rows * head_dim; i += kQuantThreads) {
    const int64_t at = q.b * s.batch + (q.t0 + i / head_dim) * s.seq + q.h * s.head + i % head_dim;
    dst[at] = __half2float(__half(__nv_cvt_fp8_to_halfraw(src[at], __NV_E4M3))) * ds;
  }
}

__global__ void abs_kernel(float *x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = fabsf(x[i]);
}

dim3 quant_grid(int64_t batch, int64_t seqlen, int64_t heads, int64_t block) {
  return dim3(static_cast<unsigned>((seqlen + block - 1) / block), static_cast<unsigned>(heads),
              static_cast<unsigned>(batch));
}

} // namespace

void fill_blocked_normal(float *dst, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                         const Strides &s, int64_t block, uint64_t seed, cudaStream_t stream) {
  blocked_normal_kernel<<<quant_grid(batch, seqlen, heads, block), kQuantThreads, 0, stream>>>(
      dst, seqlen, heads, head_dim, s, block, seed);
  FB_CHECK_LAUNCH();
}

void dequantize_e4m3(float *dst, const void *src, const float *descale, int64_t batch,
                     int64_t seqlen, int64_t heads, int64_t head_dim, const Strides &s,
                     int64_t block, cudaStream_t stream) {
  dequantize_e4m3_kernel<<<quant_grid(batch, seqlen, heads, block), kQuantThreads, 0, stream>>>(
      dst, static_cast<const __nv_fp8_storage_t *>(src), descale, seqlen, heads, head_dim, s,
      block);
  FB_CHECK_LAUNCH();
}

void fill_e4m3_inputs(const AttentionProblem &p, void *const codes[3], float *const descales[3],
                      float *const values[3], const uint64_t seeds[3], cudaStream_t stream) {
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  const struct {
    int64_t seqlen, heads;
    Strides s;
    int64_t block;
  } t[3] = {{p.seqlen_q, p.heads_q, qs, kFp8ScaleBlock},
            {p.seqlen_kv, p.heads_kv, ks, kFp8ScaleBlock},
            {p.seqlen_kv, p.heads_kv, ks, p.seqlen_kv}};
  // Q and K share one rotation (its signs from seeds[0]), so that Q K^T is that of the values drawn.
  const uint64_t sign_seed = seeds[0] ^ 0x68616461ull;
  for (int i = 0; i < 3; ++i) {
    fill_blocked_normal(values[i], p.batch, t[i].seqlen, t[i].heads, p.head_dim, t[i].s, t[i].block,
                        seeds[i], stream);
    const QuantizeShape shape{p.batch, t[i].seqlen, t[i].heads, p.head_dim, t[i].block};
    const Rotation rot{i < 2 && p.quant == Quant::block_hadamard, sign_seed};
    quantize_e4m3(values[i], DType::f32, t[i].s, codes[i], t[i].s, descales[i], shape, rot, stream);
    dequantize_e4m3(values[i], codes[i], descales[i], p.batch, t[i].seqlen, t[i].heads, p.head_dim,
                    t[i].s, t[i].block, stream);
  }
}

void fill_normal_with_outliers(float *dst, int64_t n, uint64_t seed, double fraction, bool additive,
                               float a, float b, cudaStream_t stream) {
  if (n <= 0)
    return;
  const int64_t blocks = (n + kQuantThreads - 1) / kQuantThreads;
  normal_outliers_kernel<<<static_cast<unsigned>(blocks < 65536 * 4 ? blocks : 65536 * 4),
                           kQuantThreads, 0, stream>>>(dst, n, seed, fraction, additive, a, b);
  FB_CHECK_LAUNCH();
}

void abs_inplace(float *x, int64_t n, cudaStream_t stream) {
  if (n <= 0)
    return;
  const int64_t blocks = (n + kQuantThreads - 1) / kQuantThreads;
  abs_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kQuantThreads, 0, stream>>>(
      x, n);
  FB_CHECK_LAUNCH();
}

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
  case DType::e4m3:
    throw std::invalid_argument(
        "fill_normal: e4m3 tensors are quantized per block (fill_e4m3_inputs)");
  }
  FB_CHECK_LAUNCH();
}

namespace {
template <class T> __global__ void convert_from_float_kernel(T *dst, const float *src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = cast_from_float<T>(src[i]);
}
} // namespace

void convert_from_float(void *dst, DType t, const float *src, int64_t n, cudaStream_t stream) {
  if (n <= 0)
    return;
  constexpr int kThreads = 256;
  const int64_t blocks64 = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(blocks64 < 65536 * 4 ? blocks64 : 65536 * 4);
  switch (t) {
  case DType::f32:
    convert_from_float_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<float *>(dst), src, n);
    break;
  case DType::f16:
    convert_from_float_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__half *>(dst), src, n);
    break;
  case DType::bf16:
    convert_from_float_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16 *>(dst),
                                                               src, n);
    break;
  case DType::e4m3:
    throw std::invalid_argument("convert_from_float: e4m3 needs descales (quantize_e4m3)");
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
