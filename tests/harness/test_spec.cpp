#include "flashbench/dispatch.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/spec.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <vector>

using namespace fb;

namespace {
// Expects a UserError whose message matches `pattern` (a regex).
void expect_error(const std::string &yaml, const std::string &pattern) {
  try {
    const SweepSpec s = parse_spec(yaml, "t.yaml");
    plan(s, catalog(), nominal_device());
    FAIL() << "accepted:\n" << yaml;
  } catch (const UserError &e) {
    EXPECT_TRUE(std::regex_search(e.what(), std::regex(pattern))) << "message: " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "not one line: " << e.what();
  }
}
} // namespace

TEST(Spec, ExpandsAxesAndDerivedFields) {
  const SweepSpec s = parse_spec(R"(
name: t
timing: {min_samples: 5, timeout_s: 2, flush: write, settle_s: 0.5, queue: back_to_back}
problems:
  - {tokens: 16384, hidden: 2048, seqlen: [512, 1024], head_dim: [64, 128], causal: [false, true], dtype: bf16}
  - {batch: 1, heads_q: 8, gqa: 4, seqlen_q: 1, seqlen_kv: {pow2: [256, 1024]}, head_dim: 128}
variants: [naive]
)",
                                 "t.yaml");
  EXPECT_EQ(s.name, "t");
  EXPECT_EQ(s.timing.min_samples, 5);
  EXPECT_DOUBLE_EQ(s.timing.timeout_s, 2.0);
  EXPECT_EQ(s.timing.flush, "write");
  EXPECT_DOUBLE_EQ(s.timing.settle_s, 0.5);
  EXPECT_EQ(s.timing.queue, "back_to_back");
  EXPECT_EQ(TimingPolicy{}.queue, "round_trip"); // the default keeps the history's method
  EXPECT_EQ(TimingPolicy{}.flush, "read"); // the default: clean L2 lines (timing.hpp says why)
  ASSERT_EQ(s.problems.size(), 8u + 3u);
  const AttentionProblem &p = s.problems[0];
  EXPECT_EQ(p.batch, 32);   // 16384 / 512
  EXPECT_EQ(p.heads_q, 32); // 2048 / 64
  EXPECT_EQ(p.heads_kv, 32);
  const AttentionProblem &d = s.problems[8];
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
  for (const auto &p : s.problems)
    EXPECT_GE(p.seqlen_kv, p.seqlen_q);
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
  const Variant &v = catalog().get("fa1_kv_outer");
  EXPECT_EQ(points.size(), 2 * v.space().size());
  int skipped_72 = 0;
  for (const auto &pt : points)
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
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64, colour: "
               "red}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: unknown problem field 'colour'; known fields: )");
  expect_error("problems:\n  - {batch: x, heads: 2, seqlen: 64, head_dim: 64}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: batch must be an integer, got 'x')");
  expect_error(
      "problems:\n  - {batch: [], heads: 2, seqlen: 64, head_dim: 64}\nvariants: [naive]\n",
      R"(^t\.yaml:2:\d+: batch is an empty axis)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 0, head_dim: 64}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: impossible problem .*seqlen_q = 0 is impossible)");
  expect_error("problems:\n  - {batch: 1, heads_q: 6, heads_kv: 4, seqlen: 8, head_dim: "
               "64}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: impossible problem .*not a multiple of heads_kv)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen_q: 8, seqlen_kv: 4, head_dim: 64,\n"
               "     constraints: ['seqlen_kv >= seqlen_q']}\nvariants: [naive]\n",
               R"(^t\.yaml:3:\d+: the constraints exclude every problem)");
  expect_error(
      "problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\nvariants: [warp_drive]\n",
      R"(^t\.yaml:3:\d+: unknown variant 'warp_drive'; known variants: .*naive)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\n"
               "variants:\n  fa1_kv_outer:\n    configs: [{block_q: 64}]\n",
               R"(^t\.yaml:4:\d+: fa1_kv_outer: unknown config parameter 'block_q')");
  expect_error(
      "problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\nvariants: [naive]\nextra: 1\n",
      R"(^t\.yaml:4:1: unknown top-level field 'extra')");
  expect_error(
      "timing: {min_samples: 0}\nproblems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\n"
      "variants: [naive]\n",
      R"(^t\.yaml:1:\d+: timing values out of range)");
  expect_error(
      "timing: {flush: erase}\nproblems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\n"
      "variants: [naive]\n",
      R"(^t\.yaml:1:\d+: timing.flush must be 'read' .* or 'write')");
  expect_error(
      "timing: {queue: fast}\nproblems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\n"
      "variants: [naive]\n",
      R"(^t\.yaml:1:\d+: timing.queue must be 'round_trip' .* or 'back_to_back')");
}

