// flashbench's C API (harness/capi/capi.cpp) without a GPU: every bad argument is a NULL launcher and one line that
// says what was wrong, and nothing throws across the C boundary.
#include "flashbench/capi.h"

#include <gtest/gtest.h>

#include <string>

namespace {

const char* kProblem = R"({"batch": 2, "heads_q": 4, "heads_kv": 2, "seqlen_q": 77, "seqlen_kv": 131,
                           "head_dim": 64, "causal": true, "dtype": "bf16", "layout": "bshd", "scale": 0.0})";

std::string create_error(const char* variant, const char* config, const char* problem) {
  fb_capi_launcher* l = fb_capi_create(variant, config, problem);
  EXPECT_EQ(l, nullptr);
  fb_capi_destroy(l);
  return fb_capi_last_error();
}

} // namespace

TEST(Capi, UnknownVariantNamesTheKnownOnes) {
  const std::string e = create_error("fa9", "default", kProblem);
  EXPECT_NE(e.find("fa9"), std::string::npos) << e;
  EXPECT_NE(e.find("fa2_q_outer"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(Capi, MalformedProblemSaysWhichField) {
  EXPECT_NE(create_error("fa2_q_outer", "default", "{\"batch\": 1}").find("problem_json"), std::string::npos);
  EXPECT_NE(create_error("fa2_q_outer", "default", "not json").find("problem_json"), std::string::npos);
  const std::string e = create_error("fa2_q_outer", "default",
                                     R"({"batch": 1, "heads_q": 3, "heads_kv": 2, "seqlen_q": 8, "seqlen_kv": 8,
                                         "head_dim": 64, "causal": false, "dtype": "bf16"})");
  EXPECT_NE(e.find("heads"), std::string::npos) << e; // heads_q not a multiple of heads_kv
}

TEST(Capi, BadConfigSaysWhichAxis) {
  EXPECT_NE(create_error("fa2_q_outer", "block_m=7", kProblem).find("block_m"), std::string::npos);
  EXPECT_NE(create_error("fa2_q_outer", "no_such_axis=1", kProblem).find("no_such_axis"), std::string::npos);
  EXPECT_NE(create_error("fa2_q_outer", "block_m", kProblem).find("name=value"), std::string::npos);
}

TEST(Capi, PagedProblemsAreRefused) {
  const std::string e = create_error("flash_decoding", "default",
                                     R"({"batch": 1, "heads_q": 8, "heads_kv": 1, "seqlen_q": 1, "seqlen_kv": 300,
                                         "head_dim": 128, "causal": false, "dtype": "bf16", "page_size": 64})");
  EXPECT_NE(e.find("paged"), std::string::npos) << e;
}

TEST(Capi, NullArgumentsAreErrorsNotCrashes) {
  EXPECT_NE(create_error(nullptr, "default", kProblem).find("required"), std::string::npos);
  EXPECT_EQ(fb_capi_launch(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), -1);
  EXPECT_NE(std::string(fb_capi_last_error()).find("null"), std::string::npos);
  EXPECT_STREQ(fb_capi_config_string(nullptr), "");
}
