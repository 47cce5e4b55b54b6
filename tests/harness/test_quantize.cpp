// The host side of quantize.hpp: the random-sign Hadamard rotation (orthogonal, Q K^T preserved, outliers
// spread), float -> e4m3 rounding (against every code and against cuda_fp8.h's own host conversion), and the
// block quantizer's reference math. The device kernel is checked against this reference bit for bit in
// tests/kernels/test_quantize_gpu.cpp.
#include "flashbench/buffers.hpp"
#include "flashbench/quantize.hpp"

#include <gtest/gtest.h>

#include <cuda_fp8.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace fb;

namespace {

// Column i of the rotation A = H diag(s) / sqrt(d): the transform of the basis vector e_i.
std::vector<double> rotation_matrix(int d, uint64_t seed) {
  std::vector<double> a(static_cast<size_t>(d * d));
  std::vector<float> x(static_cast<size_t>(d));
  for (int i = 0; i < d; ++i) {
    std::fill(x.begin(), x.end(), 0.f);
    x[static_cast<size_t>(i)] = 1.f;
    hadamard_rotate_row(x.data(), d, seed);
    for (int j = 0; j < d; ++j)
      a[static_cast<size_t>(j * d + i)] = x[static_cast<size_t>(j)];
  }
  return a;
}

// normal(0, 1) with a fraction of elements replaced by +-U(20, 100) outliers.
std::vector<float> draw(size_t n, double outlier_fraction, std::mt19937_64 &rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> v(n);
  for (float &x : v) {
    x = normal(rng);
    if (u(rng) < outlier_fraction)
      x = static_cast<float>((u(rng) < 0.5 ? -1.0 : 1.0) * (20.0 + 80.0 * u(rng)));
  }
  return v;
}

} // namespace

TEST(Hadamard, IsTheRandomSignHadamardMatrixAndOrthogonal) {
  for (int d : {64, 128, 256}) {
    const uint64_t seed = 1234 + static_cast<uint64_t>(d);
    const std::vector<double> a = rotation_matrix(d, seed);
    int minus = 0;
    for (int i = 0; i < d; ++i)
      minus += hadamard_sign(seed, i) < 0;
    EXPECT_GT(minus, d / 4) << "the signs are not random: " << minus << " of " << d << " negative";
    EXPECT_LT(minus, 3 * d / 4) << minus << " of " << d;
    double worst_entry = 0, worst_gram = 0;
    for (int j = 0; j < d; ++j)
      for (int i = 0; i < d; ++i) {
        // Sylvester's H: H_ji = (-1)^popcount(j & i).
        const double h = (std::popcount(static_cast<unsigned>(j & i)) % 2) ? -1.0 : 1.0;
        const double want = h * hadamard_sign(seed, i) / std::sqrt(double(d));
        worst_entry = std::max(worst_entry, std::abs(a[size_t(j * d + i)] - want));
        double g = 0; // (A A^T)_ji
        for (int k = 0; k < d; ++k)
          g += a[size_t(j * d + k)] * a[size_t(i * d + k)];
        worst_gram = std::max(worst_gram, std::abs(g - (i == j ? 1.0 : 0.0)));
      }
    // Each entry is one float rounding of +-1/sqrt(d); A A^T sums d products of them.
    EXPECT_LT(worst_entry, 1e-7) << "d" << d;
    EXPECT_LT(worst_gram, 4e-7) << "d" << d;
  }
}