// Every spec shipped under sweeps/ (any depth) parses and plans, so a new spec is covered without
// listing it here.
TEST(Spec, ShippedSpecsParse) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(FLASHBENCH_SOURCE_DIR) / "sweeps";
  ASSERT_TRUE(fs::is_directory(root)) << root;
  std::vector<fs::path> specs;
  for (const auto &entry : fs::recursive_directory_iterator(root))
    if (entry.is_regular_file() && entry.path().extension() == ".yaml")
      specs.push_back(entry.path());
  std::sort(specs.begin(), specs.end());
  ASSERT_FALSE(specs.empty()) << "no .yaml spec found under " << root;
  // The fixed entry points stay at the top level: scripts/run.sh, scripts/nightly.sh and
  // scripts/bringup.sh name them.
  for (const char *name : {"quick.yaml", "nightly.yaml", "bringup.yaml"})
    EXPECT_TRUE(std::find(specs.begin(), specs.end(), root / name) != specs.end()) << name;
  for (const auto &path : specs) {
    SCOPED_TRACE(path.string());
    try {
      const SweepSpec s = load_spec(path.string());
      EXPECT_FALSE(s.problems.empty());
      EXPECT_FALSE(plan(s, catalog(), nominal_device()).empty());
    } catch (const UserError &e) {
      ADD_FAILURE() << e.what();
    }
  }
}

