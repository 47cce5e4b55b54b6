// The host side of `flashbench fp8-error` (fp8_error.hpp): the error statistics, the default problems, the outlier
// spec and a row's JSON. The experiment itself needs a GPU (docs/fp8.md).
#include "flashbench/errors.hpp"
#include "flashbench/fp8_error.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <vector>

using namespace fb;

TEST(Fp8Error, OutputErrorIsRmseMaxAndReferenceRms) {
  const std::vector<float> o = {1.f, 2.f, 3.f, 4.f};
  const std::vector<double> ref = {1.0, 2.5, 3.0, 2.0};
  const ErrorStats s = output_error(o.data(), ref.data(), 4);
  EXPECT_DOUBLE_EQ(s.rmse, std::sqrt((0.25 + 4.0) / 4));
  EXPECT_DOUBLE_EQ(s.max_abs, 2.0);
  EXPECT_DOUBLE_EQ(s.ref_rms, std::sqrt((1 + 6.25 + 9 + 4) / 4.0));
  const std::vector<float> bad = {1.f, std::numeric_limits<float>::quiet_NaN(), 3.f, 2.f};
  EXPECT_TRUE(std::isinf(output_error(bad.data(), ref.data(), 4).rmse));
}

TEST(Fp8Error, Bf16RoundingFloorIsZeroOnBf16ValuesAndHalfAnUlpAtMost) {
  const std::vector<double> exact = {1.0, -0.5, 3.0, 0.0};
  EXPECT_EQ(bf16_rounding_error(exact.data(), 4).max_abs, 0.0);
  const std::vector<double> between = {
      1.0 + 1.0 / 256}; // halfway between two bf16 values: ties to even, down
  EXPECT_DOUBLE_EQ(bf16_rounding_error(between.data(), 1).max_abs, 1.0 / 256);
  const std::vector<double> near = {1.0 + 3.0 / 512};
  EXPECT_DOUBLE_EQ(bf16_rounding_error(near.data(), 1).max_abs, 1.0 / 512); // rounds up to 1 + 2^-7
}

TEST(Fp8Error, DefaultProblemsCoverTheAskedShapes) {
  const auto v = default_fp8_error_problems();
  int d128 = 0, causal = 0;
  bool n2048 = false, n16384 = false, d64 = false, d256 = false, gqa = false;
  for (const auto &p : v) {
    EXPECT_EQ(p.dtype, DType::e4m3);
    EXPECT_EQ(p.quant, Quant::block);
    EXPECT_NO_THROW(validate(p)) << key(p);
    d128 += p.head_dim == 128;
    causal += p.causal;
    n2048 |= p.head_dim == 128 && p.seqlen_q == 2048;
    n16384 |= p.head_dim == 128 && p.seqlen_q == 16384;
    d64 |= p.head_dim == 64;
    d256 |= p.head_dim == 256;
    gqa |= p.heads_q != p.heads_kv;
  }
  EXPECT_GE(d128, 8);
  EXPECT_GE(causal, 4);
  EXPECT_TRUE(n2048 && n16384 && d64 && d256 && gqa);
}

TEST(Fp8Error, OutlierSpecIsCheckedAndRecorded) {
  OutlierSpec o;
  EXPECT_NO_THROW(validate(o));
  EXPECT_TRUE(o.in_v()); // the paper's distribution puts outliers in V too
  nlohmann::json j = to_json(o);
  EXPECT_EQ(j.at("kind"), "normal");
  EXPECT_EQ(j.at("scale"), 10.0);
  EXPECT_EQ(j.at("tensors").size(), 3u);
  o.kind = "uniform";
  EXPECT_FALSE(o.in_v());
  j = to_json(o);
  EXPECT_EQ(j.at("magnitude"), nlohmann::json({20.0, 100.0}));
  EXPECT_EQ(j.at("tensors"), nlohmann::json({"q", "k"}));
  o.kind = "cauchy";
  EXPECT_THROW(validate(o), UserError);
  o = OutlierSpec{};
  o.fraction = 1.5;
  EXPECT_THROW(validate(o), UserError);
  o = OutlierSpec{};
  o.lo = 50.f;
  o.hi = 20.f;
  EXPECT_THROW(validate(o), UserError);
}

TEST(Fp8Error, RowJsonCarriesRatiosAndTheRotationsShareOfTheAttention) {
  Fp8ErrorRow r;
  r.problem = default_fp8_error_problems().front();
  r.block = {0.02, 0.5, 0.2};
  r.hadamard = {0.008, 0.25, 0.2};
  r.quantize_qk_block_us = 40;
  r.quantize_qk_hadamard_us = 50;
  r.attention_block_us = 1000;
  r.attention_hadamard_us = 1001;
  const nlohmann::json j = to_json(r);
  EXPECT_DOUBLE_EQ(j.at("rmse_ratio").get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(j.at("max_abs_ratio").get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j.at("rotation_cost_pct").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j.at("quantize_qk_hadamard_pct").get<double>(), 5.0);
  EXPECT_EQ(j.at("problem").at("quant"), "block");
  EXPECT_NE(fp8_error_line(r).find("2.50"), std::string::npos) << fp8_error_line(r);
  Fp8ErrorRow s;
  s.problem = r.problem;
  s.status = "skipped";
  s.reason = "fa3_fp8 supports head_dim 128 only";
  const nlohmann::json k = to_json(s);
  EXPECT_EQ(k.at("reason"), s.reason);
  EXPECT_FALSE(k.contains("timing_us"));
  EXPECT_NE(fp8_error_line(s).find("skipped: fa3_fp8"), std::string::npos);
}

TEST(Fp8Error, DocumentSaysHowManyRowsOfThePlannedOnesItHolds) {
  // The command rewrites its file after each row: a run cut short leaves a document with its finished rows,
  // marked incomplete.
  Fp8ErrorOptions o;
  o.problems = default_fp8_error_problems();
  ASSERT_GE(o.problems.size(), 2u);
  const nlohmann::json context = {{"variant", o.variant}};
  Fp8ErrorRow r;
  r.problem = o.problems.front();
  nlohmann::json rows = nlohmann::json::array({to_json(r)});
  nlohmann::json doc = fp8_error_doc(o, context, rows, o.problems.size());
  EXPECT_EQ(doc.at("rows").size(), 1u);
  EXPECT_EQ(doc.at("rows_planned"), o.problems.size());
  EXPECT_FALSE(doc.at("complete").get<bool>());
  EXPECT_EQ(doc.at("context"), context);
  EXPECT_EQ(doc.at("outliers"), to_json(o.outliers));
  while (rows.size() < o.problems.size())
    rows.push_back(to_json(r));
  doc = fp8_error_doc(o, context, rows, o.problems.size());
  EXPECT_TRUE(doc.at("complete").get<bool>());
}
