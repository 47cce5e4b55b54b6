// The host reference of quantize_e4m3 (quantize.hpp): the same float operations as the device kernel, in the same
// order, so that codes and descales agree bit for bit.
#include "flashbench/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace fb {

void hadamard_rotate_row(float *x, int d, uint64_t seed) {
  if (!hadamard_supported(d))
    throw std::invalid_argument("hadamard_rotate_row: d must be 64, 128 or 256");
  for (int i = 0; i < d; ++i)
    x[i] *= hadamard_sign(seed, i);
  for (int h = 1; h < d; h <<= 1)
    for (int j = 0; j < d; ++j)
      if (!(j & h)) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float scale = hadamard_scale(d);
  for (int i = 0; i < d; ++i)
    x[i] *= scale;
}

uint8_t float_to_e4m3(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  if (std::isnan(x))
    return 0x7f;
  const float a = std::fabs(x);
  if (std::isinf(a))
    return sign | 0x7e;
  // Subnormals step by 2^-9 below 2^-6; a rounded count of 8 is 2^-6, whose code (exponent 1, mantissa 0) is 8.
  if (a < 0x1p-6f)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.f));
  // a = q * 2^(e - 3) with q in [8, 16): the code is ((e + 7) << 3) + (round(q) - 8); a round up to 16 carries
  // into the exponent. Scaling by a power of two is exact, so rounding q is rounding a (to nearest even).
  int k = 0;
  std::frexp(a, &k); // a = f * 2^k, f in [0.5, 1)
  const int e = k - 1;
  const long q = std::lrint(std::ldexp(a, 3 - e));
  const long code = ((static_cast<long>(e) + 7) << 3) + (q - 8);
  return sign | static_cast<uint8_t>(std::min<long>(code, 0x7e)); // 0x7e = 448; 0x7f is NaN
}

void quantize_e4m3_host(const float *src, const Strides &s, uint8_t *codes, float *descale,
                        const QuantizeShape &q, const Rotation &rot) {
  if (rot.on && !hadamard_supported(q.head_dim))
    throw std::invalid_argument("quantize_e4m3_host: the rotation needs head_dim 64, 128 or 256");
  const int64_t d = q.head_dim;
  std::vector<float> tile;
  for (int64_t b = 0; b < q.batch; ++b)
    for (int64_t h = 0; h < q.heads; ++h)
      for (int64_t blk = 0; blk < q.blocks(); ++blk) {
        const int64_t t0 = blk * q.block, rows = std::min(q.block, q.seqlen - t0);
        tile.assign(static_cast<size_t>(rows * d), 0.f);
        float amax = 0.f;
        for (int64_t r = 0; r < rows; ++r) {
          float *row = tile.data() + r * d;
          const float *in = src + b * s.batch + (t0 + r) * s.seq + h * s.head;
          std::copy(in, in + d, row);
          if (rot.on)
            hadamard_rotate_row(row, static_cast<int>(d), rot.seed);
          for (int64_t i = 0; i < d; ++i)
            amax = std::max(amax, std::fabs(row[i]));
        }
        const float ds = e4m3_descale(amax), inv = e4m3_code_scale(ds);
        descale[(b * q.heads + h) * q.blocks() + blk] = ds;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < d; ++i)
            codes[b * s.batch + (t0 + r) * s.seq + h * s.head + i] =
                float_to_e4m3(tile[static_cast<size_t>(r * d + i)] * inv);
      }
}

} // namespace fb
