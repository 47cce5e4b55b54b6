// The fp32 GPU reference (used above the CPU reference's size limit) against the float64 CPU one.
#include "gpu_test_util.hpp"

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
