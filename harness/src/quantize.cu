// quantize_e4m3 (quantize.hpp): e4m3 codes and per-block descales of one [batch, seqlen, heads, head_dim] tensor,
// optionally after a random-sign Hadamard rotation of each row (incoherent processing).
//
// The fused kernel (block <= 128 tokens, head_dim 64/128/256) reads the input once and writes the codes once: a
// CTA owns one (block, head, batch entry), each warp whole rows, each lane head_dim / 32 contiguous values of a row
// (one vector load). The rotation runs in registers: the Walsh-Hadamard butterflies of strides below the lane's
// width inside the lane, the others across lanes by __shfl_xor_sync; the block's amax is a warp-shuffle max, then a
// shared-memory max over the warps; the codes come from the values still in registers. The other shapes (V's
// per-head descale, odd head dims) take two passes over the input (amax, then codes); they are never rotated.
#include "flashbench/check.hpp"
#include "flashbench/quantize.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fb {

namespace {

constexpr int kFusedMaxRows = 128; // a fused CTA's rows: blocks up to this many tokens
constexpr int kChunkRows = 128;    // a two-pass CTA's rows

template <class T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }

// E contiguous elements as one aligned object, so that a load or store of it is one vector access.
template <class T, int E> struct alignas(sizeof(T) * E) Vec { T v[E]; };

__device__ __forceinline__ uint8_t to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// The fused kernel's CTA shape: 8 warps (16 rows each) for d <= 128, 16 warps (8 rows each) for d = 256, so that
// a lane holds at most 64 values.
template <int D> constexpr int fused_warps() { return D == 256 ? 16 : 8; }

template <class T, int D, bool kRotate>
__global__ void __launch_bounds__(fused_warps<D>() * 32, D == 256 ? 1 : 2)
    quantize_fused_kernel(const T *__restrict__ src, Strides ss, uint8_t *__restrict__ dst,
                          Strides cs, float *__restrict__ descale, int64_t seqlen, int64_t heads,
                          int64_t block, uint64_t seed) {
  constexpr int E = D / 32, kWarps = fused_warps<D>(), kRows = kFusedMaxRows / kWarps;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, t0 = int64_t(blockIdx.x) * block;
  const int rows = static_cast<int>(seqlen - t0 < block ? seqlen - t0 : block);
  const T *in = src + b * ss.batch + h * ss.head + lane * E;
  uint8_t *out = dst + b * cs.batch + h * cs.head + lane * E;

  float x[kRows][E];
  // All loads first: kRows independent vector loads in flight per lane.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = warp + r * kWarps;
    if (row < rows) {
      const Vec<T, E> v = *reinterpret_cast<const Vec<T, E> *>(in + (t0 + row) * ss.seq);
#pragma unroll
      for (int e = 0; e < E; ++e)
        x[r][e] = to_f32(v.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e)
        x[r][e] = 0.f;
    }
  }

  float sign[E]; // this lane's s_i, drawn once for all its rows
#pragma unroll
  for (int e = 0; e < E; ++e)
    sign[e] = kRotate ? hadamard_sign(seed, lane * E + e) : 1.f;

  float amax = 0.f;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if constexpr (kRotate) {
      if (warp + r * kWarps < rows) { // warp-uniform: every lane takes part in the shuffles
        // The same operations, in the same order, as hadamard_rotate_row (quantize_ref.cpp).
#pragma unroll
        for (int e = 0; e < E; ++e)
          x[r][e] *= sign[e];
#pragma unroll
        for (int s = 1; s < E; s <<= 1)
#pragma unroll
          for (int e = 0; e < E; ++e)
            if (!(e & s)) {
              const float a = x[r][e], c = x[r][e + s];
              x[r][e] = a + c;
              x[r][e + s] = a - c;
            }
#pragma unroll
        for (int m = 1; m < 32; m <<= 1) // element stride m * E: the partner is lane ^ m
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const float p = __shfl_xor_sync(0xffffffffu, x[r][e], m);
            x[r][e] = (lane & m) ? p - x[r][e] : x[r][e] + p;
          }
#pragma unroll
        for (int e = 0; e < E; ++e)
          x[r][e] *= hadamard_scale(D);
      }
    }
