// Shared scaffolding of the GPU kernel tests: fresh random inputs on the device, the float64 CPU
// reference of them, and one verified run of a (variant, config) against it. Every test skips when
// no device is present.
#pragma once

#include "flashbench/buffers.hpp"
#include "flashbench/check.hpp"
#include "flashbench/device.hpp"
#include "flashbench/kv_cache.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/reference.hpp"
#include "flashbench/variant.hpp"
#include "flashbench/verify.hpp"

#include <gtest/gtest.h>

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#define FB_SKIP_WITHOUT_GPU()                                                                      \
  do {                                                                                             \
    if (::fb::device_count() == 0)                                                                 \
      GTEST_SKIP() << "no CUDA device: GPU test skipped";                                          \
  } while (0)

// The sm_90a kernels (fa3_pipelined, fa3_fp8): skipped without a device and on any but compute capability 9.0.
#define FB_SKIP_WITHOUT_HOPPER()                                                                   \
  do {                                                                                             \
    FB_SKIP_WITHOUT_GPU();                                                                         \
    if (::fb::test::test_device().cc() != 90)                                                      \
      GTEST_SKIP() << "sm_90a kernel; device is cc " << ::fb::test::test_device().cc_major << "."  \
                   << ::fb::test::test_device().cc_minor;                                          \
  } while (0)

namespace fb::test {

struct Shape {
  const char *name;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim;
  bool causal;
  DType dtype;
  std::vector<int64_t> kv_lens = {}; // per-entry KV lengths (decode shapes); empty: all seqlen_kv
  int64_t page_size = 0;             // paged KV cache; 0: contiguous
  Layout layout = Layout::bshd;
  Quant quant = Quant::block; // e4m3: Q and K rotated before quantization (block_hadamard) or not

  AttentionProblem problem() const {
    AttentionProblem p;
    p.batch = batch;
    p.heads_q = heads_q;
    p.heads_kv = heads_kv;
    p.seqlen_q = seqlen_q;
    p.seqlen_kv = seqlen_kv;
    p.head_dim = head_dim;
    p.causal = causal;
    p.dtype = dtype;
    p.kv_lens = kv_lens;
    p.page_size = page_size;
    p.layout = layout;
    p.quant = quant;
    return p;
  }
};

inline std::ostream &operator<<(std::ostream &os, const Shape &s) { return os << key(s.problem()); }
inline std::string shape_name(const ::testing::TestParamInfo<Shape> &info) {
  return info.param.name;
}

inline const DeviceInfo &test_device() {
  static const DeviceInfo dev = query_device(0);
  return dev;
}

// Inputs and reference of one problem, shared by every (variant, config) run on it. The seed comes
// from std::random_device so each test run draws new values; failures print it so that a run can be
// replayed.
//
// key_growth > 0 (bshd only): the keys of every entry come in 4 blocks along the sequence with
// standard deviations 1, g, g^2, g^3, so each row's score maximum keeps growing late in the K/V loop
// and an online softmax must move its offset (and rescale O) after its first tiles; with unit keys
// a row's maximum settles in its first tile.
//
// score_shift != 0 (bshd only): every score moves by about that many log2 units (softmax_scale
// included): channel 0 of every query is set to a and of every key to b, integers exact in bf16 and
// fp16, so each score gains a * b * scale. Softmax is unchanged by it; a kernel that assumes scores
// near 0 (a guessed exp2 offset, unscaled exp) is not.
class Case {
public:
  explicit Case(const AttentionProblem &p, uint64_t seed = std::random_device{}(),
                float key_growth = 0.f, float score_shift = 0.f)
      : p_(p), seed_(seed), e_(dtype_bytes(p.dtype)) {
    validate(p_);
    q_ = DeviceBuffer(size_t(p_.q_elems() * e_));
    k_ = DeviceBuffer(size_t(p_.kv_elems() * e_));
    v_ = DeviceBuffer(size_t(p_.kv_elems() * e_));
    o_ = DeviceBuffer(size_t(p_.q_elems() * dtype_bytes(out_dtype(p_.dtype))));
    lse_ = DeviceBuffer(size_t(p_.lse_elems()) * sizeof(float));
    if (p_.dtype == DType::e4m3) {
      init_e4m3();
      return;
    }
    fill_normal(q_.get(), p_.dtype, p_.q_elems(), seed_ * 3 + 0, 1.f, nullptr);
    fill_normal(k_.get(), p_.dtype, p_.kv_elems(), seed_ * 3 + 1, 1.f, nullptr);
    fill_normal(v_.get(), p_.dtype, p_.kv_elems(), seed_ * 3 + 2, 1.f, nullptr);
    if (key_growth > 0.f) {
      if (p_.layout != Layout::bshd || !p_.kv_lens.empty() || p_.paged())
        throw std::invalid_argument("Case: key_growth needs a dense bshd problem");
      const int64_t row = p_.heads_kv * p_.head_dim, S = p_.seqlen_kv;
      for (int64_t b = 0; b < p_.batch; ++b)
        for (int q = 0; q < 4; ++q) {
          const int64_t s0 = S * q / 4, s1 = S * (q + 1) / 4;
          if (s1 > s0)
            fill_normal(static_cast<char *>(k_.get()) + (b * S + s0) * row * e_, p_.dtype,
                        (s1 - s0) * row, seed_ * 3 + 1 + 1000 * uint64_t(4 * b + q + 1),
                        std::pow(key_growth, float(q)), nullptr);
        }
    }
    if (score_shift != 0.f) {
      if (p_.layout != Layout::bshd || !p_.kv_lens.empty() || p_.paged())
        throw std::invalid_argument("Case: score_shift needs a dense bshd problem");
      const double per_unit = p_.softmax_scale() / std::log(2.0); // log2 units per unit of q.k
      const double a = std::abs(score_shift) > 64.f ? 32.0 : 16.0;
      const double b = std::round(double(score_shift) / (per_unit * a));
      if (std::abs(b) > 255.0)
        throw std::invalid_argument("Case: score_shift too large for an exact 8-bit channel value");
      set_channel0(q_.get(), p_.batch * p_.seqlen_q * p_.heads_q, float(a));
      set_channel0(k_.get(), p_.batch * p_.seqlen_kv * p_.heads_kv, float(b));
    }
    FB_CUDA_CHECK(cudaDeviceSynchronize());
    // The reference reads the inputs as the kernels do: already rounded to the problem's dtype.
    const auto q = download_as_float(q_.get(), p_.dtype, p_.q_elems());
    const auto k = download_as_float(k_.get(), p_.dtype, p_.kv_elems());
    const auto v = download_as_float(v_.get(), p_.dtype, p_.kv_elems());
    ref_ = cpu_reference(p_, q.data(), k.data(), v.data());
    // cache_seqlens, and for paged problems a shuffled page table and the K/V page pools.
    kv_ = build_kv_cache(p_, k_.get(), v_.get(), seed_ * 3 + 3, nullptr);
  }

