// flashbench's C API (harness/capi/capi.cpp) on the GPU: a launcher runs the variant over the caller's buffers on the
// caller's stream, and the output matches the float64 CPU reference, as the same variant launched by the harness
// does. fa3_pipelined where the device has sm_90a (the variant peers.py --ours times), fa2_q_outer everywhere; the
// catalog's backward variants through fb_capi_launch_backward, against the backward's CPU reference.
#include "gpu_test_util.hpp"

#include "flashbench/capi.h"

#include <nlohmann/json.hpp>

using namespace fb;

namespace {

void expect_capi_matches_reference(const char *variant, const char *config,
                                   const AttentionProblem &p) {
  test::Case c(p);
  const std::string problem_json = nlohmann::json(p).dump();
  fb_capi_launcher *l = fb_capi_create(variant, config, problem_json.c_str());
  ASSERT_NE(l, nullptr) << variant << ": " << fb_capi_last_error();
  DeviceBuffer o(size_t(p.q_elems() * dtype_bytes(p.dtype)));
  DeviceBuffer lse(size_t(p.lse_elems()) * sizeof(float));
  cudaStream_t stream = nullptr;
  FB_CUDA_CHECK(cudaStreamCreate(&stream));
  // Twice: the second launch finds the semaphores as the first left them (zero), as a timed loop does.
  for (int i = 0; i < 2; ++i) {
    poison(o.get(), o.bytes(), stream);
    poison(lse.get(), lse.bytes(), stream);
    ASSERT_EQ(fb_capi_launch(l, c.q(), c.k(), c.v(), o.get(), lse.as<float>(), stream), 0)
        << fb_capi_last_error();
  }
  FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  FB_CUDA_CHECK(cudaStreamDestroy(stream));
  const VerifyResult r = c.verify_against_reference(
      download_as_float(o.get(), p.dtype, p.q_elems()),
      download_as_float(lse.get(), DType::f32, p.lse_elems()), tolerance_for(p.dtype));
  EXPECT_TRUE(r.pass) << variant << " [" << fb_capi_config_string(l) << "] on " << key(p)
                      << " (seed " << c.seed() << "): " << r.summary();
  fb_capi_destroy(l);
}

AttentionProblem awkward(int64_t head_dim) {
  return test::Shape{"capi", 2, 4, 2, 77, 131, head_dim, true, DType::bf16}.problem();
}

} // namespace

TEST(CapiGpu, Fa2MatchesReference) {
  FB_SKIP_WITHOUT_GPU();
  expect_capi_matches_reference("fa2_q_outer", "default", awkward(64));
}

TEST(CapiGpu, Fa3MatchesReference) {
  FB_SKIP_WITHOUT_GPU();
  const AttentionProblem p = awkward(128);
  const Variant &fa3 = catalog().get("fa3_pipelined");
  if (const Support s = fa3.supports(p, fa3.space().default_config(), test::test_device()); !s)
    GTEST_SKIP() << "fa3_pipelined: " << s.reason;
  expect_capi_matches_reference(
      "fa3_pipelined",
      "block_m=128,block_n=128,stages=2,consumer_wgs=2,pingpong=on,intra_wg_overlap=on,"
      "scheduler=dynamic",
      p);
}

TEST(CapiGpu, UnsupportedConfigIsRefusedAtCreate) {
  FB_SKIP_WITHOUT_GPU();
  // Three consumer warpgroups at head_dim 128 (or any fa3 config off Hopper): refused with the variant's reason.
  const std::string problem_json = nlohmann::json(awkward(128)).dump();
  fb_capi_launcher *l =
      fb_capi_create("fa3_pipelined", "block_m=192,consumer_wgs=3", problem_json.c_str());
  EXPECT_EQ(l, nullptr);
  EXPECT_NE(std::string(fb_capi_last_error()).find("fa3_pipelined ["), std::string::npos)
      << fb_capi_last_error();
  fb_capi_destroy(l);
}

