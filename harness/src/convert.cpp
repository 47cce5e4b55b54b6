// Host-side conversion of raw fp16/bf16/fp32 bits to float. Plain bit manipulation, so that
// CPU-only code (tests, verification) can read downloaded outputs without the CUDA headers.
#include "flashbench/buffers.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace fb {

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -24); // zero or subnormal: man * 2^-24, exact in fp32
  } else if (exp == 31) {
    mag = man == 0 ? INFINITY : NAN;
  } else {
    uint32_t bits = ((exp + 112u) << 23) | (man << 13); // rebias 15 -> 127
    std::memcpy(&mag, &bits, sizeof mag);
  }
  uint32_t bits;
  std::memcpy(&bits, &mag, sizeof bits);
  bits |= sign;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

float bf16_bits_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16; // bf16 is the top half of an fp32
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

float e4m3_bits_to_float(uint8_t b) {
  // float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN.
  const int exp = (b >> 3) & 0xf, man = b & 7;
  float mag;
  if (exp == 15 && man == 7)
    mag = NAN;
  else if (exp == 0)
    mag = std::ldexp(static_cast<float>(man), -9); // subnormal: man * 2^-9
  else
    mag = std::ldexp(static_cast<float>(8 + man), exp - 10);
  return (b & 0x80) ? -mag : mag;
}

std::vector<float> to_float(const void *host_src, DType t, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  switch (t) {
  case DType::f32:
    std::memcpy(out.data(), host_src, static_cast<size_t>(n) * sizeof(float));
    break;
  case DType::f16: {
    const auto *s = static_cast<const uint16_t *>(host_src);
    for (int64_t i = 0; i < n; ++i)
      out[i] = half_bits_to_float(s[i]);
    break;
  }
  case DType::bf16: {
    const auto *s = static_cast<const uint16_t *>(host_src);
    for (int64_t i = 0; i < n; ++i)
      out[i] = bf16_bits_to_float(s[i]);
    break;
  }
  case DType::e4m3: { // the codes, not the values: a descale multiplies them (fp8_descale_elems)
    const auto *s = static_cast<const uint8_t *>(host_src);
    for (int64_t i = 0; i < n; ++i)
      out[i] = e4m3_bits_to_float(s[i]);
    break;
  }
  }
  return out;
}

} // namespace fb
