// The fp32 GPU reference (used above the CPU reference's size limit) against the float64 CPU one.
#include "gpu_test_util.hpp"

// The run path's runner is the harness's own (not a public header): the backward test below drives it.
#include "../../harness/src/point_runner.hpp"

#include <limits>

using namespace fb;
using fb::test::Case;
using fb::test::Shape;

namespace {

// The GPU reference is fp32 GEMMs with float64 softmax statistics: a few fp32 ulps of each dot
// product.
constexpr Tolerance kGpuRefTolerance{1e-5, 1e-4, 1e-5};

VerifyResult gpu_vs_cpu(Case &c) {
  const AttentionProblem &p = c.problem();
  DeviceBuffer o(size_t(p.q_elems()) * sizeof(float)), lse(size_t(p.lse_elems()) * sizeof(float));
  poison(o.get(), o.bytes(), nullptr);
  poison(lse.get(), lse.bytes(), nullptr);
  gpu_reference(p, c.q(), c.k(), c.v(), o.as<float>(), lse.as<float>(), nullptr);
  const auto ho = download_as_float(o.get(), DType::f32, p.q_elems());
  const auto hl = download_as_float(lse.get(), DType::f32, p.lse_elems());
  // Reuse the CPU reference that Case computed by verifying a "kernel" whose output is the GPU
  // reference.
  return c.verify_against_reference(ho, hl, kGpuRefTolerance);
}

class GpuReference : public ::testing::TestWithParam<Shape> {};

TEST_P(GpuReference, MatchesCpuReference) {
  FB_SKIP_WITHOUT_GPU();
  Case c(GetParam().problem());
  const VerifyResult r = gpu_vs_cpu(c);
  EXPECT_TRUE(r.pass) << key(c.problem()) << " (seed " << c.seed() << "): " << r.summary();
}

const std::vector<Shape> kShapes = {
    {"medium", 2, 4, 2, 300, 517, 64, false, DType::bf16},
    {"medium_causal", 2, 4, 2, 517, 300, 64, true, DType::f16}, // includes rows that see no key
    {"medium_f32_bhsd", 1, 4, 1, 256, 256, 128, true, DType::f32, {}, 0, Layout::bhsd},
    // S of one slice exceeds the 1 GiB row block (2^28 / 16400 = 16368 rows < 16400), so two blocks
    // run.
    {"row_blocks", 1, 1, 1, 16400, 16400, 8, true, DType::bf16},
};
INSTANTIATE_TEST_SUITE_P(Shapes, GpuReference, ::testing::ValuesIn(kShapes), fb::test::shape_name);

} // namespace

