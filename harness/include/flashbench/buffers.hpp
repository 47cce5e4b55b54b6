// Device memory and input generation. Inputs are normal(0, 1) draws from a counter-based hash of (seed, index),
// generated on the device, so that every run draws fresh values (a new seed) while any one run can be replayed.
#pragma once

#include "flashbench/problem.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fb {

// RAII cudaMalloc'd memory, 256-byte aligned. Move-only.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer &&o) noexcept;
  DeviceBuffer &operator=(DeviceBuffer &&o) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;

  void *get() const { return ptr_; }
  template <class T> T *as() const { return static_cast<T *>(ptr_); }
  size_t bytes() const { return bytes_; }

private:
  void *ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Fills n elements of type t with normal(0, 1) * stddev values derived from (seed, i).
void fill_normal(void *dst, DType t, int64_t n, uint64_t seed, float stddev, cudaStream_t stream);
// The values of e4m3 test inputs, before quantization: one float32 tensor of `heads` heads and `seqlen` tokens with
// element strides s, normal(0, 1) draws times a magnitude drawn per (batch, head, block of `block` tokens) in
// [1/2, 2], so that a kernel that applies another block's descale fails verification.
void fill_blocked_normal(float *dst, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                         const Strides &s, int64_t block, uint64_t seed, cudaStream_t stream);
// The values of a quantized tensor (code * its block's descale) as float32, in the same layout and strides.
void dequantize_e4m3(float *dst, const void *src, const float *descale, int64_t batch,
                     int64_t seqlen, int64_t heads, int64_t head_dim, const Strides &s,
                     int64_t block, cudaStream_t stream);
// All three inputs of an e4m3 problem, as the harness and the tests draw them: values from fill_blocked_normal
// (seeds[0..2]), quantized by quantize_e4m3 (quantize.hpp): Q and K per 128-token block (kFp8ScaleBlock), rotated
// first by one shared random-sign Hadamard matrix when p.quant is block_hadamard, V per (batch, kv head), never
// rotated; codes[i] get the e4m3 codes, descales[i] the descales (LaunchArgs' shapes) and values[i]
// (q/kv_elems() floats each) the dequantized values the reference reads: what the kernel is given, rotation
// included.
void fill_e4m3_inputs(const AttentionProblem &p, void *const codes[3], float *const descales[3],
                      float *const values[3], const uint64_t seeds[3], cudaStream_t stream);
// n float32 values, normal(0, 1), each an outlier with probability `fraction` (the FP8 outlier experiment,
// fp8_error.hpp), from (seed, i). additive: an outlier is the normal value plus normal(0, a^2) (the FlashAttention-3
// paper's N(0, 1) + N(0, 100) Bernoulli(0.001) with a = 10); otherwise it is replaced by random sign times a
// magnitude uniform in [a, b].
void fill_normal_with_outliers(float *dst, int64_t n, uint64_t seed, double fraction, bool additive,
                               float a, float b, cudaStream_t stream);
// x[i] = |x[i]| for n float32 values (the e4m3 check's reference of |V|: verify.hpp, Tolerance::p_round).
void abs_inplace(float *x, int64_t n, cudaStream_t stream);
// dst[i] = src[i] rounded to nearest in dtype t (fp32, fp16 or bf16), device to device: the backward's O, which
// the kernel and the reference then both read in the problem's dtype.
void convert_from_float(void *dst, DType t, const float *src, int64_t n, cudaStream_t stream);
// Overwrites with all-ones bits: NaN in fp32, fp16, bf16 and e4m3, so an element a kernel forgot to write fails.
void poison(void *dst, size_t bytes, cudaStream_t stream);

// Host-side conversion of raw fp32/fp16/bf16 bits to float (no CUDA headers needed).
std::vector<float> to_float(const void *host_src, DType t, int64_t n);
float half_bits_to_float(uint16_t bits);
float bf16_bits_to_float(uint16_t bits);
float e4m3_bits_to_float(uint8_t bits);

// Bytes of a device buffer that are not zero (semaphores must come back all zero: LaunchArgs::semaphores).
int64_t count_nonzero_bytes(const void *device_src, size_t bytes);

// Copies n elements of type t from the device and converts them to float.
std::vector<float> download_as_float(const void *device_src, DType t, int64_t n);

} // namespace fb