// The backward through the C API: each backward variant at its default config, on an awkward GQA causal shape, with
// O and LSE from the forward's CPU reference (O rounded to the dtype) as peers.py gives them, launched twice (the
// second finds the workspace as the first left it) and checked like a backward point (verify_backward).
namespace {

AttentionProblem awkward_backward() {
  AttentionProblem p = awkward(64);
  p.pass = Pass::bwd;
  validate(p);
  return p;
}

} // namespace

TEST(CapiGpu, BackwardVariantsMatchReference) {
  FB_SKIP_WITHOUT_GPU();
  const AttentionProblem p = awkward_backward();
  const std::string problem_json = nlohmann::json(p).dump();
  const size_t e = size_t(dtype_bytes(p.dtype));
  const uint64_t seed = std::random_device{}();
  test::BackwardCase in = test::make_backward_case(p, seed);
  DeviceBuffer &q = in.q, &k = in.k, &v = in.v, &dout = in.dout, &o = in.o, &lse = in.lse;
  const BackwardReference &ref = in.ref;

  int tested = 0;
  for (const auto &var : catalog().all()) {
    if (var->pass() != Pass::bwd || var->name().rfind("test_", 0) == 0)
      continue;
    fb_capi_launcher *l = fb_capi_create(var->name().c_str(), "default", problem_json.c_str());
    if (!l) { // a variant that does not run here (its arch) says why; any other refusal is a failure
      const std::string why = fb_capi_last_error();
      EXPECT_NE(why.find(var->name() + " ["), std::string::npos) << why;
      continue;
    }
    ++tested;
    DeviceBuffer dq(p.q_elems() * e), dk(p.kv_elems() * e), dv(p.kv_elems() * e);
    cudaStream_t stream = nullptr;
    FB_CUDA_CHECK(cudaStreamCreate(&stream));
    // A forward launch of a backward launcher is refused, and writes nothing.
    EXPECT_EQ(fb_capi_launch(l, q.get(), k.get(), v.get(), o.get(), lse.as<float>(), stream), -1);
    EXPECT_NE(std::string(fb_capi_last_error()).find("fb_capi_launch_backward"), std::string::npos)
        << fb_capi_last_error();
    for (int i = 0; i < 2; ++i) {
      for (DeviceBuffer *b : {&dq, &dk, &dv})
        poison(b->get(), b->bytes(), stream);
      ASSERT_EQ(fb_capi_launch_backward(l, q.get(), k.get(), v.get(), o.get(), lse.as<float>(),
                                        dout.get(), dq.get(), dk.get(), dv.get(), stream),
                0)
          << fb_capi_last_error();
    }
    FB_CUDA_CHECK(cudaStreamSynchronize(stream));
    FB_CUDA_CHECK(cudaStreamDestroy(stream));
    const VerifyResult r =
        verify_backward(p, download_as_float(dq.get(), p.dtype, p.q_elems()).data(),
                        download_as_float(dk.get(), p.dtype, p.kv_elems()).data(),
                        download_as_float(dv.get(), p.dtype, p.kv_elems()).data(), ref,
                        grad_tolerance_for(p.dtype));
    EXPECT_TRUE(r.pass) << var->name() << " [" << fb_capi_config_string(l) << "] on " << key(p)
                        << " (seed " << seed << "): " << r.summary();
    fb_capi_destroy(l);
  }
  if (!tested)
    GTEST_SKIP() << "no backward variant of the catalog runs here";
}

TEST(CapiGpu, ABackwardLaunchOfAForwardLauncherIsRefused) {
  FB_SKIP_WITHOUT_GPU();
  const std::string problem_json = nlohmann::json(awkward(64)).dump();
  fb_capi_launcher *l = fb_capi_create("fa2_q_outer", "default", problem_json.c_str());
  ASSERT_NE(l, nullptr) << fb_capi_last_error();
  int dummy = 0;
  void *x = &dummy; // never dereferenced: the launcher's pass is checked first
  EXPECT_EQ(
      fb_capi_launch_backward(l, x, x, x, x, reinterpret_cast<float *>(x), x, x, x, x, nullptr),
      -1);
  EXPECT_NE(std::string(fb_capi_last_error()).find("forward"), std::string::npos)
      << fb_capi_last_error();
  fb_capi_destroy(l);
}
