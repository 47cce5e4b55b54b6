// flashbench::attention_forward on the GPU: whatever the dispatcher picks (a tuning table when this GPU has one,
// else the heuristic) must compute attention, on shapes that steer it to different variants.
#include "flashbench/dispatch.hpp"
#include "gpu_test_util.hpp"

namespace fb::test {
namespace {

TEST(Dispatch, AttentionForwardMatchesTheReference) {
  FB_SKIP_WITHOUT_GPU();
  const Shape shapes[] = {
      {"prefill_bf16_causal", 2, 8, 2, 300, 300, 128, true, DType::bf16},
      {"prefill_f16", 1, 4, 4, 200, 257, 64, false, DType::f16},
      {"decode", 4, 8, 2, 1, 1000, 128, false, DType::bf16},
      {"fp32", 1, 2, 2, 77, 131, 64, true, DType::f32},
  };
  for (const Shape& s : shapes)
    for (const char* variant : {"auto", "naive"}) {
      const AttentionProblem p = s.problem();
      Case c(p);
      const KernelChoice choice = choose_kernel(p, test_device(), variant);
      DeviceBuffer o(size_t(p.q_elems() * dtype_bytes(p.dtype))), lse(size_t(p.lse_elems()) * sizeof(float));
      poison(o.get(), o.bytes(), nullptr);
      poison(lse.get(), lse.bytes(), nullptr);
      flashbench::attention_forward(p, c.q(), c.k(), c.v(), o.get(), lse.as<float>(), nullptr, variant);
      FB_CUDA_CHECK(cudaDeviceSynchronize());
      const VerifyResult r = c.verify_against_reference(download_as_float(o.get(), p.dtype, p.q_elems()),
                                                        download_as_float(lse.get(), DType::f32, p.lse_elems()),
                                                        tolerance_for(p.dtype));
      EXPECT_TRUE(r.pass) << s.name << " via " << choice.variant->name() << " ["
                          << choice.variant->space().to_string(choice.config) << "] (" << choice.source
                          << "): " << r.summary();
    }
}

} // namespace
} // namespace fb::test
