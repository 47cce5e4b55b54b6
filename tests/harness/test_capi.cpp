// flashbench's C API (harness/capi/capi.cpp) without a GPU: every bad argument is a NULL launcher and one line that
// says what was wrong, nothing throws across the C boundary, and "auto" reports the dispatcher's choice.
#include "flashbench/capi.h"
#include "flashbench/tuner.hpp"
#include "flashbench/version.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

const char *kProblem =
    R"({"batch": 2, "heads_q": 4, "heads_kv": 2, "seqlen_q": 77, "seqlen_kv": 131,
                           "head_dim": 64, "causal": true, "dtype": "bf16", "layout": "bshd", "scale": 0.0})";

std::string create_error(const char *variant, const char *config, const char *problem) {
  fb_capi_launcher *l = fb_capi_create(variant, config, problem);
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
  EXPECT_NE(create_error("fa2_q_outer", "default", "{\"batch\": 1}").find("problem_json"),
            std::string::npos);
  EXPECT_NE(create_error("fa2_q_outer", "default", "not json").find("problem_json"),
            std::string::npos);
  const std::string e =
      create_error("fa2_q_outer", "default",
                   R"({"batch": 1, "heads_q": 3, "heads_kv": 2, "seqlen_q": 8, "seqlen_kv": 8,
                                         "head_dim": 64, "causal": false, "dtype": "bf16"})");
  EXPECT_NE(e.find("heads"), std::string::npos) << e; // heads_q not a multiple of heads_kv
}

TEST(Capi, BadConfigSaysWhichAxis) {
  EXPECT_NE(create_error("fa2_q_outer", "block_m=7", kProblem).find("block_m"), std::string::npos);
  EXPECT_NE(create_error("fa2_q_outer", "no_such_axis=1", kProblem).find("no_such_axis"),
            std::string::npos);
  EXPECT_NE(create_error("fa2_q_outer", "block_m", kProblem).find("name=value"), std::string::npos);
}