TEST(Spec, VariantLimitedToNamedEntries) {
  const SweepSpec s = parse_spec(R"(
problems:
  - {name: prefill, heads_q: 8, seqlen: [256, 512], head_dim: 64}
  - {name: decode, heads_q: 32, gqa: 4, seqlen_q: 1, seqlen_kv: 4096, head_dim: 128}
  - {name: both, heads_q: 8, seqlen: 256, head_dim: 64}
variants:
  naive: default
  flash_decoding: {configs: default, problems: [decode]}
)",
                                 "t.yaml");
  ASSERT_EQ(s.problems.size(),
            3u); // the 'both' entry repeats a prefill problem: kept once, with both names
  EXPECT_EQ(s.problem_entries[0], (std::set<std::string>{"prefill", "both"}));
  size_t naive = 0, fdec = 0;
  for (const auto &pt : plan(s, catalog(), nominal_device())) {
    if (pt.variant->name() == "naive")
      ++naive;
    if (pt.variant->name() == "flash_decoding") {
      ++fdec;
      EXPECT_EQ(pt.problem.seqlen_q, 1);
    }
  }
  EXPECT_EQ(naive, 3u);
  EXPECT_EQ(fdec, 1u);
  try {
    parse_spec("problems:\n  - {name: a, heads: 2, seqlen: 64, head_dim: 64}\nvariants:\n  naive: "
               "{problems: [b]}\n",
               "u.yaml");
    ADD_FAILURE() << "an unknown entry name must be refused";
  } catch (const UserError &e) {
    EXPECT_NE(std::string(e.what()).find("u.yaml:4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
}

TEST(Spec, KvLensAndPageSize) {
  const SweepSpec s = parse_spec(R"(
problems:
  - {heads_q: 32, gqa: 4, seqlen_q: 1, seqlen_kv: 8192, head_dim: 128, kv_lens: [1, 257, 0, 8191], page_size: [0, 16]}
  - {batch: 8, heads_q: 32, gqa: 4, seqlen_q: 1, seqlen_kv: 4096, head_dim: 128, kv_lens: {random: 5}}
  - {batch: 2, heads_q: 8, seqlen_q: 1, seqlen_kv: 64, head_dim: 64, kv_lens: random, constraints: ["page_size == 0"]}
variants: [naive]
)",
                                 "t.yaml");
  ASSERT_EQ(s.problems.size(), 4u);
  EXPECT_EQ(s.problems[0].batch, 4); // kv_lens sets batch
  EXPECT_EQ(s.problems[0].kv_lens, (std::vector<int64_t>{1, 257, 0, 8191}));
  EXPECT_EQ(s.problems[0].page_size, 0);
  EXPECT_EQ(s.problems[1].page_size, 16);
  EXPECT_EQ(s.problems[2].kv_lens, random_kv_lens(8, 4096, 5));
  EXPECT_EQ(s.problems[3].kv_lens, random_kv_lens(2, 64, 0));
  // naive cannot take them: skipped with a reason, never dropped.
  for (const auto &pt : plan(s, catalog(), nominal_device())) {
    ASSERT_TRUE(pt.skip_reason.has_value());
    EXPECT_NE(pt.skip_reason->find("decode variant"), std::string::npos) << *pt.skip_reason;
  }
}

TEST(Spec, KvLensErrors) {
  expect_error("problems:\n  - {batch: 2, heads: 8, seqlen_q: 1, seqlen_kv: 64, head_dim: 64, "
               "kv_lens: [1, 2, 3]}\n"
               "variants: [naive]\n",
               "t.yaml:2:.*kv_lens has 3 entries but batch = 2");
  expect_error("problems:\n  - {heads: 8, seqlen_q: 1, seqlen_kv: 64, head_dim: 64, kv_lens: [1, "
               "65]}\nvariants: [naive]\n",
               "t.yaml:2:.*outside \\[0, seqlen_kv = 64\\]");
  expect_error("problems:\n  - {heads: 8, seqlen_q: 1, seqlen_kv: 64, head_dim: 64, kv_lens: "
               "sometimes}\nvariants: [naive]\n",
               "t.yaml:2:.*kv_lens must be a list");
  expect_error("problems:\n  - {heads: 8, seqlen: 64, head_dim: 64, page_size: 16, layout: "
               "bhsd}\nvariants: [naive]\n",
               "t.yaml:2:.*layout bshd");
}

TEST(Spec, ModelPresetsAndOverrides) {
  const SweepSpec s = parse_spec(R"(
problems:
  - {preset: llama3-8b-prefill}
  - {preset: llama3-70b-prefill, seqlen: 4096, dtype: fp16}
  - {preset: llama3-70b-decode, batch: 8, seqlen_kv: 8192}
variants: [naive]
)",
                                 "t.yaml");
  ASSERT_EQ(s.problems.size(), 4u + 1u + 1u);
  for (size_t i = 0; i < 4; ++i) {
    const AttentionProblem &p = s.problems[i];
    EXPECT_EQ(p.heads_q, 32);
    EXPECT_EQ(p.heads_kv, 8);
    EXPECT_EQ(p.head_dim, 128);
    EXPECT_TRUE(p.causal);
    EXPECT_EQ(p.batch * p.seqlen_q, 16384);
  }
  const AttentionProblem &big = s.problems[4];
  EXPECT_EQ(big.heads_q, 64);
  EXPECT_EQ(big.heads_kv, 8);
  EXPECT_EQ(big.seqlen_q, 4096);
  EXPECT_EQ(big.dtype, DType::f16);
  const AttentionProblem &dec = s.problems[5];
  EXPECT_EQ(dec.batch, 8);
  EXPECT_EQ(dec.seqlen_q, 1); // seqlen_kv replaces only the preset's seqlen_kv
  EXPECT_EQ(dec.seqlen_kv, 8192);
  EXPECT_EQ(dec.heads_q, 64);
  EXPECT_EQ(dec.heads_kv, 8);
}