TEST(Hadamard, PreservesQKTransposedAndSpreadsOutliers) {
  std::mt19937_64 rng(7);
  for (int d : {64, 128, 256}) {
    const uint64_t seed = 99;
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> q = draw(size_t(d), 0.01, rng), k = draw(size_t(d), 0.01, rng);
      double dot = 0, norm = 0;
      for (int i = 0; i < d; ++i) {
        dot += double(q[size_t(i)]) * k[size_t(i)];
        norm += double(q[size_t(i)]) * q[size_t(i)];
      }
      double knorm = 0;
      for (float x : k)
        knorm += double(x) * x;
      hadamard_rotate_row(q.data(), d, seed);
      hadamard_rotate_row(k.data(), d, seed);
      double rdot = 0, rnorm = 0;
      for (int i = 0; i < d; ++i) {
        rdot += double(q[size_t(i)]) * k[size_t(i)];
        rnorm += double(q[size_t(i)]) * q[size_t(i)];
      }
      // log2(d) + 2 float roundings per element: well under 1e-5 of |q| |k|.
      EXPECT_NEAR(rdot, dot, 1e-5 * std::sqrt(norm * knorm)) << "d" << d << " trial " << trial;
      EXPECT_NEAR(rnorm, norm, 1e-5 * norm);
    }
    // A lone outlier a e_i becomes +-a / sqrt(d) in every dimension: the amax drops sqrt(d)-fold.
    std::vector<float> x(size_t(d), 0.f);
    x[5] = 64.f;
    hadamard_rotate_row(x.data(), d, seed);
    for (float v : x)
      EXPECT_NEAR(std::abs(v), 64.0 / std::sqrt(double(d)), 1e-5) << "d" << d;
  }
  std::vector<float> x(96);
  EXPECT_THROW(hadamard_rotate_row(x.data(), 96, 1), std::invalid_argument);
}

TEST(E4m3, EveryCodeRoundTripsAndTiesGoToEven) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f)
      continue; // NaN
    const float v = e4m3_bits_to_float(static_cast<uint8_t>(c));
    EXPECT_EQ(float_to_e4m3(v), c) << "code " << c << " = " << v;
  }
  // Midpoints between neighbouring positive codes go to the even code (mantissa's last bit 0).
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = e4m3_bits_to_float(static_cast<uint8_t>(c)),
                hi = e4m3_bits_to_float(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);
    EXPECT_EQ(float_to_e4m3(mid), (c % 2 == 0) ? c : c + 1) << lo << " .. " << hi;
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 0.f)), c);
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 1e9f)), c + 1);
  }
  EXPECT_EQ(float_to_e4m3(448.f), 0x7e);
  EXPECT_EQ(float_to_e4m3(470.f), 0x7e); // past 448: saturates, never the NaN code
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(float_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e-30f), 0x00);
}

