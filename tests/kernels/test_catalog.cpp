// Host logic of every variant (config spaces, supports, traffic models): testable without a GPU.
#include "flashbench/variant.hpp"

#include <gtest/gtest.h>

using namespace fb;

namespace {
AttentionProblem prob(int64_t n, int64_t d, bool causal) {
  AttentionProblem p;
  p.batch = 2;
  p.heads_q = 8;
  p.heads_kv = 8;
  p.seqlen_q = p.seqlen_kv = n;
  p.head_dim = d;
  p.causal = causal;
  return p;
}
} // namespace

TEST(Catalog, HoldsTheFoundationVariants) {
  EXPECT_NE(catalog().find("naive"), nullptr);
  EXPECT_NE(catalog().find("fa1_kv_outer"), nullptr);
}

TEST(Catalog, DefaultConfigsAreValidAndSupportedOnCommonShapes) {
  const DeviceInfo dev = nominal_device();
  for (const auto& v : catalog().all()) {
    EXPECT_FALSE(v->description().empty()) << v->name();
    const Config c = v->space().default_config();
    EXPECT_FALSE(v->space().check(c).has_value()) << v->name();
    for (int64_t d : {64, 128}) {
      const Support s = v->supports(prob(1024, d, true), c, dev);
      EXPECT_TRUE(s.ok) << v->name() << ": " << s.reason;
    }
  }
}

TEST(Catalog, TrafficModelsAreAtLeastTheMinimum) {
  const DeviceInfo dev = nominal_device();
  for (const auto& v : catalog().all())
    for (const auto& e : v->space().expand()) {
      if (e.invalid_reason) continue;
      for (bool causal : {false, true}) {
        const AttentionProblem p = prob(512, 64, causal);
        if (!v->supports(p, e.config, dev)) continue;
        EXPECT_GE(v->model_bytes(p, e.config), min_bytes(p) * 0.999) << v->name() << " " << v->space().to_string(e.config);
      }
    }
}

TEST(Catalog, QuadraticTrafficIsVisibleInTheModels) {
  // Naive writes S and P; FA1 re-reads Q and round-trips O/l/m once per K/V tile: both grow as N^2.
  for (const char* name : {"naive", "fa1_kv_outer"}) {
    const Variant& v = catalog().get(name);
    const Config c = v.space().default_config();
    const double small = v.model_bytes(prob(4096, 128, false), c);
    const double big = v.model_bytes(prob(8192, 128, false), c);
    EXPECT_GT(big / small, 3.0) << name;
  }
}

TEST(Catalog, NaiveSkipsProblemsWhoseScoresDoNotFit) {
  const Variant& v = catalog().get("naive");
  AttentionProblem p = prob(131072, 128, false);
  p.batch = 8;
  p.heads_q = p.heads_kv = 32;
  const Support s = v.supports(p, v.space().default_config(), nominal_device());
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("GB"), std::string::npos) << s.reason;
}

TEST(Catalog, UnsupportedHeadDimIsSkippedWithAReason) {
  const Variant& v = catalog().get("fa1_kv_outer");
  const Support s = v.supports(prob(128, 100, false), v.space().default_config(), nominal_device());
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("head_dim"), std::string::npos) << s.reason;
}