TEST(Spec, NewFieldsKeepFileLineErrors) {
  // Unknown preset, a preset field made impossible by an override (points at the preset line), configs: tuned
  // accepted but a typo refused, and the point deadline checked against the sampling timeout.
  expect_error(
      "problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64}\n  - {preset: "
      "llama9-prefill}\n"
      "variants: [naive]\n",
      R"(^t\.yaml:3:\d+: unknown preset 'llama9-prefill'; known presets: llama3-8b-prefill)");
  expect_error("problems:\n  - preset: llama3-8b-prefill\n    heads_q: 30\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: gqa = 4 must divide heads_q = 30)");
  expect_error("problems:\n  - {preset: [a, b]}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: preset must be a name)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 8, head_dim: 64}\nvariants:\n  naive: "
               "{configs: tunned}\n",
               R"(^t\.yaml:4:\d+: configs must be 'all', 'default', 'tuned')");
  expect_error("timing: {timeout_s: 30, point_timeout_s: 20}\nproblems:\n  - {batch: 1, heads: 2, "
               "seqlen: 8, "
               "head_dim: 64}\nvariants: [naive]\n",
               R"(^t\.yaml:1:\d+: timing.point_timeout_s .* must exceed timeout_s)");
  expect_error("timing: {point_timeout_s: soon}\nproblems:\n  - {batch: 1, heads: 2, seqlen: 8, "
               "head_dim: 64}\n"
               "variants: [naive]\n",
               R"(^t\.yaml:1:\d+: point_timeout_s must be a number, got 'soon')");
  const SweepSpec s =
      parse_spec("timing: {point_timeout_s: 30}\nproblems:\n  - {batch: 1, heads: 2, seqlen: 8, "
                 "head_dim: 64}\nvariants:\n  fa1_kv_outer: {configs: tuned}\n",
                 "t.yaml");
  EXPECT_DOUBLE_EQ(s.timing.point_timeout_s, 30.0);
  ASSERT_EQ(s.variants.size(), 1u);
  EXPECT_EQ(s.variants[0].mode, VariantSelection::Mode::tuned);
}

namespace {
// A variant of either pass that supports everything of its own, for the plan's pass rule.
class PassProbe : public Variant {
public:
  PassProbe(std::string name, Pass pass)
      : name_(std::move(name)), pass_(pass),
        space_({Axis{"block_m", {64, 128}, {}, ""}}, Config({{"block_m", 64}})) {}
  std::string name() const override { return name_; }
  std::string description() const override { return "pass probe"; }
  const ConfigSpace &space() const override { return space_; }
  Pass pass() const override { return pass_; }
  Support supports(const AttentionProblem &, const Config &, const DeviceInfo &) const override {
    return Support::yes();
  }
  double model_bytes(const AttentionProblem &p, const Config &) const override {
    return min_bytes(p);
  }
  void launch(const AttentionProblem &, const Config &, const LaunchArgs &,
              cudaStream_t) const override {}

private:
  std::string name_;
  Pass pass_;
  ConfigSpace space_;
};
} // namespace

TEST(Spec, PassIsAProblemAxis) {
  const SweepSpec s = parse_spec(R"(
problems:
  - {batch: 2, heads: 4, seqlen: 128, head_dim: 64, causal: true, pass: [fwd, bwd]}
  - {batch: 1, heads: 4, seqlen: 64, head_dim: 64, pass: bwd}
  - {batch: 1, heads: 4, seqlen: 64, head_dim: 64}
  - {preset: llama3-8b-prefill, seqlen: 1024, pass: bwd}
variants: [naive]
)",
                                 "t.yaml");
  ASSERT_EQ(s.problems.size(), 5u);
  EXPECT_EQ(s.problems[0].pass, Pass::fwd);
  EXPECT_EQ(s.problems[1].pass, Pass::bwd);
  EXPECT_EQ(s.problems[2].pass, Pass::bwd);
  EXPECT_EQ(s.problems[3].pass, Pass::fwd); // absent: the forward
  EXPECT_EQ(s.problems[4].pass, Pass::bwd); // a preset keeps its shape and takes the pass
  EXPECT_EQ(s.problems[4].heads_q, 32);
  EXPECT_EQ(s.problems[4].heads_kv, 8);
  EXPECT_EQ(key(s.problems[1]), "b2_hq4_hkv4_sq128_skv128_d64_causal_bf16_bwd");
}