TEST(Capi, PagedProblemsAreRefused) {
  const std::string e =
      create_error("flash_decoding", "default",
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

// fb_capi_choose: what fb_capi_create would run, "auto" included, on the CPU (against the nominal H100 where there is
// no GPU). The tuning table is one this test writes, for this machine's GPU (or the nominal one).
namespace {

struct TableDir {
  std::filesystem::path dir;
  TableDir() {
    // A folder of its own for every instance: the tables read are cached per path for the process's life.
    static int count = 0;
    dir = std::filesystem::temp_directory_path() /
          ("fb_capi_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
    std::filesystem::create_directories(dir);
    ::setenv("FLASHBENCH_TUNING_DIR", dir.c_str(), 1);
  }
  ~TableDir() {
    ::unsetenv("FLASHBENCH_TUNING_DIR");
    std::filesystem::remove_all(dir);
  }
};

nlohmann::json choose(const char *variant, const char *config, const std::string &problem) {
  const char *out = fb_capi_choose(variant, config, problem.c_str());
  if (!out) {
    ADD_FAILURE() << variant << " / " << (config ? config : "NULL") << ": " << fb_capi_last_error();
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(out);
}

// The C API library reads the environment (FLASHBENCH_TUNING_DIR) once per process, into its own hidden copy of
// the harness, so a variable a test sets reaches it only in a process that has not used it yet: when this binary
// runs all its tests in one process (by hand rather than through ctest), an earlier test has. Such a test runs its
// body in a child process of this binary, with only that test selected; true in the parent, after checking the
// child's exit status (its output is shown on failure).
bool ran_in_child(const std::string &test) {
  if (std::getenv("FB_TEST_CHILD"))
    return false;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "FB_TEST_CHILD=1 '" + exe + "' --gtest_filter=" + test + " 2>&1";
  std::string out;
  if (FILE *f = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (fgets(buf, sizeof buf, f))
      out += buf;
    const int status = ::pclose(f);
    EXPECT_EQ(status, 0) << out;
  } else {
    ADD_FAILURE() << "could not run " << cmd;
  }
  return true;
}

} // namespace

TEST(Capi, AutoReportsTheTablesChoiceAndTheHeuristicElsewhere) {
  if (ran_in_child("Capi.AutoReportsTheTablesChoiceAndTheHeuristicElsewhere"))
    return;
  TableDir d;
  const fb::DeviceInfo dev = fb::device_count() > 0 ? fb::query_device(0) : fb::nominal_device();
  fb::AttentionProblem p;
  p.batch = 4, p.heads_q = 32, p.heads_kv = 8, p.seqlen_q = p.seqlen_kv = 4096, p.head_dim = 128,
  p.causal = true;
  const fb::Variant &fa2 = fb::catalog().get("fa2_q_outer");
  fb::TuningTable t;
  t.gpu = {{"name", dev.name}, {"slug", dev.slug()}};
  fb::TuningEntry e = fb::make_entry_key("fa2_q_outer", p);
  e.config =
      fa2.space().make({{"block_m", "64"}, {"block_n", "32"}, {"warps", "4"}, {"stages", "3"}});
  e.config_str = fa2.space().to_string(e.config);
  e.tflops = 123;
  e.source_hash = fb::variant_source_hashes().at("fa2_q_outer");
  t.upsert(e);
  fb::save_tuning_table((d.dir / (dev.slug() + ".json")).string(), t);
  const std::string pj = nlohmann::json(p).dump();

  // The table's only entry: auto takes it, and so does config "auto" of the named variant.
  nlohmann::json c = choose("auto", "", pj);
  EXPECT_EQ(c["variant"], "fa2_q_outer") << c;
  EXPECT_EQ(c["config"], e.config_str) << c;
  EXPECT_EQ(c["source"].get<std::string>().rfind("table", 0), 0u) << c;
  EXPECT_EQ(c["device"], dev.name);
  EXPECT_EQ(choose("fa2_q_outer", "auto", pj)["config"], e.config_str);
  // The named variant without a config: its default for the problem, not the table's.
  c = choose("fa2_q_outer", "", pj);
  EXPECT_EQ(c["config"], fa2.space().to_string(fa2.space().default_config(p, dev))) << c;
  EXPECT_EQ(c["source"], "the default for the problem");
  // A partial config takes the other axes from the default for the problem.
  c = choose("fa2_q_outer", "stages=1", pj);
  fb::Config want = fa2.space().default_config(p, dev);
  want.set("stages", 1);
  EXPECT_EQ(c["config"], fa2.space().to_string(want)) << c;

  // Nothing in the table for decode: the heuristic's flash_decoding.
  fb::AttentionProblem dec = p;
  dec.seqlen_q = 1;
  dec.causal = false;
  c = choose("auto", nullptr, nlohmann::json(dec).dump());
  EXPECT_EQ(c["variant"], "flash_decoding") << c;
  EXPECT_EQ(c["source"].get<std::string>().rfind("heuristic", 0), 0u) << c;
}

TEST(Capi, DefaultIsValidAtHeadDim256) {
  // fa3_pipelined's base default has block_n 128, which is not compiled at head_dim 256: "default" must take the
  // problem's own default (block_n 64) rather than refuse.
  const std::string pj =
      R"({"batch": 1, "heads_q": 8, "heads_kv": 8, "seqlen_q": 1024, "seqlen_kv": 1024,
                             "head_dim": 256, "causal": true, "dtype": "bf16"})";
  for (const char *config : {"", "default"}) {
    const nlohmann::json c = choose("fa3_pipelined", config, pj);
    EXPECT_NE(c.value("config", "").find("block_n=64"), std::string::npos) << c;
  }
}

TEST(Capi, AutoTakesNoConfig) {
  EXPECT_EQ(fb_capi_choose("auto", "block_m=64", kProblem), nullptr);
  EXPECT_NE(std::string(fb_capi_last_error()).find("auto"), std::string::npos)
      << fb_capi_last_error();
  EXPECT_NE(create_error("auto", "block_m=64", kProblem).find("auto"), std::string::npos);
  EXPECT_STREQ(fb_capi_variant(nullptr), "");
  EXPECT_STREQ(fb_capi_choice(nullptr), "");
}

// The backward through the C API: a launcher serves its problem's pass, and the arguments are checked as the
// forward's are.
namespace {

const char *kBwdProblem =
    R"({"batch": 2, "heads_q": 4, "heads_kv": 2, "seqlen_q": 77, "seqlen_kv": 131,
                              "head_dim": 64, "causal": true, "dtype": "bf16", "layout": "bshd", "pass": "bwd"})";

// A backward variant of the catalog, if it has one.
const fb::Variant *backward_variant() {
  for (const auto &v : fb::catalog().all())
    if (v->pass() == fb::Pass::bwd && v->name().rfind("test_", 0) != 0)
      return v.get();
  return nullptr;
}

} // namespace