#pragma unroll
    for (int e = 0; e < E; ++e)
      amax = fmaxf(amax, fabsf(x[r][e]));
  }

  __shared__ float warp_amax[kWarps];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (lane == 0)
    warp_amax[warp] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w)
    amax = fmaxf(amax, warp_amax[w]);
  const float ds = e4m3_descale(amax), inv = e4m3_code_scale(ds);
  if (threadIdx.x == 0)
    descale[(b * heads + h) * gridDim.x + blockIdx.x] = ds;

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = warp + r * kWarps;
    if (row < rows) {
      Vec<uint8_t, E> c;
#pragma unroll
      for (int e = 0; e < E; ++e)
        c.v[e] = to_e4m3(x[r][e] * inv);
      *reinterpret_cast<Vec<uint8_t, E> *>(out + (t0 + row) * cs.seq) = c;
    }
  }
}

// The two-pass path: CTA (chunk, head, batch entry) covers up to kChunkRows tokens of one descale block.
struct Chunk {
  int64_t blk, t0, rows;
  __device__ Chunk(int64_t seqlen, int64_t block, int64_t chunks_per_block) {
    blk = blockIdx.x / chunks_per_block;
    t0 = blk * block + (blockIdx.x % chunks_per_block) * kChunkRows;
    const int64_t end = seqlen < (blk + 1) * block ? seqlen : (blk + 1) * block;
    rows = t0 >= end ? 0 : end - t0 < kChunkRows ? end - t0 : kChunkRows;
  }
};

constexpr int kTwoPassThreads = 256;

template <class T>
__global__ void __launch_bounds__(kTwoPassThreads)
    amax_kernel(const T *__restrict__ src, Strides ss, float *amax_out, int64_t seqlen,
                int64_t heads, int64_t head_dim, int64_t block, int64_t chunks_per_block,
                int64_t blocks) {
  const Chunk c(seqlen, block, chunks_per_block);
  const int64_t b = blockIdx.z, h = blockIdx.y;
  float amax = 0.f;
  for (int64_t i = threadIdx.x; i < c.rows * head_dim; i += kTwoPassThreads)
    amax = fmaxf(
        amax,
        fabsf(to_f32(
            src[b * ss.batch + (c.t0 + i / head_dim) * ss.seq + h * ss.head + i % head_dim])));
  __shared__ float red[kTwoPassThreads / 32];
  for (int o = 16; o > 0; o >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0)
    red[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kTwoPassThreads / 32; ++w)
      amax = fmaxf(amax, red[w]);
    // Non-negative floats order as their bit patterns: an unsigned max is the float max.
    atomicMax(reinterpret_cast<unsigned *>(amax_out) + (b * heads + h) * blocks + c.blk,
              __float_as_uint(amax));
  }
}

template <class T>
__global__ void __launch_bounds__(kTwoPassThreads)
    codes_kernel(const T *__restrict__ src, Strides ss, uint8_t *__restrict__ dst, Strides cs,
                 const float *amax_in, int64_t seqlen, int64_t heads, int64_t head_dim,
                 int64_t block, int64_t chunks_per_block, int64_t blocks) {
  const Chunk c(seqlen, block, chunks_per_block);
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const float inv = e4m3_code_scale(e4m3_descale(amax_in[(b * heads + h) * blocks + c.blk]));
  for (int64_t i = threadIdx.x; i < c.rows * head_dim; i += kTwoPassThreads) {
    const int64_t t = c.t0 + i / head_dim, d = i % head_dim;
    dst[b * cs.batch + t * cs.seq + h * cs.head + d] =
        to_e4m3(to_f32(src[b * ss.batch + t * ss.seq + h * ss.head + d]) * inv);
  }
}

__global__ void descale_from_amax_kernel(float *x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = e4m3_descale(x[i]);
}