TEST(Spec, PassErrorsNameFileLineAndWhatToDo) {
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64, pass: sideways}\n"
               "variants: [naive]\n",
               R"(^t\.yaml:2:\d+: unknown pass 'sideways'; use fwd \(forward\) or bwd)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64, pass: bwd, "
               "dtype: e4m3}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: impossible problem .*_e4m3_bwd: the backward \(pass: bwd\) .*)"
               R"(use dtype bf16$)");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64, pass: bwd, "
               "layout: bhsd}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: impossible problem .*: .*use layout bshd$)");
}

TEST(Spec, PlanSkipsAVariantOfTheOtherPassWithAReason) {
  Registry reg;
  reg.add(std::make_unique<PassProbe>("probe_fwd", Pass::fwd));
  reg.add(std::make_unique<PassProbe>("probe_bwd", Pass::bwd));
  const SweepSpec s = parse_spec(R"(
problems:
  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64, pass: [fwd, bwd]}
variants:
  probe_fwd: {configs: all}
  probe_bwd: default
)",
                                 "t.yaml");
  const auto points = plan(s, reg, nominal_device());
  ASSERT_EQ(points.size(), 2u * 2 + 2); // every point is kept: none silently dropped
  int ran = 0;
  for (const auto &pt : points) {
    const bool same = pt.variant->pass() == pt.problem.pass;
    EXPECT_EQ(pt.skip_reason.has_value(), !same) << pt.variant->name() << " " << key(pt.problem);
    if (same) {
      ++ran;
      continue;
    }
    ASSERT_TRUE(pt.skip_reason);
    if (pt.variant->name() == "probe_fwd")
      EXPECT_EQ(*pt.skip_reason,
                "probe_fwd computes the forward pass; this point is a backward (pass: bwd)");
    else
      EXPECT_EQ(*pt.skip_reason,
                "probe_bwd computes the backward pass; this point is a forward (pass: fwd)");
  }
  EXPECT_EQ(ran, 3);
  // The one rule every caller asks (plan, tuner, dispatcher, check, C API).
  AttentionProblem p;
  p.pass = Pass::bwd;
  EXPECT_FALSE(support_for(*reg.find("probe_fwd"), p, Config({{"block_m", 64}}), nominal_device()));
  EXPECT_TRUE(support_for(*reg.find("probe_bwd"), p, Config({{"block_m", 64}}), nominal_device()));
}

TEST(Spec, CatalogForwardVariantsSkipBackwardPoints) {
  const SweepSpec s = parse_spec(R"(
problems:
  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64, pass: bwd}
variants: [naive, fa2_q_outer]
)",
                                 "t.yaml");
  for (const auto &pt : plan(s, catalog(), nominal_device())) {
    ASSERT_TRUE(pt.skip_reason) << pt.variant->name();
    EXPECT_EQ(*pt.skip_reason,
              pt.variant->name() +
                  " computes the forward pass; this point is a backward (pass: bwd)");
  }
}

TEST(Spec, QuantIsAnE4m3ProblemAxis) {
  const SweepSpec s = parse_spec(R"(
problems:
  - {batch: 1, heads: 4, seqlen: 256, head_dim: 128, dtype: e4m3, quant: [block, block_hadamard]}
  - {batch: 1, heads: 4, seqlen: 256, head_dim: 128, dtype: e4m3}
variants: [fa3_fp8]
)",
                                 "t.yaml");
  ASSERT_EQ(s.problems.size(), 2u); // the second entry is the first's block problem again
  EXPECT_EQ(s.problems[0].quant, Quant::block);
  EXPECT_EQ(s.problems[1].quant, Quant::block_hadamard);
  EXPECT_EQ(key(s.problems[1]), "b1_hq4_hkv4_sq256_skv256_d128_e4m3_hadamard");
  expect_error("problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64, quant: rotated, "
               "dtype: e4m3}\nvariants: [naive]\n",
               R"(^t\.yaml:2:\d+: unknown quant 'rotated'; use block .* or block_hadamard .*)");
  expect_error(
      "problems:\n  - {batch: 1, heads: 2, seqlen: 64, head_dim: 64, "
      "quant: block_hadamard}\nvariants: [naive]\n",
      R"(^t\.yaml:2:\d+: impossible problem .*_bf16_hadamard: quant block_hadamard quantizes e4m3 )"
      R"(inputs, but dtype is bf16; use dtype e4m3 or drop quant$)");
}

