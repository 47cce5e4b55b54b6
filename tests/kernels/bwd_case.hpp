// A backward problem on the GPU for the backward variants' tests: fresh inputs and the float64 reference
// (make_backward_case), poisoned gradients and workspace, launches that verify dQ, dK and dV, check that the
// semaphores come back zero and that no input changed, and keep the output bytes for bit-for-bit comparisons.
#pragma once

#include "gpu_test_util.hpp"

#include <random>
#include <string>
#include <vector>

namespace fb::test {

// Inputs of one backward problem and its reference (test::make_backward_case), the gradients' buffers, and a
// launch that verifies them.
class BwdCase {
public:
  explicit BwdCase(AttentionProblem p, uint64_t seed = std::random_device{}())
      : p_(std::move(p)), seed_(seed), e_(dtype_bytes(p_.dtype)) {
    p_.pass = Pass::bwd;
    validate(p_);
    test::BackwardCase c = test::make_backward_case(p_, seed_ * 4);
    q_ = std::move(c.q), k_ = std::move(c.k), v_ = std::move(c.v);
    o_ = std::move(c.o), dout_ = std::move(c.dout), lse_ = std::move(c.lse);
    ref_ = std::move(c.ref);
    dq_ = DeviceBuffer(size_t(p_.q_elems() * e_));
    dk_ = DeviceBuffer(size_t(p_.kv_elems() * e_));
    dv_ = DeviceBuffer(size_t(p_.kv_elems() * e_));
    inputs_ = input_bytes();
  }

  const AttentionProblem &problem() const { return p_; }
  uint64_t seed() const { return seed_; }

  struct Run {
    VerifyResult verdict;
    std::vector<unsigned char> dq, dk, dv; // raw output bytes, for bit-for-bit comparisons
  };

  // Poisons the gradients and the workspace (NaN bits), launches `launches` times on the legacy stream (later
  // launches find the workspace and semaphores as the previous one left them), and verifies the last result.
  // The semaphores start at zero and must come back zero.
  Run run(const Variant &var, const Config &c, int launches = 1) {
    DeviceBuffer ws(var.workspace_bytes(p_, c));
    DeviceBuffer sem(var.semaphore_bytes(p_, c));
    if (sem.bytes() > 0)
      FB_CUDA_CHECK(cudaMemset(sem.get(), 0, sem.bytes()));
    poison(dq_.get(), dq_.bytes(), nullptr);
    poison(dk_.get(), dk_.bytes(), nullptr);
    poison(dv_.get(), dv_.bytes(), nullptr);
    poison(ws.get(), ws.bytes(), nullptr);
    LaunchArgs args;
    args.q = q_.get();
    args.k = k_.get();
    args.v = v_.get();
    args.o = o_.get();
    args.lse = lse_.as<float>();
    args.dout = dout_.get();
    args.dq = dq_.get();
    args.dk = dk_.get();
    args.dv = dv_.get();
    args.workspace = ws.get();
    args.workspace_bytes = ws.bytes();
    args.semaphores = sem.get();
    args.semaphore_bytes = sem.bytes();
    for (int i = 0; i < launches; ++i)
      var.launch(p_, c, args, nullptr);
    FB_CUDA_CHECK(cudaDeviceSynchronize());
    Run r;
    const auto dq = download_as_float(dq_.get(), p_.dtype, p_.q_elems());
    const auto dk = download_as_float(dk_.get(), p_.dtype, p_.kv_elems());
    const auto dv = download_as_float(dv_.get(), p_.dtype, p_.kv_elems());
    r.verdict =
        verify_backward(p_, dq.data(), dk.data(), dv.data(), ref_, grad_tolerance_for(p_.dtype));
    const int64_t nonzero = count_nonzero_bytes(sem.get(), sem.bytes());
    if (nonzero > 0) {
      r.verdict.pass = false;
      r.verdict.detail =
          std::to_string(nonzero) + " semaphore bytes left non-zero; " + r.verdict.detail;
    }
    if (input_bytes() != inputs_) {
      r.verdict.pass = false;
      r.verdict.detail = "the launch changed an input (Q, K, V, O, dO or LSE); " + r.verdict.detail;
    }
    r.dq = bytes_of(dq_), r.dk = bytes_of(dk_), r.dv = bytes_of(dv_);
    return r;
  }

  std::string what(const Variant &var, const Config &c) const {
    return var.name() + " [" + var.space().to_string(c) + "] on " + key(p_) + " (seed " +
           std::to_string(seed_) + ")";
  }

private:
  static std::vector<unsigned char> bytes_of(const DeviceBuffer &b) {
    std::vector<unsigned char> h(b.bytes());
    FB_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
    return h;
  }

  // Every input's bytes, concatenated: a backward launch must leave them as it found them.
  std::vector<unsigned char> input_bytes() const {
    std::vector<unsigned char> all;
    for (const DeviceBuffer *b : {&q_, &k_, &v_, &o_, &dout_, &lse_}) {
      const auto h = bytes_of(*b);
      all.insert(all.end(), h.begin(), h.end());
    }
    return all;
  }