// The backward's GPU reference (fp32 cuBLAS, TF32 off) against the float64 CPU one, on the same device inputs: Q,
// K, V, dO drawn in the dtype, O and LSE from the forward's CPU reference (O rounded to the dtype).
namespace {

struct BwdShape {
  const char *name;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim;
  bool causal;
  DType dtype;
};

class GpuReferenceBackward : public ::testing::TestWithParam<BwdShape> {};

TEST_P(GpuReferenceBackward, MatchesCpuReference) {
  FB_SKIP_WITHOUT_GPU();
  const BwdShape &s = GetParam();
  AttentionProblem p;
  p.batch = s.batch, p.heads_q = s.heads_q, p.heads_kv = s.heads_kv, p.seqlen_q = s.seqlen_q;
  p.seqlen_kv = s.seqlen_kv, p.head_dim = s.head_dim, p.causal = s.causal, p.dtype = s.dtype;
  p.pass = Pass::bwd;
  validate(p);
  const uint64_t seed = std::random_device{}();
  test::BackwardCase in = test::make_backward_case(p, seed);
  DeviceBuffer &q = in.q, &k = in.k, &v = in.v, &dout = in.dout, &o = in.o, &lse = in.lse;
  const BackwardReference &cpu = in.ref;

  const size_t qb = size_t(p.q_elems()) * sizeof(float), kb = size_t(p.kv_elems()) * sizeof(float);
  DeviceBuffer bufs[9] = {DeviceBuffer(qb), DeviceBuffer(qb), DeviceBuffer(qb),
                          DeviceBuffer(kb), DeviceBuffer(kb), DeviceBuffer(kb),
                          DeviceBuffer(kb), DeviceBuffer(kb), DeviceBuffer(kb)};
  for (auto &b : bufs)
    poison(b.get(), b.bytes(), nullptr);
  BackwardReferenceDevice out;
  out.dq = bufs[0].as<float>(), out.dq_abs = bufs[1].as<float>(),
  out.dq_floor = bufs[2].as<float>();
  out.dk = bufs[3].as<float>(), out.dk_abs = bufs[4].as<float>(),
  out.dk_floor = bufs[5].as<float>();
  out.dv = bufs[6].as<float>(), out.dv_abs = bufs[7].as<float>(),
  out.dv_floor = bufs[8].as<float>();
  gpu_reference_backward(p, q.get(), k.get(), v.get(), o.get(), dout.get(), lse.as<float>(), out,
                         nullptr);
  // fp32 GEMMs over at most a few hundred terms: a few fp32 ulps of each element's terms' sum.
  const GradientReference *want[3] = {&cpu.dq, &cpu.dk, &cpu.dv};
  const char *names[3] = {"dq", "dk", "dv"};
  for (int t = 0; t < 3; ++t) {
    const int64_t n = t == 0 ? p.q_elems() : p.kv_elems();
    const auto val = download_as_float(bufs[3 * t].get(), DType::f32, n);
    const auto abs = download_as_float(bufs[3 * t + 1].get(), DType::f32, n);
    const auto flo = download_as_float(bufs[3 * t + 2].get(), DType::f32, n);
    int reported = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t j = size_t(i);
      const double scale = 1e-6 + 1e-5 * want[t]->abs[j];
      const bool ok = std::abs(val[j] - want[t]->value[j]) <= scale &&
                      std::abs(abs[j] - want[t]->abs[j]) <= 1e-6 + 1e-5 * want[t]->abs[j] &&
                      std::abs(flo[j] - want[t]->floor[j]) <= 1e-6 + 1e-5 * want[t]->floor[j];
      if (!ok && reported++ < 5)
        ADD_FAILURE() << names[t] << "[" << i << "] of " << key(p) << " (seed " << seed << "): gpu "
                      << val[j] << "/" << abs[j] << "/" << flo[j] << ", cpu " << want[t]->value[j]
                      << "/" << want[t]->abs[j] << "/" << want[t]->floor[j];
    }
  }
}

const std::vector<BwdShape> kBwdShapes = {
    {"odd_gqa", 2, 4, 2, 77, 131, 64, false, DType::bf16},
    {"causal_rows_without_keys", 1, 4, 1, 131, 77, 32, true, DType::f16}, // 54 rows see no key; MQA
    {"causal_sq_lt_skv_f32", 1, 2, 2, 65, 257, 128, true, DType::f32},
    {"length_one", 1, 1, 1, 1, 1, 16, false, DType::bf16},
    // Three [rows, skv] blocks of 2^26 floats at most: 2^26 / 8200 = 8184 rows < 8200, so two row blocks run.
    {"row_blocks", 1, 1, 1, 8200, 8200, 8, true, DType::bf16},
};
INSTANTIATE_TEST_SUITE_P(Shapes, GpuReferenceBackward, ::testing::ValuesIn(kBwdShapes),
                         [](const ::testing::TestParamInfo<BwdShape> &i) { return i.param.name; });

} // namespace

// The run path of a backward point end to end (PointRunner: fresh inputs, O and LSE from the forward reference,
// poisoned gradients, one launch, verification), with the fp32 GPU reference as the "kernel": it passes, and the
// same with one gradient left unwritten or dQ 3% off fails, naming the tensor.