TEST(Capi, BackwardLaunchRefusesNullArguments) {
  EXPECT_EQ(fb_capi_launch_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                    nullptr, nullptr, nullptr, nullptr),
            -1);
  const std::string e = fb_capi_last_error();
  EXPECT_NE(e.find("fb_capi_launch_backward"), std::string::npos) << e;
  EXPECT_NE(e.find("null"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(Capi, AForwardVariantRefusesABackwardProblemWithTheReason) {
  EXPECT_EQ(fb_capi_choose("fa2_q_outer", "", kBwdProblem), nullptr);
  const std::string e = fb_capi_last_error();
  EXPECT_NE(e.find("fa2_q_outer"), std::string::npos) << e;
  EXPECT_NE(e.find("forward pass"), std::string::npos) << e;
  EXPECT_NE(e.find("pass: bwd"), std::string::npos) << e;
}

TEST(Capi, ABackwardProblemMustBeDenseBshdOfAFloatType) {
  const std::string base =
      R"({"batch": 1, "heads_q": 2, "heads_kv": 2, "seqlen_q": 64, "seqlen_kv": 64,
                               "head_dim": 128, "causal": false, )";
  for (const std::string tail : {R"("dtype": "e4m3", "pass": "bwd"})",
                                 R"("dtype": "bf16", "layout": "bhsd", "pass": "bwd"})"}) {
    const std::string pj = base + tail;
    EXPECT_EQ(fb_capi_choose("auto", "", pj.c_str()), nullptr) << pj;
    const std::string e = fb_capi_last_error();
    EXPECT_NE(e.find("problem_json"), std::string::npos) << e;
    EXPECT_NE(e.find("backward"), std::string::npos) << e;
  }
  const std::string sideways = base + R"("dtype": "bf16", "pass": "sideways"})";
  EXPECT_EQ(fb_capi_choose("auto", "", sideways.c_str()), nullptr);
  EXPECT_NE(std::string(fb_capi_last_error()).find("sideways"), std::string::npos)
      << fb_capi_last_error();
}

TEST(Capi, ABackwardVariantServesBackwardProblemsOnly) {
  const fb::Variant *bwd = backward_variant();
  if (!bwd)
    GTEST_SKIP() << "no backward variant in this catalog";
  const nlohmann::json c = choose(bwd->name().c_str(), "", kBwdProblem);
  EXPECT_EQ(c.value("variant", ""), bwd->name()) << c;
  EXPECT_FALSE(c.value("config", "").empty()) << c;
  // "auto" on a backward problem picks a backward variant (the table's, else the heuristic's)
  const nlohmann::json a = choose("auto", "", kBwdProblem);
  const fb::Variant *chosen = fb::catalog().find(a.value("variant", ""));
  ASSERT_NE(chosen, nullptr) << a;
  EXPECT_EQ(chosen->pass(), fb::Pass::bwd) << a;
  EXPECT_EQ(fb_capi_choose(bwd->name().c_str(), "", kProblem), nullptr);
  EXPECT_NE(std::string(fb_capi_last_error()).find("backward pass"), std::string::npos)
      << fb_capi_last_error();
}

// The library names its own build, the one the harness stamps results with, so that a caller (scripts/peers.py)
// records the build it timed rather than its own checkout's HEAD.
TEST(Capi, BuildNamesTheLibrarysSourceAndOptions) {
  const nlohmann::json b = nlohmann::json::parse(fb_capi_build());
  EXPECT_EQ(b.at("source_sha").get<std::string>(), fb::git_sha());
  EXPECT_EQ(b.at("options").get<std::string>(), fb::build_options());
  EXPECT_EQ(b.at("toolkit").get<std::string>(), fb::toolkit());
  EXPECT_EQ(fb_capi_build(), fb_capi_build()); // static storage: the same pointer every call
}