template <class T>
void launch(const void *src_v, const Strides &ss, void *codes_v, const Strides &cs, float *descale,
            const QuantizeShape &q, const Rotation &rot, bool fused, cudaStream_t stream) {
  const T *src = static_cast<const T *>(src_v);
  uint8_t *codes = static_cast<uint8_t *>(codes_v);
  const unsigned heads = static_cast<unsigned>(q.heads), batch = static_cast<unsigned>(q.batch);
  if (fused) {
    const dim3 grid(static_cast<unsigned>(q.blocks()), heads, batch);
    auto go = [&](auto kernel, int warps) {
      kernel<<<grid, warps * 32, 0, stream>>>(src, ss, codes, cs, descale, q.seqlen, q.heads,
                                              q.block, rot.seed);
    };
    switch (q.head_dim * 2 + (rot.on ? 1 : 0)) {
    case 128:
      go(quantize_fused_kernel<T, 64, false>, fused_warps<64>());
      break;
    case 129:
      go(quantize_fused_kernel<T, 64, true>, fused_warps<64>());
      break;
    case 256:
      go(quantize_fused_kernel<T, 128, false>, fused_warps<128>());
      break;
    case 257:
      go(quantize_fused_kernel<T, 128, true>, fused_warps<128>());
      break;
    case 512:
      go(quantize_fused_kernel<T, 256, false>, fused_warps<256>());
      break;
    default:
      go(quantize_fused_kernel<T, 256, true>, fused_warps<256>());
      break;
    }
    FB_CHECK_LAUNCH();
    return;
  }
  const int64_t cpb = (q.block + kChunkRows - 1) / kChunkRows;
  const dim3 grid(static_cast<unsigned>(q.blocks() * cpb), heads, batch);
  FB_CUDA_CHECK(
      cudaMemsetAsync(descale, 0, static_cast<size_t>(q.descale_elems()) * sizeof(float), stream));
  amax_kernel<T><<<grid, kTwoPassThreads, 0, stream>>>(src, ss, descale, q.seqlen, q.heads,
                                                       q.head_dim, q.block, cpb, q.blocks());
  FB_CHECK_LAUNCH();
  codes_kernel<T><<<grid, kTwoPassThreads, 0, stream>>>(
      src, ss, codes, cs, descale, q.seqlen, q.heads, q.head_dim, q.block, cpb, q.blocks());
  FB_CHECK_LAUNCH();
  const int64_t n = q.descale_elems();
  const int64_t ctas = (n + 255) / 256;
  descale_from_amax_kernel<<<static_cast<unsigned>(ctas < 4096 ? ctas : 4096), 256, 0, stream>>>(
      descale, n);
  FB_CHECK_LAUNCH();
}

bool aligned(const void *p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

} // namespace

void quantize_e4m3(const void *src, DType src_dtype, const Strides &ss, void *codes,
                   const Strides &cs, float *descale, const QuantizeShape &q, const Rotation &rot,
                   cudaStream_t stream) {
  if (src_dtype == DType::e4m3)
    throw std::invalid_argument("quantize_e4m3: the source must be fp32, bf16 or fp16");
  if (q.batch < 1 || q.seqlen < 1 || q.heads < 1 || q.head_dim < 1 || q.block < 1)
    throw std::invalid_argument("quantize_e4m3: every extent and the block must be at least 1");
  if (q.blocks() > 0x7fffffff ||
      q.blocks() * ((q.block + kChunkRows - 1) / kChunkRows) > 0x7fffffff || q.heads > 65535 ||
      q.batch > 65535)
    throw std::invalid_argument(
        "quantize_e4m3: too many blocks, heads or batch entries for a grid");
  // The fused kernel's vector accesses: each lane's head_dim / 32 elements aligned as one object.
  const int64_t e = q.head_dim / 32, eb = e * dtype_bytes(src_dtype);
  auto strides_ok = [&](const Strides &s) {
    return s.batch % e == 0 && s.seq % e == 0 && s.head % e == 0;
  };
  const bool fused = hadamard_supported(q.head_dim) && q.block <= kFusedMaxRows &&
                     aligned(src, eb) && aligned(codes, e) && strides_ok(ss) && strides_ok(cs);
  if (rot.on && !fused)
    throw std::invalid_argument(
        "quantize_e4m3: the rotation needs head_dim 64, 128 or 256, a block of at most " +
        std::to_string(kFusedMaxRows) +
        " tokens and rows aligned to head_dim / 32 elements (got d" + std::to_string(q.head_dim) +
        ", block " + std::to_string(q.block) + ")");
  switch (src_dtype) {
  case DType::f32:
    launch<float>(src, ss, codes, cs, descale, q, rot, fused, stream);
    break;
  case DType::bf16:
    launch<__nv_bfloat16>(src, ss, codes, cs, descale, q, rot, fused, stream);
    break;
  case DType::f16:
    launch<__half>(src, ss, codes, cs, descale, q, rot, fused, stream);
    break;
  case DType::e4m3:
    break;
  }
}

} // namespace fb
