#include "flashbench/errors.hpp"
#include "flashbench/problem.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace fb;

namespace {
AttentionProblem make(int64_t sq, int64_t skv, bool causal) {
  AttentionProblem p;
  p.batch = 2;
  p.heads_q = 8;
  p.heads_kv = 2;
  p.seqlen_q = sq;
  p.seqlen_kv = skv;
  p.head_dim = 64;
  p.causal = causal;
  return p;
}

int64_t brute_pairs(const AttentionProblem &p) {
  int64_t n = 0;
  for (int64_t i = 0; i < p.seqlen_q; ++i)
    for (int64_t j = 0; j < p.seqlen_kv; ++j)
      n += j <= p.last_key(i);
  return n;
}
} // namespace

TEST(Problem, UnmaskedPairsMatchBruteForce) {
  for (int64_t sq : {1, 2, 7, 64, 131})
    for (int64_t skv : {1, 3, 64, 77, 300})
      for (bool causal : {false, true}) {
        const AttentionProblem p = make(sq, skv, causal);
        EXPECT_EQ(unmasked_pairs(p), brute_pairs(p)) << key(p);
      }
}

TEST(Problem, FlopsFollowFlashAttentionConvention) {
  AttentionProblem p = make(1024, 1024, false);
  EXPECT_DOUBLE_EQ(flops(p), 4.0 * 2 * 8 * 1024.0 * 1024.0 * 64);
  p.causal = true; // exactly the unmasked pairs: N(N+1)/2
  EXPECT_DOUBLE_EQ(flops(p), 4.0 * 2 * 8 * (1024.0 * 1025.0 / 2) * 64);
  // Causal with Sq > Skv: the first Sq-Skv rows see nothing.
  p = make(10, 4, true);
  EXPECT_EQ(unmasked_pairs(p), 1 + 2 + 3 + 4);
}

TEST(Problem, MinBytesCountEachTensorOnce) {
  AttentionProblem p = make(100, 300, false);
  p.dtype = DType::bf16;
  const double q = 2.0 * 8 * 100 * 64 * 2, kv = 2.0 * 2 * 300 * 64 * 2, lse = 2.0 * 8 * 100 * 4;
  EXPECT_DOUBLE_EQ(min_bytes(p), 2 * q + 2 * kv + lse);
}

TEST(Problem, StridesForBothLayouts) {
  AttentionProblem p = make(5, 7, false);
  Strides s = p.q_strides();
  EXPECT_EQ(s.batch, 5 * 8 * 64);
  EXPECT_EQ(s.seq, 8 * 64);
  EXPECT_EQ(s.head, 64);
  p.layout = Layout::bhsd;
  s = p.kv_strides();
  EXPECT_EQ(s.batch, 2 * 7 * 64);
  EXPECT_EQ(s.head, 7 * 64);
  EXPECT_EQ(s.seq, 64);
}

TEST(Problem, ValidateRejectsImpossibleShapes) {
  AttentionProblem p = make(0, 5, false);
  EXPECT_THROW(validate(p), UserError);
  p = make(5, 5, false);
  p.heads_q = 6;
  p.heads_kv = 4;
  try {
    validate(p);
    FAIL() << "heads_q % heads_kv != 0 accepted";
  } catch (const UserError &e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of heads_kv"), std::string::npos);
  }
  EXPECT_NO_THROW(validate(make(1, 1, true)));
}

TEST(Problem, JsonRoundTripAndKey) {
  AttentionProblem p = make(77, 131, true);
  p.dtype = DType::f16;
  p.layout = Layout::bhsd;
  nlohmann::json j = p;
  EXPECT_EQ(j.get<AttentionProblem>(), p);
  EXPECT_EQ(key(p), "b2_hq8_hkv2_sq77_skv131_d64_causal_fp16_bhsd");
  EXPECT_THROW(parse_dtype("int8"), UserError);
}

// ---- Per-entry KV lengths (kv_lens) and paged caches.
TEST(Problem, KvLensCountEachEntrysOwnLength) {
  AttentionProblem p = make(3, 300, true); // batch 2
  p.kv_lens = {300, 5};
  // Each entry against its own length, bottom-right: the entry of 5 keys with 3 queries sees 3 + 4 + 5.
  EXPECT_EQ(unmasked_pairs_total(p), unmasked_pairs(p, 300) + (3 + 4 + 5));
  EXPECT_EQ(unmasked_pairs(p, 300), brute_pairs(make(3, 300, true)));
  EXPECT_DOUBLE_EQ(flops(p), 4.0 * 8 * 64 * double(unmasked_pairs_total(p)));
  const double kv = 2.0 * 2 * (300 + 5) * 64 * 2; // K and V, bf16, 2 KV heads
  EXPECT_DOUBLE_EQ(kv_bytes(p), kv);
  EXPECT_DOUBLE_EQ(min_bytes(p), 2.0 * p.q_elems() * 2 + kv + 4.0 * p.lse_elems());
  EXPECT_EQ(p.last_key(0, 1), 0 + 5 - 3);
  // A zero-length entry contributes nothing; the empty list means every entry has seqlen_kv.
  p.kv_lens = {0, 0};
  EXPECT_EQ(unmasked_pairs_total(p), 0);
  EXPECT_DOUBLE_EQ(flops(p), 0.0);
  p.kv_lens.clear();
  EXPECT_EQ(unmasked_pairs_total(p), 2 * unmasked_pairs(p));
}