  const AttentionProblem &problem() const { return p_; }
  uint64_t seed() const { return seed_; }
  const void *q() const { return q_.get(); }
  const void *k() const { return k_.get(); }
  const void *v() const { return v_.get(); }

  // Poisons outputs and workspace (NaN bits), launches `launches` times on the legacy stream (later
  // launches find the workspace and semaphores as the previous one left them), and verifies the last
  // result. The semaphores start at zero and must come back zero (LaunchArgs::semaphores).
  VerifyResult run(const Variant &var, const Config &c, int launches = 1) {
    DeviceBuffer ws(var.workspace_bytes(p_, c));
    DeviceBuffer sem(var.semaphore_bytes(p_, c));
    if (sem.bytes() > 0)
      FB_CUDA_CHECK(cudaMemset(sem.get(), 0, sem.bytes()));
    poison(o_.get(), o_.bytes(), nullptr);
    poison(lse_.get(), lse_.bytes(), nullptr);
    poison(ws.get(), ws.bytes(), nullptr);
    LaunchArgs args;
    args.q = q_.get();
    args.k = p_.paged() ? kv_.k_pages.get() : k_.get();
    args.v = p_.paged() ? kv_.v_pages.get() : v_.get();
    args.cache_seqlens = kv_.seqlens.as<int32_t>();
    args.page_table = kv_.page_table.as<int32_t>();
    args.pages_per_seq = p_.pages_per_seq();
    args.o = o_.get();
    args.lse = lse_.as<float>();
    args.workspace = ws.get();
    args.workspace_bytes = ws.bytes();
    args.semaphores = sem.get();
    args.semaphore_bytes = sem.bytes();
    args.q_descale = descale_[0].as<float>();
    args.k_descale = descale_[1].as<float>();
    args.v_descale = descale_[2].as<float>();
    for (int i = 0; i < launches; ++i)
      var.launch(p_, c, args, nullptr);
    FB_CUDA_CHECK(cudaDeviceSynchronize());
    const auto o = download_as_float(o_.get(), out_dtype(p_.dtype), p_.q_elems());
    const auto lse = download_as_float(lse_.get(), DType::f32, p_.lse_elems());
    VerifyResult r = verify_against_reference(o, lse, tolerance_for(p_.dtype));
    const int64_t nonzero = count_nonzero_bytes(sem.get(), sem.bytes());
    if (nonzero > 0) {
      r.pass = false;
      r.detail = std::to_string(nonzero) + " semaphore bytes left non-zero; " + r.detail;
    }
    return r;
  }

