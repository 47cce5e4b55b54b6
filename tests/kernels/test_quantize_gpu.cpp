// quantize_e4m3 (harness/src/quantize.cu) against its host reference (quantize_ref.cpp), bit for bit: codes and
// descales, with and without the Hadamard rotation, from fp32, bf16 and fp16 sources, in both layouts, on awkward
// lengths (a last block shorter than 128 tokens), through the fused kernel (blocks of at most 128 tokens, d 64/128/
// 256) and the two-pass path (V's per-head block; a head_dim that is no power of two). Inputs are normal(0, 1) with
// 0.1% outliers of +-U(20, 100), so that the descales differ block by block. Skips without a device.
#include "gpu_test_util.hpp"

#include "flashbench/quantize.hpp"

#include <cstring>
#include <random>
#include <sstream>

using namespace fb;

namespace {

uint16_t to_bf16_bits(float x) { // round to nearest even (finite inputs)
  uint32_t b = 0;
  std::memcpy(&b, &x, 4);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

struct QCase {
  DType src;
  int64_t batch, seqlen, heads, head_dim, block;
  Layout layout;
  bool rotate;
};

std::string name(const QCase &c) {
  std::ostringstream os;
  os << to_string(c.src) << " b" << c.batch << " s" << c.seqlen << " h" << c.heads << " d"
     << c.head_dim << " block" << c.block << " " << to_string(c.layout)
     << (c.rotate ? " rotated" : "");
  return os.str();
}

void expect_bit_exact(const QCase &c, uint64_t seed) {
  const QuantizeShape q{c.batch, c.seqlen, c.heads, c.head_dim, c.block};
  const Strides s =
      c.layout == Layout::bshd
          ? Strides{c.seqlen * c.heads * c.head_dim, c.heads * c.head_dim, c.head_dim}
          : Strides{c.heads * c.seqlen * c.head_dim, c.head_dim, c.seqlen * c.head_dim};
  const size_t n = size_t(c.batch * c.seqlen * c.heads * c.head_dim);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> x(n);
  for (float &v : x) {
    v = normal(rng);
    if (u(rng) < 0.001)
      v = float((u(rng) < 0.5 ? -1.0 : 1.0) * (20.0 + 80.0 * u(rng)));
  }
  // The device source in its dtype; the reference reads the same values back as float (exact).
  std::vector<unsigned char> raw(n * size_t(dtype_bytes(c.src)));
  if (c.src == DType::f32) {
    std::memcpy(raw.data(), x.data(), raw.size());
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint16_t bits = 0;
      if (c.src == DType::bf16) {
        bits = to_bf16_bits(x[i]);
      } else {
        const __half h = __float2half(x[i]);
        std::memcpy(&bits, &h, 2);
      }
      std::memcpy(raw.data() + 2 * i, &bits, 2);
    }
    x = to_float(raw.data(), c.src, int64_t(n));
  }
  DeviceBuffer src(raw.size()), codes(n), ds(size_t(q.descale_elems()) * sizeof(float));
  FB_CUDA_CHECK(cudaMemcpy(src.get(), raw.data(), raw.size(), cudaMemcpyHostToDevice));
  poison(codes.get(), codes.bytes(), nullptr);
  poison(ds.get(), ds.bytes(), nullptr);
  const Rotation rot{c.rotate, seed ^ 0xabcdefull};
  quantize_e4m3(src.get(), c.src, s, codes.get(), s, ds.as<float>(), q, rot, nullptr);
  FB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> got(n), want(n);
  std::vector<float> got_ds(size_t(q.descale_elems())), want_ds(got_ds.size());
  FB_CUDA_CHECK(cudaMemcpy(got.data(), codes.get(), n, cudaMemcpyDeviceToHost));
  FB_CUDA_CHECK(cudaMemcpy(got_ds.data(), ds.get(), ds.bytes(), cudaMemcpyDeviceToHost));
  quantize_e4m3_host(x.data(), s, want.data(), want_ds.data(), q, rot);

  int bad_ds = 0;
  for (size_t i = 0; i < want_ds.size(); ++i)
    if (std::memcmp(&got_ds[i], &want_ds[i], 4) != 0 && ++bad_ds <= 3)
      ADD_FAILURE() << name(c) << ": descale " << i << " is " << got_ds[i] << ", reference "
                    << want_ds[i];
  EXPECT_EQ(bad_ds, 0) << name(c);
  int bad = 0;
  for (size_t i = 0; i < n; ++i)
    if (got[i] != want[i] && ++bad <= 3)
      ADD_FAILURE() << name(c) << ": code " << i << " is 0x" << std::hex << int(got[i])
                    << ", reference 0x" << int(want[i]);
  EXPECT_EQ(bad, 0) << name(c) << " (seed " << seed << "): " << bad << " of " << n
                    << " codes differ";
}

} // namespace

TEST(QuantizeGpu, FusedKernelMatchesHostReferenceBitForBit) {
  FB_SKIP_WITHOUT_GPU();
  const uint64_t seed = std::random_device{}();
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (int64_t d : {64, 128, 256})
      for (bool rotate : {false, true})
        for (Layout l : {Layout::bshd, Layout::bhsd})
          expect_bit_exact({t, 2, 300, 3, d, kFp8ScaleBlock, l, rotate}, seed);
  // One token; a block shorter than the CTA's 128 rows.
  expect_bit_exact({DType::bf16, 1, 1, 2, 128, kFp8ScaleBlock, Layout::bshd, true}, seed + 1);
  expect_bit_exact({DType::bf16, 1, 200, 2, 128, 64, Layout::bshd, true}, seed + 2);
}