TEST(Problem, KvLensAndPagingAreValidatedKeyedAndSerialised) {
  AttentionProblem p = make(1, 1000, false);
  p.kv_lens = {1000};
  EXPECT_THROW(validate(p), UserError); // batch 2, one length
  p.kv_lens = {1000, 1001};
  EXPECT_THROW(validate(p), UserError); // over the capacity
  p.kv_lens = {1000, 0};
  EXPECT_NO_THROW(validate(p));
  p.page_size = 16;
  EXPECT_EQ(p.pages_per_seq(), 63);
  EXPECT_EQ(p.num_pages(), 126);
  EXPECT_EQ(p.kv_storage_elems(), 126 * 16 * 2 * 64);
  EXPECT_EQ(key(p), "b2_hq8_hkv2_sq1_skv1000_d64_bf16_kvl1000-0_page16");
  nlohmann::json j = p;
  EXPECT_EQ(j.get<AttentionProblem>(), p);
  p.layout = Layout::bhsd;
  EXPECT_THROW(validate(p), UserError); // pages are bshd
  // Uniform contiguous problems keep their old JSON and key.
  const AttentionProblem u = make(1, 1000, false);
  nlohmann::json ju = u;
  EXPECT_FALSE(ju.contains("kv_lens"));
  EXPECT_FALSE(ju.contains("page_size"));
  // Long batches get a compact key: sum and a hash.
  AttentionProblem big = make(1, 1000, false);
  big.batch = 12;
  big.kv_lens = random_kv_lens(12, 1000, 7);
  EXPECT_NE(key(big).find("_kvl"), std::string::npos);
  EXPECT_LT(key(big).size(), 70u);
}

TEST(Problem, RandomKvLensAreDeterministicAndInRange) {
  const auto a = random_kv_lens(64, 8192, 3), b = random_kv_lens(64, 8192, 3),
             c = random_kv_lens(64, 8192, 4);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (int64_t len : a) {
    EXPECT_GE(len, 1);
    EXPECT_LE(len, 8192);
  }
}

// ---- The backward pass (pass: bwd).
TEST(Problem, PassParsesPrintsAndRefusesUnknownNames) {
  EXPECT_EQ(parse_pass("fwd"), Pass::fwd);
  EXPECT_EQ(parse_pass("bwd"), Pass::bwd);
  EXPECT_EQ(parse_pass("backward"), Pass::bwd);
  EXPECT_STREQ(to_string(Pass::fwd), "fwd");
  EXPECT_STREQ(to_string(Pass::bwd), "bwd");
  try {
    parse_pass("both");
    FAIL() << "accepted 'both'";
  } catch (const UserError &e) {
    EXPECT_NE(std::string(e.what()).find("use fwd (forward) or bwd (backward)"), std::string::npos);
  }
  EXPECT_EQ(AttentionProblem{}.pass, Pass::fwd);
}

TEST(Problem, BackwardKeyAndJsonRoundTrip) {
  AttentionProblem p = make(77, 131, true);
  EXPECT_EQ(key(p), "b2_hq8_hkv2_sq77_skv131_d64_causal_bf16");
  p.pass = Pass::bwd;
  EXPECT_EQ(key(p), "b2_hq8_hkv2_sq77_skv131_d64_causal_bf16_bwd");
  nlohmann::json j = p;
  EXPECT_EQ(j.at("pass"), "bwd");
  EXPECT_EQ(j.get<AttentionProblem>(), p);
  AttentionProblem f = make(77, 131, true);
  EXPECT_EQ(nlohmann::json(f).at("pass"), "fwd");
  // A record written before the backward existed has no "pass": it reads as a forward problem.
  j.erase("pass");
  EXPECT_EQ(j.get<AttentionProblem>().pass, Pass::fwd);
  j["pass"] = "sideways";
  EXPECT_THROW(j.get<AttentionProblem>(), UserError);
}