namespace {

class ReferenceBackwardVariant : public Variant {
public:
  enum class Fault { none, skip_dv, scale_dq, write_o };
  explicit ReferenceBackwardVariant(Fault f) : fault_(f), space_({}, Config()) {}
  std::string name() const override { return "test_reference_bwd"; }
  std::string description() const override { return "the GPU reference as a backward kernel"; }
  const ConfigSpace &space() const override { return space_; }
  Pass pass() const override { return Pass::bwd; }
  Support supports(const AttentionProblem &, const Config &, const DeviceInfo &) const override {
    return Support::yes();
  }
  double model_bytes(const AttentionProblem &p, const Config &) const override {
    return min_bytes(p);
  }
  // Not a real launch (it allocates and synchronises): enough for one verified run.
  void launch(const AttentionProblem &p, const Config &, const LaunchArgs &a,
              cudaStream_t stream) const override {
    const size_t qb = size_t(p.q_elems()) * sizeof(float),
                 kb = size_t(p.kv_elems()) * sizeof(float);
    DeviceBuffer bufs[9] = {DeviceBuffer(qb), DeviceBuffer(qb), DeviceBuffer(qb),
                            DeviceBuffer(kb), DeviceBuffer(kb), DeviceBuffer(kb),
                            DeviceBuffer(kb), DeviceBuffer(kb), DeviceBuffer(kb)};
    BackwardReferenceDevice out;
    out.dq = bufs[0].as<float>(), out.dq_abs = bufs[1].as<float>(),
    out.dq_floor = bufs[2].as<float>();
    out.dk = bufs[3].as<float>(), out.dk_abs = bufs[4].as<float>(),
    out.dk_floor = bufs[5].as<float>();
    out.dv = bufs[6].as<float>(), out.dv_abs = bufs[7].as<float>(),
    out.dv_floor = bufs[8].as<float>();
    gpu_reference_backward(p, a.q, a.k, a.v, a.o, a.dout, a.lse, out, stream);
    if (fault_ == Fault::scale_dq) {
      auto h = download_as_float(out.dq, DType::f32, p.q_elems());
      for (float &x : h)
        x *= 1.03f;
      FB_CUDA_CHECK(cudaMemcpy(out.dq, h.data(), qb, cudaMemcpyHostToDevice));
    }
    convert_from_float(a.dq, p.dtype, out.dq, p.q_elems(), stream);
    convert_from_float(a.dk, p.dtype, out.dk, p.kv_elems(), stream);
    if (fault_ != Fault::skip_dv)
      convert_from_float(a.dv, p.dtype, out.dv, p.kv_elems(), stream);
    if (fault_ == Fault::write_o) // O used as scratch: the next timed launch would read garbage
      FB_CUDA_CHECK(cudaMemsetAsync(a.o, 0, size_t(p.q_elems()) * dtype_bytes(p.dtype), stream));
    FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

private:
  Fault fault_;
  ConfigSpace space_;
};

TEST(PointRunnerBackward, VerifiesTheGradientsOfAFreshPoint) {
  FB_SKIP_WITHOUT_GPU();
  AttentionProblem p;
  p.batch = 2, p.heads_q = 4, p.heads_kv = 2, p.seqlen_q = 131, p.seqlen_kv = 77, p.head_dim = 64;
  p.causal = true; // 54 rows see no key
  p.pass = Pass::bwd;
  cudaStream_t stream;
  FB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    PointRunner runner(fb::test::test_device(), stream);
    for (DType t : {DType::bf16, DType::f16}) {
      p.dtype = t;
      runner.prepare(p);
      const VerifyResult ok = runner.verify(
          ReferenceBackwardVariant(ReferenceBackwardVariant::Fault::none), Config(), 60);
      EXPECT_TRUE(ok.pass) << key(p) << " (seed " << runner.seed() << "): " << ok.summary();
      EXPECT_EQ(ok.reference, "cpu_f64");
      ASSERT_EQ(ok.tensors.size(), 3u);
      const VerifyResult no_dv = runner.verify(
          ReferenceBackwardVariant(ReferenceBackwardVariant::Fault::skip_dv), Config(), 60);
      EXPECT_FALSE(no_dv.pass);
      EXPECT_EQ(no_dv.tensors[2].nonfinite, p.kv_elems()) << no_dv.summary();
      EXPECT_NE(no_dv.detail.find("dv[b=0,s=0,h=0,d=0]"), std::string::npos) << no_dv.detail;
      const VerifyResult bad_dq = runner.verify(
          ReferenceBackwardVariant(ReferenceBackwardVariant::Fault::scale_dq), Config(), 60);
      EXPECT_FALSE(bad_dq.pass) << bad_dq.summary();
      EXPECT_GT(bad_dq.tensors[0].rel_l2_error, 0.02) << bad_dq.summary();
      EXPECT_EQ(bad_dq.tensors[1].mismatches + bad_dq.tensors[2].mismatches, 0) << bad_dq.summary();
      const VerifyResult wrote_o = runner.verify(
          ReferenceBackwardVariant(ReferenceBackwardVariant::Fault::write_o), Config(), 60);
      EXPECT_FALSE(wrote_o.pass);
      EXPECT_EQ(wrote_o.mismatches, 0) << wrote_o.summary(); // its gradients are right
      EXPECT_NE(wrote_o.detail.find("the launch wrote its input O "), std::string::npos)
          << wrote_o.detail; // last: O is now zero; the next dtype draws fresh inputs
    }
  }
  FB_CUDA_CHECK(cudaStreamDestroy(stream));
}

} // namespace