  VerifyResult verify_against_reference(const std::vector<float> &o, const std::vector<float> &lse,
                                        const Tolerance &tol) const {
    return verify<double>(p_, o.data(), lse.data(), ref_.o.data(), ref_.lse.data(), tol,
                          ref_abs_.empty() ? nullptr : ref_abs_.data());
  }

  // One EXPECT per (variant, config): supported on this device, and within tolerance.
  void expect_pass(const Variant &var, const Config &c, int launches = 1) {
    const std::string what = var.name() + " [" + var.space().to_string(c) + "] on " + key(p_) +
                             " (seed " + std::to_string(seed_) + ")";
    const Support s = var.supports(p_, c, test_device());
    if (!s) {
      ADD_FAILURE() << what << ": unexpectedly unsupported: " << s.reason;
      return;
    }
    const VerifyResult r = run(var, c, launches);
    EXPECT_TRUE(r.pass) << what << ": " << r.summary();
  }

  // e4m3 problems: the K descales, [batch, heads_kv, ceil(seqlen_kv / 128)] (a test may scale one block's to
  // show that a kernel applies each block's own).
  float *k_descale() { return descale_[1].as<float>(); }

private:
  // e4m3: inputs quantized per block as the harness does (buffers.hpp), and the reference on their values.
  void init_e4m3() {
    if (!p_.kv_lens.empty() || p_.paged())
      throw std::invalid_argument("Case: e4m3 needs contiguous K/V");
    descale_[0] = DeviceBuffer(size_t(p_.q_descale_elems()) * sizeof(float));
    descale_[1] = DeviceBuffer(size_t(p_.k_descale_elems()) * sizeof(float));
    descale_[2] = DeviceBuffer(size_t(p_.v_descale_elems()) * sizeof(float));
    DeviceBuffer qf(size_t(p_.q_elems()) * 4), kf(size_t(p_.kv_elems()) * 4),
        vf(size_t(p_.kv_elems()) * 4);
    void *const codes[3] = {q_.get(), k_.get(), v_.get()};
    float *const ds[3] = {descale_[0].as<float>(), descale_[1].as<float>(),
                          descale_[2].as<float>()};
    float *const vals[3] = {qf.as<float>(), kf.as<float>(), vf.as<float>()};
    const uint64_t seeds[3] = {seed_ * 3 + 0, seed_ * 3 + 1, seed_ * 3 + 2};
    fill_e4m3_inputs(p_, codes, ds, vals, seeds, nullptr);
    FB_CUDA_CHECK(cudaDeviceSynchronize());
    AttentionProblem pf = p_;
    pf.dtype = DType::f32;
    const auto q = download_as_float(qf.get(), DType::f32, p_.q_elems());
    const auto k = download_as_float(kf.get(), DType::f32, p_.kv_elems());
    const auto v = download_as_float(vf.get(), DType::f32, p_.kv_elems());
    ref_ = cpu_reference(pf, q.data(), k.data(), v.data());
    std::vector<float> v_abs(v);
    for (float &x : v_abs)
      x = std::abs(x);
    ref_abs_ = cpu_reference(pf, q.data(), k.data(), v_abs.data()).o; // Tolerance::p_round's scale
    kv_ = build_kv_cache(p_, k_.get(), v_.get(), seed_ * 3 + 3, nullptr);
  }

  // Element 0 of each of `rows` head_dim-long rows := x (an integer below 256 in magnitude: exact
  // in bf16 and fp16, whose bits are then the top half of the float's and an exact conversion).
  void set_channel0(void *dst, int64_t rows, float x) {
    uint16_t bits = 0;
    if (p_.dtype == DType::bf16) {
      uint32_t f = 0;
      std::memcpy(&f, &x, 4);
      bits = uint16_t(f >> 16);
    } else {
      const __half h = __float2half(x);
      std::memcpy(&bits, &h, 2);
    }
    const std::vector<uint16_t> col(size_t(rows), bits);
    FB_CUDA_CHECK(cudaMemcpy2D(dst, size_t(p_.head_dim) * e_, col.data(), 2, 2, size_t(rows),
                               cudaMemcpyHostToDevice));
  }