TEST(Problem, BackwardFlopsAreTwoAndAHalfForwardsOverTheSamePairs) {
  for (bool causal : {false, true})
    for (auto [sq, skv] : {std::pair<int64_t, int64_t>{1024, 1024}, {100, 333}, {333, 100}}) {
      AttentionProblem p = make(sq, skv, causal);
      const double fwd = flops(p);
      EXPECT_DOUBLE_EQ(fwd, 4.0 * 8 * 64 * static_cast<double>(2 * brute_pairs(p)));
      p.pass = Pass::bwd;
      // Five GEMMs of 2 * pairs * d each (S recomputed, dV, dP, dQ, dK) against the forward's two.
      EXPECT_DOUBLE_EQ(flops(p), 5 * 2.0 * 8 * 64 * static_cast<double>(2 * brute_pairs(p)));
      EXPECT_DOUBLE_EQ(flops(p), 2.5 * fwd);
    }
}

TEST(Problem, BackwardMinBytesReadSixTensorsAndWriteThree) {
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    AttentionProblem p = make(100, 300, true);
    p.dtype = t;
    p.pass = Pass::bwd;
    const double e = dtype_bytes(t);
    const double q = 2.0 * 8 * 100 * 64 * e, kv = 2.0 * 2 * 300 * 64 * e, lse = 2.0 * 8 * 100 * 4;
    // Read: Q, K, V, O, dO, LSE; written: dQ, dK, dV. Causality changes nothing: every row is read.
    EXPECT_DOUBLE_EQ(min_bytes(p), (q + kv + kv + q + q + lse) + (q + kv + kv)) << to_string(t);
  }
}

TEST(Problem, BackwardRefusesWhatItCannotTakeInOneLine) {
  auto refused = [](AttentionProblem p, const std::string &what) {
    p.pass = Pass::bwd;
    try {
      validate(p);
      ADD_FAILURE() << key(p) << " accepted";
    } catch (const UserError &e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(what), std::string::npos) << m;
      EXPECT_NE(m.find("pass: bwd"), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  };
  AttentionProblem p = make(64, 64, true);
  p.dtype = DType::e4m3;
  refused(p, "use dtype bf16");
  p = make(1, 64, false);
  p.kv_lens = {3, 64};
  refused(p, "drop kv_lens");
  p = make(1, 64, false);
  p.page_size = 16;
  refused(p, "drop page_size");
  p = make(64, 64, false);
  p.layout = Layout::bhsd;
  refused(p, "use layout bshd");
  // The same problems are fine forward, and the dense bshd backward is fine in every other dtype.
  p.pass = Pass::fwd;
  EXPECT_NO_THROW(validate(p));
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    AttentionProblem b = make(7, 300, true);
    b.dtype = t;
    b.pass = Pass::bwd;
    EXPECT_NO_THROW(validate(b));
  }
}

TEST(Problem, QuantParsesKeysAndRoundTripsForE4m3Only) {
  EXPECT_EQ(parse_quant("block"), Quant::block);
  EXPECT_EQ(parse_quant("block_hadamard"), Quant::block_hadamard);
  EXPECT_STREQ(to_string(Quant::block_hadamard), "block_hadamard");
  EXPECT_THROW(parse_quant("hadamard"), UserError);
  AttentionProblem p = make(300, 300, true);
  p.head_dim = 128;
  p.dtype = DType::e4m3;
  EXPECT_EQ(key(p), "b2_hq8_hkv2_sq300_skv300_d128_causal_e4m3");
  EXPECT_EQ(nlohmann::json(p).at("quant"), "block"); // every e4m3 record names its quantization
  p.quant = Quant::block_hadamard;
  p.layout = Layout::bhsd;
  EXPECT_EQ(key(p), "b2_hq8_hkv2_sq300_skv300_d128_causal_e4m3_hadamard_bhsd");
  nlohmann::json j = p;
  EXPECT_EQ(j.at("quant"), "block_hadamard");
  EXPECT_EQ(j.get<AttentionProblem>(), p);
  j.erase("quant"); // records before the option: per-block, not rotated
  EXPECT_EQ(j.get<AttentionProblem>().quant, Quant::block);
  EXPECT_FALSE(nlohmann::json(make(64, 64, false)).contains("quant"));
}

TEST(Problem, QuantIsRefusedInOneLineWhereItCannotApply) {
  auto refused = [](const AttentionProblem &p, const std::string &what) {
    try {
      validate(p);
      ADD_FAILURE() << key(p) << " accepted";
    } catch (const UserError &e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(what), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  };
  AttentionProblem p = make(128, 128, false);
  p.quant = Quant::block_hadamard;
  refused(p, "quant block_hadamard quantizes e4m3 inputs, but dtype is bf16; use dtype e4m3");
  p.dtype = DType::e4m3;
  p.head_dim = 96;
  refused(p, "use one of those head_dims or quant block");
  for (int64_t d : {64, 128, 256}) {
    p.head_dim = d;
    EXPECT_NO_THROW(validate(p)) << d;
  }
}