TEST(E4m3, MatchesCudaFp8sHostConversion) {
  // cuda_fp8.h's host path (its own software conversion) on values over the whole range, subnormals included.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> exponent(-14.f, 10.f), mantissa(1.f, 2.f);
  int mismatches = 0;
  for (float x : {0.f, -0.f, 1e-30f, -1e-30f, 0x1p-10f, -0x1p-10f, 448.f, 464.f, -464.f, 480.f,
                  1e30f, -1e30f})
    EXPECT_EQ(float_to_e4m3(x),
              static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)))
        << x;
  for (int i = 0; i < 200000; ++i) {
    float x = std::ldexp(mantissa(rng), static_cast<int>(exponent(rng)));
    if (i % 2)
      x = -x;
    const uint8_t want = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
    if (float_to_e4m3(x) != want && ++mismatches <= 5)
      ADD_FAILURE() << x << ": ours " << int(float_to_e4m3(x)) << ", cuda_fp8.h " << int(want);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(QuantizeHost, DescalesAreBlockAmaxOver448AndCodesRoundTrip) {
  // [batch 2, seqlen 300, heads 3, d 128] bshd: blocks of 128, 128 and 44 tokens.
  const QuantizeShape q{2, 300, 3, 128, kFp8ScaleBlock};
  const Strides s{300 * 3 * 128, 3 * 128, 128};
  std::mt19937_64 rng(11);
  const std::vector<float> x = draw(size_t(2 * 300 * 3 * 128), 0.001, rng);
  for (bool rotate : {false, true}) {
    const Rotation rot{rotate, 42};
    std::vector<uint8_t> codes(x.size());
    std::vector<float> ds(size_t(q.descale_elems()));
    quantize_e4m3_host(x.data(), s, codes.data(), ds.data(), q, rot);
    ASSERT_EQ(ds.size(), 2u * 3 * 3);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t blk = 0; blk < 3; ++blk) {
          float amax = 0;
          int saturated = 0;
          double err2 = 0, ref2 = 0;
          for (int64_t t = blk * 128; t < std::min<int64_t>(300, (blk + 1) * 128); ++t) {
            std::vector<float> row(x.begin() + (b * s.batch + t * s.seq + h * s.head),
                                   x.begin() + (b * s.batch + t * s.seq + h * s.head + 128));
            if (rotate)
              hadamard_rotate_row(row.data(), 128, rot.seed);
            for (int64_t i = 0; i < 128; ++i) {
              amax = std::max(amax, std::abs(row[size_t(i)]));
              const size_t at = size_t(b * s.batch + t * s.seq + h * s.head + i);
              const float back = e4m3_bits_to_float(codes[at]) * ds[size_t((b * 3 + h) * 3 + blk)];
              saturated += (codes[at] & 0x7f) == 0x7e;
              err2 += double(back - row[size_t(i)]) * (back - row[size_t(i)]);
              ref2 += double(row[size_t(i)]) * row[size_t(i)];
            }
          }
          const float d = ds[size_t((b * 3 + h) * 3 + blk)];
          EXPECT_EQ(d, amax / 448.f);
          EXPECT_GE(saturated, 1) << "the block's largest value should take code 448";
          // e4m3 keeps 3 mantissa bits: relative error at most 2^-4 per normal value, ~2^-5.8 in RMS.
          EXPECT_LT(std::sqrt(err2 / ref2), 0.04) << "rotate " << rotate;
        }
  }
}

TEST(QuantizeHost, RotationLowersTheDescalesOfBlocksWithOutliers) {
  // One block of 128 tokens, d 128, with a few outliers of 100: unrotated, its amax is the outlier; rotated, the
  // outlier spreads to 100 / sqrt(128) ~ 8.8 over its row.
  const QuantizeShape q{1, 128, 1, 128, kFp8ScaleBlock};
  const Strides s{128 * 128, 128, 128};
  std::mt19937_64 rng(5);
  std::vector<float> x = draw(128 * 128, 0.0, rng);
  for (int i : {17, 4000, 9001})
    x[size_t(i)] = 100.f;
  std::vector<uint8_t> codes(x.size());
  float plain = 0, rotated = 0;
  quantize_e4m3_host(x.data(), s, codes.data(), &plain, q, Rotation{false, 0});
  quantize_e4m3_host(x.data(), s, codes.data(), &rotated, q, Rotation{true, 8});
  EXPECT_EQ(plain, 100.f / 448.f);
  EXPECT_LT(rotated, plain / 4) << "rotated descale " << rotated;
  EXPECT_THROW(quantize_e4m3_host(x.data(), s, codes.data(), &plain,
                                  QuantizeShape{1, 128, 1, 96, kFp8ScaleBlock}, Rotation{true, 1}),
               std::invalid_argument);
}

TEST(QuantizeHost, AllZeroBlockHasDescaleOneAndZeroCodes) {
  const QuantizeShape q{1, 5, 1, 64, kFp8ScaleBlock};
  const Strides s{5 * 64, 64, 64};
  const std::vector<float> x(5 * 64, 0.f);
  std::vector<uint8_t> codes(x.size(), 0xff);
  float ds = 0;
  quantize_e4m3_host(x.data(), s, codes.data(), &ds, q, Rotation{true, 3});
  EXPECT_EQ(ds, 1.f);
  // +0 or -0 (0x80: the signs turn some zeros negative, as they do on the device).
  EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t c) { return (c & 0x7f) == 0; }));
}