TEST(QuantizeGpu, TwoPassPathMatchesHostReferenceBitForBit) {
  FB_SKIP_WITHOUT_GPU();
  const uint64_t seed = std::random_device{}();
  // V's descale: one block of the whole sequence (1000 tokens: 8 chunks, the last one short).
  for (DType t : {DType::f32, DType::bf16})
    for (Layout l : {Layout::bshd, Layout::bhsd})
      expect_bit_exact({t, 2, 1000, 3, 128, 1000, l, false}, seed);
  // A head_dim no warp splits evenly, at the Q/K block size; blocks of 300 tokens.
  expect_bit_exact({DType::bf16, 2, 333, 2, 96, kFp8ScaleBlock, Layout::bshd, false}, seed + 1);
  expect_bit_exact({DType::f32, 1, 700, 2, 64, 300, Layout::bhsd, false}, seed + 2);
}

TEST(QuantizeGpu, RefusesARotationItCannotDo) {
  FB_SKIP_WITHOUT_GPU();
  DeviceBuffer src(2 * 128 * 96 * 4), codes(2 * 128 * 96), ds(64);
  const Strides s{128 * 96, 96, 96};
  EXPECT_THROW(quantize_e4m3(src.get(), DType::f32, s, codes.get(), s, ds.as<float>(),
                             QuantizeShape{1, 128, 1, 96, kFp8ScaleBlock}, Rotation{true, 1},
                             nullptr),
               std::invalid_argument);
  const Strides s2{256 * 128, 128, 128};
  EXPECT_THROW(quantize_e4m3(src.get(), DType::f32, s2, codes.get(), s2, ds.as<float>(),
                             QuantizeShape{1, 256, 1, 128, 256}, Rotation{true, 1}, nullptr),
               std::invalid_argument);
}

TEST(QuantizeGpu, HarnessInputsAreTheDequantizedRotatedCodes) {
  // fill_e4m3_inputs with quant block_hadamard: the values handed to the reference are other values than without
  // it (the rotation was applied), and Q and K share one rotation, so that Q K^T of the rotated values is that of
  // the drawn ones up to quantization error.
  FB_SKIP_WITHOUT_GPU();
  AttentionProblem p;
  p.batch = 1;
  p.heads_q = p.heads_kv = 2;
  p.seqlen_q = p.seqlen_kv = 200;
  p.head_dim = 128;
  p.dtype = DType::e4m3;
  const uint64_t seeds[3] = {11, 12, 13};
  double dots[2][4] = {}, norms[4] = {}; // norms: |q| |k| of the unrotated values
  std::vector<float> q_values[2];
  for (Quant qt : {Quant::block, Quant::block_hadamard}) {
    p.quant = qt;
    DeviceBuffer c[3], d[3], v[3];
    const int64_t elems[3] = {p.q_elems(), p.kv_elems(), p.kv_elems()};
    const int64_t nds[3] = {p.q_descale_elems(), p.k_descale_elems(), p.v_descale_elems()};
    for (int i = 0; i < 3; ++i) {
      c[i] = DeviceBuffer(size_t(elems[i]));
      d[i] = DeviceBuffer(size_t(nds[i]) * 4);
      v[i] = DeviceBuffer(size_t(elems[i]) * 4);
    }
    void *const codes[3] = {c[0].get(), c[1].get(), c[2].get()};
    float *const ds[3] = {d[0].as<float>(), d[1].as<float>(), d[2].as<float>()};
    float *const vals[3] = {v[0].as<float>(), v[1].as<float>(), v[2].as<float>()};
    fill_e4m3_inputs(p, codes, ds, vals, seeds, nullptr);
    FB_CUDA_CHECK(cudaDeviceSynchronize());
    const auto q = download_as_float(v[0].get(), DType::f32, p.q_elems());
    const auto k = download_as_float(v[1].get(), DType::f32, p.kv_elems());
    q_values[qt == Quant::block_hadamard] = q;
    // A few (query, key) dot products of head 0: rows 0..3 against key 7.
    for (int r = 0; r < 4; ++r) {
      double qq = 0, kk = 0;
      for (int i = 0; i < 128; ++i) {
        const double a = q[size_t(r * 256 + i)], b = k[size_t(7 * 256 + i)];
        dots[qt == Quant::block_hadamard][r] += a * b;
        qq += a * a;
        kk += b * b;
      }
      if (qt == Quant::block)
        norms[r] = std::sqrt(qq * kk);
    }
  }
  size_t same = 0;
  for (size_t i = 0; i < q_values[0].size(); ++i)
    same += q_values[0][i] == q_values[1][i];
  EXPECT_LT(same, q_values[0].size() / 10) << "block_hadamard left Q's values as they were";
  // Each dot product carries e4m3 error of about 0.04 |q| |k| / sqrt(d); the two quantizations' errors are
  // independent. Q and K rotated by different matrices would differ by about |q| |k| / sqrt(d).
  for (int r = 0; r < 4; ++r)
    EXPECT_NEAR(dots[1][r], dots[0][r], 0.3 * norms[r] / std::sqrt(128.0))
        << "row " << r << ": the rotation changed Q K^T beyond quantization error";
}
