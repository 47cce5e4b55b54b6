#include "flashbench/errors.hpp"
#include "flashbench/spec.hpp"

#include <gtest/gtest.h>

#include <regex>

using namespace fb;

namespace {
// Expects a UserError whose message matches `pattern` (a regex).
void expect_error(const std::string& yaml, const std::string& pattern) {
  try {
    const SweepSpec s = parse_spec(yaml, "t.yaml");
    plan(s, catalog(), nominal_device());
    FAIL() << "accepted:\n" << yaml;
  } catch (const UserError& e) {
    EXPECT_TRUE(std::regex_search(e.what(), std::regex(pattern))) << "message: " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "not one line: " << e.what();
  }
}
} // namespace

TEST(Spec, ExpandsAxesAndDerivedFields) {
  const SweepSpec s = parse_spec(R"(
name: t
timing: {min_samples: 5, timeout_s: 2}
problems:
  - {tokens: 16384, hidden: 2048, seqlen: [512, 1024], head_dim: [64, 128], causal: [false, true], dtype: bf16}
  - {batch: 1, heads_q: 8, gqa: 4, seqlen_q: 1, seqlen_kv: {pow2: [256, 1024]}, head_dim: 128}
variants: [naive]
)",
                                 "t.yaml");
  EXPECT_EQ(s.name, "t");
  EXPECT_EQ(s.timing.min_samples, 5);
  EXPECT_DOUBLE_EQ(s.timing.timeout_s, 2.0);
  ASSERT_EQ(s.problems.size(), 8u + 3u);
  const AttentionProblem& p = s.problems[0];
  EXPECT_EQ(p.batch, 32);   // 16384 / 512
  EXPECT_EQ(p.heads_q, 32); // 2048 / 64
  EXPECT_EQ(p.heads_kv, 32);
  const AttentionProblem& d = s.problems[8];
  EXPECT_EQ(d.heads_kv, 2);
  EXPECT_EQ(d.seqlen_kv, 256);
  EXPECT_EQ(s.problems[10].seqlen_kv, 1024);
}

TEST(Spec, RangesAndConstraints) {
  const SweepSpec s = parse_spec(R"(
problems:
  - heads: 2
    head_dim: 64
    seqlen_q: {range: [1, 5, 2]}
    seqlen_kv: [1, 3, 5]
    batch: 1
    constraints: ["seqlen_kv >= seqlen_q"]
variants: {naive: default}
)",
                                 "t.yaml");
  EXPECT_EQ(s.problems.size(), 6u); // (1,1)(1,3)(1,5)(3,3)(3,5)(5,5)
  for (const auto& p : s.problems) EXPECT_GE(p.seqlen_kv, p.seqlen_q);
}

TEST(Spec, PlanReportsSkipsWithReasonsNeverDrops) {
  const SweepSpec s = parse_spec(R"(
problems:
  - {batch: 1, heads: 2, seqlen: 128, head_dim: [64, 72]}
variants:
  fa1_kv_outer: {configs: all}
)",
                                 "t.yaml");
  const auto points = plan(s, catalog(), nominal_device());
  const Variant& v = catalog().get("fa1_kv_outer");
  EXPECT_EQ(points.size(), 2 * v.space().size());
  int skipped_72 = 0;
  for (const auto& pt : points)
    if (pt.problem.head_dim == 72) {
      // 72 is a multiple of 8, so FA1 may support it; any skip must carry a reason.
      if (pt.skip_reason) {
        ++skipped_72;
        EXPECT_FALSE(pt.skip_reason->empty());
      }
    }
  (void)skipped_72;
}

TEST(Spec, ErrorsNameFileLineAndWhatToDo) {
  expect_error("problems: [ {batch: 1\nvariants: [naive]\n", R"(^t\.yaml:\d+:\d+: malformed YAML)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64, colour: red}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: unknown problem field 'colour'; known fields: )");
  expect_error("problems:\n  - {batch: x, heads: 2, seqlen: 64, head_dim: 64}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: batch must be an integer, got 'x')");
  expect_error("problems:\n  - {batch: [], heads: 2, seqlen: 64, head_dim: 64}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: batch is an empty axis)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 0, head_dim: 64}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: impossible problem .*seqlen_q = 0 is impossible)");
  expect_error("problems:\n  - {batch: 1, heads_q: 6, heads_kv: 4, seqlen: 8, head_dim: 64}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: impossible problem .*not a multiple of heads_kv)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen_q: 8, seqlen_kv: 4, head_dim: 64,\n"
               "     constraints: ['seqlen_kv >= seqlen_q']}\nvariants: [naive]\n",
               R"(^t\.yaml:3:\d+: the constraints exclude every problem)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\nvariants: [warp_drive]\n",
               R"(^t\.yaml:3:\d+: unknown variant 'warp_drive'; known variants: .*naive)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\n"
               "variants:\n  fa1_kv_outer:\n    configs: [{block_q: 64}]\n",
               R"(^t\.yaml:4:\d+: fa1_kv_outer: unknown config parameter 'block_q')");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\nvariants: [naive]\nextra: 1\n",
               R"(^t\.yaml:4:1: unknown top-level field 'extra')");
  expect_error("timing: {min_samples: 0}\nproblems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\n"
               "variants: [naive]\n",
               R"(^t\.yaml:1:\d+: timing values out of range)");
}

TEST(Spec, ShippedSpecsParse) {
  for (const char* name : {"quick.yaml"}) {
    const std::string path = std::string(FLASHBENCH_SOURCE_DIR) + "/sweeps/" + name;
    const SweepSpec s = load_spec(path);
    EXPECT_FALSE(s.problems.empty()) << path;
    EXPECT_FALSE(plan(s, catalog(), nominal_device()).empty()) << path;
  }
}