// A config map's unnamed axes come from each problem's default (as the C API's config strings), falling back to the
// variant's base default where the problem's default does not combine with the named axes.
TEST(Spec, ConfigMapsCompleteFromEachProblemsDefault) {
  const DeviceInfo dev = nominal_device();
  const Variant &bwd = catalog().get("fa2_bwd");
  AttentionProblem p;
  p.batch = 1, p.heads_q = p.heads_kv = 4, p.seqlen_q = p.seqlen_kv = 512, p.head_dim = 128;
  p.pass = Pass::bwd;
  std::string source;
  EXPECT_EQ(complete_config(bwd, {}, p, dev, &source), bwd.space().default_config(p, dev));
  EXPECT_NE(source.find("default for the problem"), std::string::npos) << source;
  AttentionProblem d64 = p;
  d64.head_dim = 64;
  // dq_layout m4 is compiled for d64's default tile only: a map naming another tile keeps dq_layout same.
  EXPECT_EQ(bwd.space().default_config(d64, dev).get("dq_layout"), 4);
  const Config other = complete_config(bwd, {{"block_m", "64"}}, d64, dev, &source);
  EXPECT_EQ(other.get("block_m"), 64);
  EXPECT_EQ(other.get("dq_layout"), 0);
  EXPECT_TRUE(support_for(bwd, d64, other, dev)) << support_for(bwd, d64, other, dev).reason;
  EXPECT_NE(source.find("base default"), std::string::npos) << source;
  const Config det = complete_config(bwd, {{"deterministic", "on"}}, d64, dev);
  EXPECT_EQ(det.get("block_m"), 128);
  EXPECT_EQ(det.get("dq_layout"), 4);
  EXPECT_EQ(det.get("deterministic"), 1);
  EXPECT_THROW(complete_config(bwd, {{"no_such_axis", "1"}}, p, dev), UserError);
  // The problem's rule sees the named axes: deterministic on, non-causal, on a device whose SMs hold a head's
  // column blocks, takes row_order rotated; causal, or deterministic off, keeps same. A named value still wins.
  DeviceInfo gpu = dev;
  gpu.present = true, gpu.sm_count = 132;
  EXPECT_EQ(complete_config(bwd, {{"deterministic", "on"}}, p, gpu).get("row_order"), 1);
  EXPECT_EQ(complete_config(bwd, {}, p, gpu).get("row_order"), 0);
  EXPECT_EQ(complete_config(bwd, {{"deterministic", "on"}, {"row_order", "same"}}, p, gpu)
                .get("row_order"),
            0);
  AttentionProblem causal = p;
  causal.causal = true;
  EXPECT_EQ(complete_config(bwd, {{"deterministic", "on"}}, causal, gpu).get("row_order"), 0);
  AttentionProblem longkv = p;
  longkv.seqlen_kv = 32768; // 256 column blocks: more than the SMs
  const Config lk = complete_config(bwd, {{"deterministic", "on"}}, longkv, gpu);
  EXPECT_EQ(lk.get("row_order"), 0);
  EXPECT_TRUE(support_for(bwd, longkv, lk, gpu)) << support_for(bwd, longkv, lk, gpu).reason;

  // The plan: one map, a config per problem.
  const SweepSpec s = parse_spec(R"(
problems:
  - {batch: 1, heads: 4, seqlen: 512, head_dim: [64, 128], pass: bwd}
variants:
  fa2_bwd:
    configs:
      - {}
      - {deterministic: on}
)",
                                 "t.yaml");
  std::map<int64_t, std::set<std::string>> by_d;
  for (const auto &pt : plan(s, catalog(), dev)) {
    EXPECT_FALSE(pt.skip_reason) << (pt.skip_reason ? *pt.skip_reason : "");
    by_d[pt.problem.head_dim].insert(bwd.space().to_string(pt.config));
  }
  EXPECT_TRUE(by_d[64].count(bwd.space().to_string(bwd.space().default_config(d64, dev))));
  EXPECT_TRUE(by_d[128].count(bwd.space().to_string(bwd.space().default_config(p, dev))));
  EXPECT_EQ(by_d[64].size(), 2u);
  EXPECT_EQ(by_d[128].size(), 2u);
}
