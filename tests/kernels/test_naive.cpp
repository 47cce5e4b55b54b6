// The naive variant (cuBLAS Q·Kᵀ, softmax kernel, cuBLAS P·V) against the float64 CPU reference.
#include "gpu_test_util.hpp"

using namespace fb;
using fb::test::Case;
using fb::test::Shape;

namespace {

class NaiveShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(NaiveShapes, MatchesCpuReference) {
  FB_SKIP_WITHOUT_GPU();
  const Variant &v = catalog().get("naive");
  Case c(GetParam().problem());
  for (const auto &e : v.space().expand())
    c.expect_pass(v, e.config);
}

INSTANTIATE_TEST_SUITE_P(Awkward, NaiveShapes, ::testing::ValuesIn(fb::test::awkward_shapes()),
                         fb::test::shape_name);

const std::vector<Shape> kExtraShapes = {
    // cuBLAS takes any head_dim; FA1 does not, so these live here.
    {"d72_causal", 1, 2, 2, 65, 65, 72, true, DType::bf16},
    {"d40_f32", 1, 2, 1, 33, 47, 40, false, DType::f32},
};
INSTANTIATE_TEST_SUITE_P(HeadDims, NaiveShapes, ::testing::ValuesIn(kExtraShapes),
                         fb::test::shape_name);

TEST(Naive, RepeatedLaunchesGiveTheSameResult) {
  FB_SKIP_WITHOUT_GPU();
  const Variant &v = catalog().get("naive");
  Case c(Shape{"rep", 1, 4, 2, 129, 257, 64, true, DType::bf16}.problem());
  c.expect_pass(v, v.space().default_config(), 3);
}

} // namespace