  AttentionProblem p_;
  uint64_t seed_;
  int64_t e_;
  DeviceBuffer q_, k_, v_, o_, lse_;
  DeviceBuffer descale_[3]; // e4m3: Q, K, V descales
  KvCacheBuffers kv_;
  ReferenceOutput ref_;
  std::vector<double> ref_abs_; // e4m3: O of the reference over |V|
};

// The awkward shapes every variant must get right. Names are GoogleTest parameter names.
inline std::vector<Shape> awkward_shapes() {
  using enum DType;
  return {
      {"len1", 1, 2, 2, 1, 1, 64, false, bf16},
      {"len1_causal", 1, 2, 2, 1, 1, 64, true, f16},
      {"q77_kv131", 1, 2, 2, 77, 131, 64, false, bf16},
      {"q131_kv77", 2, 2, 2, 131, 77, 64, false, f32},
      // seqlen_q > seqlen_kv, causal: the first 54 rows see no key and must come out as 0 / -inf,
      // not NaN.
      {"causal_q131_kv77", 1, 2, 2, 131, 77, 64, true, f16},
      {"causal_q77_kv131", 1, 2, 2, 77, 131, 128, true, f32},
      {"causal_q40_kv1", 1, 1, 1, 40, 1, 64, true, bf16},
      {"decode_q1_kv300", 2, 4, 4, 1, 300, 128, true, bf16},
      {"gqa_8_2", 2, 8, 2, 100, 100, 128, true, bf16},
      {"mqa_8_1", 1, 8, 1, 64, 200, 64, false, f16},
      {"d128_f32", 1, 2, 2, 96, 96, 128, false, f32},
      {"d128_f16_causal", 1, 3, 3, 150, 150, 128, true, f16},
      {"bhsd_gqa", 2, 4, 2, 50, 70, 64, true, bf16, {}, 0, Layout::bhsd},
  };
}

// The inputs of one backward problem as the harness draws them, and their float64 reference gradients: fresh
// normal(0, 1) Q, K, V and dO from seed .. seed + 3; O (rounded to the dtype) and LSE (fp32) from the float64 forward
// reference of the same inputs, as a verified forward leaves them, so that P = exp(S - LSE) is the forward's softmax.
struct BackwardCase {
  DeviceBuffer q, k, v, dout, o, lse;
  BackwardReference ref;
};

inline BackwardCase make_backward_case(const AttentionProblem &p, uint64_t seed) {
  const size_t e = size_t(dtype_bytes(p.dtype));
  BackwardCase c{DeviceBuffer(p.q_elems() * e),
                 DeviceBuffer(p.kv_elems() * e),
                 DeviceBuffer(p.kv_elems() * e),
                 DeviceBuffer(p.q_elems() * e),
                 DeviceBuffer(p.q_elems() * e),
                 DeviceBuffer(p.lse_elems() * sizeof(float)),
                 {}};
  fill_normal(c.q.get(), p.dtype, p.q_elems(), seed, 1.f, nullptr);
  fill_normal(c.k.get(), p.dtype, p.kv_elems(), seed + 1, 1.f, nullptr);
  fill_normal(c.v.get(), p.dtype, p.kv_elems(), seed + 2, 1.f, nullptr);
  fill_normal(c.dout.get(), p.dtype, p.q_elems(), seed + 3, 1.f, nullptr);
  FB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto qh = download_as_float(c.q.get(), p.dtype, p.q_elems());
  const auto kh = download_as_float(c.k.get(), p.dtype, p.kv_elems());
  const auto vh = download_as_float(c.v.get(), p.dtype, p.kv_elems());
  const auto doh = download_as_float(c.dout.get(), p.dtype, p.q_elems());
  AttentionProblem fwd = p;
  fwd.pass = Pass::fwd;
  const ReferenceOutput f = cpu_reference(fwd, qh.data(), kh.data(), vh.data());
  const std::vector<float> of(f.o.begin(), f.o.end()), lf(f.lse.begin(), f.lse.end());
  DeviceBuffer o32(of.size() * sizeof(float));
  FB_CUDA_CHECK(cudaMemcpy(o32.get(), of.data(), o32.bytes(), cudaMemcpyHostToDevice));
  FB_CUDA_CHECK(cudaMemcpy(c.lse.get(), lf.data(), c.lse.bytes(), cudaMemcpyHostToDevice));
  convert_from_float(c.o.get(), p.dtype, o32.as<float>(), p.q_elems(), nullptr);
  FB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto oh = download_as_float(c.o.get(), p.dtype, p.q_elems());
  c.ref =
      cpu_reference_backward(p, qh.data(), kh.data(), vh.data(), oh.data(), doh.data(), lf.data());
  return c;
}

} // namespace fb::test
