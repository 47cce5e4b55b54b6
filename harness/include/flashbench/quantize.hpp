// FP8 (e4m3) quantization of one attention input, as fa3_fp8 takes it (problem.hpp, DType::e4m3): e4m3 codes plus
// float32 descales, one per (batch, head, block of `block` tokens), value = code * descale. Optionally each row
// (one token's head_dim values) is first rotated by M = H diag(s) / sqrt(d) (incoherent processing, Quant::
// block_hadamard): y = H (s * x) / sqrt(d), the signs applied before the Walsh-Hadamard transform (signs after it
// would change no magnitude, so no amax). Rotating Q and K by the same M leaves Q K^T unchanged in exact arithmetic.
//
// quantize_e4m3() is the device kernel that the harness and users share; quantize_e4m3_host() is its reference on
// the host, the same float operations in the same order, so the two agree bit for bit (tests/kernels/
// test_quantize_gpu.cpp). The formulas that both use (descale, code scale, signs, 1/sqrt(d)) live here once.
#pragma once

#include "flashbench/problem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

#if defined(__CUDACC__)
#define FB_HOST_DEVICE __host__ __device__
#else
#define FB_HOST_DEVICE
#endif

namespace fb {

constexpr float kE4m3Max = 448.f; // e4m3's largest finite value

// The descale of a block whose largest |value| is amax: amax / 448, so that the largest value gets code 448; 1 for
// an all-zero block (every code is 0 then).
FB_HOST_DEVICE inline float e4m3_descale(float amax) { return amax > 0.f ? amax / kE4m3Max : 1.f; }
// What each value is multiplied by before rounding to e4m3: 1 / descale, computed once per block (a multiply per
// element instead of a division; the code of the largest value may come out one rounding above 448 and
// saturates to it).
FB_HOST_DEVICE inline float e4m3_code_scale(float descale) { return 1.f / descale; }

FB_HOST_DEVICE inline uint64_t quant_splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// s_i of the rotation drawn from `seed`: +1 or -1, the same on host and device. Q and K must share the seed.
FB_HOST_DEVICE inline float hadamard_sign(uint64_t seed, int i) {
  return (quant_splitmix64(quant_splitmix64(seed) + static_cast<uint64_t>(i)) >> 63) ? -1.f : 1.f;
}
// Head dims the rotation supports: a power of two that a warp holds as 2, 4 or 8 values a lane.
FB_HOST_DEVICE inline bool hadamard_supported(int64_t d) { return d == 64 || d == 128 || d == 256; }
// 1/sqrt(d) as one float constant (exact for 64 and 256).
FB_HOST_DEVICE inline float hadamard_scale(int d) {
  return d == 64 ? 0.125f : d == 128 ? 0.0883883476483184405501055f : 0.0625f;
}

// One tensor to quantize: [batch, seqlen, heads, head_dim] with element strides (head_dim contiguous), descales
// per (batch, head, block of `block` tokens), float32 [batch, heads, ceil(seqlen / block)] row-major.
struct QuantizeShape {
  int64_t batch = 1, seqlen = 1, heads = 1, head_dim = 128;
  int64_t block = kFp8ScaleBlock;
  int64_t blocks() const { return (seqlen + block - 1) / block; }
  int64_t descale_elems() const { return batch * heads * blocks(); }
};

// The rotation: off (Quant::block), or on with the signs' seed (Quant::block_hadamard).
struct Rotation {
  bool on = false;
  uint64_t seed = 0;
};

// Quantizes src (fp32, bf16 or fp16; strides src_strides) into codes (e4m3 bytes; strides code_strides) and
// descales, on `stream`, no host sync. How it runs:
//  - block <= 128 and head_dim 64, 128 or 256 (rotated or not): one kernel, one CTA per (block, head, batch
//    entry); each warp holds whole rows in registers (head_dim / 32 values a lane), rotates them there (the
//    transform's butterflies within a lane, then across lanes by shuffles), the CTA reduces the amax (warp
//    shuffles, then shared memory) and writes the codes: one read of the input, one write of the codes.
//  - otherwise (larger blocks such as V's per-head descale, other head dims; not rotated): two passes over the
//    input: an amax kernel (128-token chunks, atomicMax into the descale buffer), then the codes, then the
//    descales from the amaxes in place.
// Throws std::invalid_argument for a rotation it cannot do (head_dim not 64/128/256, block over 128, rows not
// aligned to head_dim / 32 elements) or a source dtype other than fp32/bf16/fp16.
void quantize_e4m3(const void *src, DType src_dtype, const Strides &src_strides, void *codes,
                   const Strides &code_strides, float *descale, const QuantizeShape &shape,
                   const Rotation &rot, cudaStream_t stream);

// ---- The host reference (quantize_ref.cpp; no CUDA needed).

// x (d floats) := H diag(s) x / sqrt(d) in place, in the device kernel's order: signs, then the butterflies
// (a + b, a - b) for strides 1, 2, ..., d/2, then the scale. d must be hadamard_supported().
void hadamard_rotate_row(float *x, int d, uint64_t seed);
// float -> e4m3 bits, round to nearest even, saturating to +-448 (NaN -> 0x7f): cvt.rn.satfinite.e4m3.
uint8_t float_to_e4m3(float x);
// quantize_e4m3() on the host: src float32, codes with the same strides.
void quantize_e4m3_host(const float *src, const Strides &strides, uint8_t *codes, float *descale,
                        const QuantizeShape &shape, const Rotation &rot);

} // namespace fb