  AttentionProblem p_;
  uint64_t seed_;
  int64_t e_;
  DeviceBuffer q_, k_, v_, o_, dout_, lse_, dq_, dk_, dv_;
  BackwardReference ref_;
  std::vector<unsigned char> inputs_;
};

// Runs every config of the space that the variant supports on this problem (both deterministic modes); returns
// how many ran. Unsupported combinations must say why.
inline int run_all_configs(const Variant &var, BwdCase &c) {
  int ran = 0;
  for (const auto &e : var.space().expand()) {
    if (e.invalid_reason)
      continue;
    const Support s = support_for(var, c.problem(), e.config, test_device());
    if (!s) {
      EXPECT_FALSE(s.reason.empty()) << var.space().to_string(e.config);
      continue;
    }
    const BwdCase::Run r = c.run(var, e.config);
    EXPECT_TRUE(r.verdict.pass) << c.what(var, e.config) << ": " << r.verdict.summary();
    ++ran;
  }
  return ran;
}

// The awkward backward shapes (length 1, odd lengths, causal with seqlen_q != seqlen_kv and rows that see no key,
// GQA and MQA, several row and column blocks crossing the diagonal, ragged ends on both sides), those with
// head_dim up to max_head_dim.
inline std::vector<Shape> backward_shapes(int64_t max_head_dim) {
  const std::vector<Shape> all = {
      {"len1", 1, 2, 2, 1, 1, 64, false, DType::bf16},
      {"len1_causal", 1, 2, 2, 1, 1, 64, true, DType::f16},
      {"q77_kv131", 1, 2, 2, 77, 131, 64, false, DType::bf16},
      {"q131_kv77_f16", 2, 2, 2, 131, 77, 64, false, DType::f16},
      // seqlen_q > seqlen_kv, causal: the first 54 rows see no key (LSE -inf): zero dQ, nothing added to dK/dV.
      {"causal_q131_kv77", 1, 2, 2, 131, 77, 64, true, DType::f16},
      {"causal_q77_kv131_d128", 1, 2, 2, 77, 131, 128, true, DType::bf16},
      // One key: every row but the last sees nothing.
      {"causal_q40_kv1", 1, 1, 1, 40, 1, 64, true, DType::bf16},
      {"gqa_8_2_causal", 2, 8, 2, 100, 100, 128, true, DType::bf16},
      {"mqa_8_1", 1, 8, 1, 64, 200, 64, false, DType::f16},
      {"causal_q300_kv300_d128", 1, 2, 2, 300, 300, 128, true, DType::bf16},
      {"causal_q257_kv513_d64_gqa", 1, 4, 2, 257, 513, 64, true, DType::f16},
      {"q333_kv650_d64", 2, 2, 2, 333, 650, 64, false, DType::bf16},
      {"causal_q513_kv200_d128_gqa", 1, 4, 2, 513, 200, 128, true, DType::f16},
      {"causal_q190_kv190_d256", 1, 2, 2, 190, 190, 256, true, DType::bf16},
      {"q70_kv300_d256_f16", 1, 2, 1, 70, 300, 256, false, DType::f16},
  };
  std::vector<Shape> out;
  for (const Shape &s : all)
    if (s.head_dim <= max_head_dim)
      out.push_back(s);
  return out;
}

// deterministic on gives the same bytes from run to run on a problem where many column blocks add into every row
// block's dQ (the order the atomics would otherwise race on), causal and not. Two launches back to back also
// check that the counters come back to zero (the second launch would deadlock or misorder if they did not).
// `set` turns the variant's default config into its deterministic one.
template <class SetDeterministic>
void check_deterministic(const Variant &var, SetDeterministic set) {
  for (bool causal : {false, true}) {
    BwdCase c(Shape{"det", 2, 4, 2, 1024, 1024, 128, causal, DType::bf16}.problem());
    Config cfg = var.space().default_config(c.problem(), test_device());
    set(cfg);
    ASSERT_TRUE(support_for(var, c.problem(), cfg, test_device()).ok) << c.what(var, cfg);
    const BwdCase::Run a = c.run(var, cfg, 2);
    const BwdCase::Run b = c.run(var, cfg, 1);
    EXPECT_TRUE(a.verdict.pass) << c.what(var, cfg) << ": " << a.verdict.summary();
    EXPECT_TRUE(b.verdict.pass) << c.what(var, cfg) << ": " << b.verdict.summary();
    EXPECT_TRUE(a.dq == b.dq) << c.what(var, cfg) << ": dQ differs between runs";
    EXPECT_TRUE(a.dk == b.dk) << c.what(var, cfg) << ": dK differs between runs";
    EXPECT_TRUE(a.dv == b.dv) << c.what(var, cfg) << ": dV differs between runs";
  }
}

} // namespace fb::test
