// fa3_fp8 (e4m3, Hopper sm_90a) against the float64 CPU reference on the dequantized inputs. GPU tests skip
// without a device and on any device other than compute capability 9.0; the host tests (supports() reasons) run
// everywhere. Head_dim 64, 128 and 256; the shared-memory layouts of 64 and 128 also have a byte-level model
// without a GPU (tests/kernels/fa3_fp8/layout_model.py, CTest fa3_fp8_layout_model).
//  - Fa3Fp8Shapes: every valid config (block_n x stages 2-4 x intra_wg_overlap x pingpong x q_in_regs x
//    scheduler x o_store) on awkward shapes: length 1, lengths that are multiples of no tile,
//    causal with seqlen_q > seqlen_kv (rows that see no key: O = 0, LSE = -inf, not NaN) and < seqlen_kv, GQA,
//    MQA, bhsd, and shapes long enough to wrap the K/V, raw-V and V^T rings several times; and shapes with more
//    work items than an H100 has SMs, so that the persistent grid's CTAs take 2-3 items each (rings and Q buffers
//    carried from item to item, items with no key among them); and inputs rotated before quantization
//    (quant: block_hadamard).
//  - WrongBlockDescaleFails: the same kernel with one K block's descale doubled after the reference was taken
//    must fail verification, so the check sees a kernel that applies the wrong block's (or one per-tensor) scale.
#include "gpu_test_util.hpp"
#include "kernels/fa3_fp8/traits.hpp"

#include <algorithm>
#include <vector>

using namespace fb;
using fb::test::Case;
using fb::test::Shape;

namespace {

const Variant &fp8() { return catalog().get("fa3_fp8"); }

Shape rotated(Shape s, Layout layout = Layout::bshd) {
  s.quant = Quant::block_hadamard;
  s.layout = layout;
  return s;
}

std::vector<Shape> fp8_shapes() {
  using enum DType;
  return {
      {"len1", 1, 2, 2, 1, 1, 128, false, e4m3},
      {"len1_causal", 1, 2, 2, 1, 1, 128, true, e4m3},
      {"q77_kv131", 1, 2, 2, 77, 131, 128, false, e4m3},
      {"q131_kv77", 2, 2, 2, 131, 77, 128, false, e4m3},
      {"causal_q131_kv77", 1, 2, 2, 131, 77, 128, true, e4m3}, // 54 rows see no key
      {"causal_q77_kv131", 1, 2, 2, 77, 131, 128, true, e4m3},
      {"causal_q40_kv1", 1, 1, 1, 40, 1, 128, true, e4m3},
      {"decode_q1_kv300", 2, 4, 4, 1, 300, 128, true, e4m3},
      {"gqa_8_2", 2, 8, 2, 100, 100, 128, true, e4m3},
      {"mqa_8_1", 1, 8, 1, 64, 200, 128, false, e4m3},
      {"bhsd_gqa", 2, 4, 2, 50, 70, 128, true, e4m3, {}, 0, Layout::bhsd},
      // Rings wrapped many times (11 K/V tiles over 2-4 stages), several Q tiles and descale blocks per head.
      {"long_1300", 1, 4, 2, 300, 1300, 128, false, e4m3},
      {"long_causal_1111", 2, 4, 1, 1111, 1111, 128, true, e4m3},
      {"long_causal_q500_kv1400", 1, 2, 2, 500, 1400, 128, true, e4m3, {}, 0, Layout::bhsd},
      // 320 and 384 work items (Q tiles x heads x batch) over at most 132 persistent CTAs; in the second, the
      // first three Q tiles of every head see no key (causal, seqlen_q - seqlen_kv = 400).
      {"items320_causal", 4, 16, 4, 600, 700, 128, true, e4m3},
      {"items384_causal_q700_kv300", 2, 32, 8, 700, 300, 128, true, e4m3},
      // Q and K rotated by one random-sign Hadamard matrix before quantization (quant: block_hadamard): other
      // codes, the same kernel; the reference reads the dequantized rotated values.
      rotated({"hadamard_gqa_8_2", 2, 8, 2, 100, 100, 128, true, e4m3}),
      rotated({"hadamard_long_causal_q500_kv1400", 1, 2, 2, 500, 1400, 128, true, e4m3},
              Layout::bhsd),
      // head_dim 256 (block_n 64: two tiles a K descale block; two column halves a row): odd lengths, rows that
      // see no key, GQA, rings wrapped, several items a persistent CTA, and rotated.
      {"d256_q77_kv131", 1, 2, 2, 77, 131, 256, false, e4m3},
      {"d256_causal_q131_kv77", 1, 2, 2, 131, 77, 256, true, e4m3},
      {"d256_len1", 1, 2, 2, 1, 1, 256, false, e4m3},
      {"d256_gqa_long_causal", 2, 8, 2, 300, 1111, 256, true, e4m3, {}, 0, Layout::bhsd},
      {"d256_items320_causal", 4, 16, 4, 600, 700, 256, true, e4m3},
      rotated({"d256_hadamard_gqa", 2, 8, 2, 100, 300, 256, true, e4m3}),
      // head_dim 64 (64-byte rows under the 64B swizzle, V^T [64][128 keys], P V m64n64k32): length 1, odd lengths,
      // causal with seqlen_q above and below seqlen_kv (rows that see no key), GQA and MQA, bhsd with the rings
      // wrapped, several items a persistent CTA, and rotated.
      {"d64_len1", 1, 2, 2, 1, 1, 64, false, e4m3},
      {"d64_q77_kv131", 1, 2, 2, 77, 131, 64, false, e4m3},
      {"d64_causal_q131_kv77", 1, 2, 2, 131, 77, 64, true, e4m3},
      {"d64_causal_q77_kv131", 1, 2, 2, 77, 131, 64, true, e4m3},
      {"d64_mqa_8_1", 1, 8, 1, 64, 200, 64, false, e4m3},
      {"d64_gqa_long_causal", 2, 8, 2, 300, 1111, 64, true, e4m3, {}, 0, Layout::bhsd},
      {"d64_items320_causal", 4, 16, 4, 600, 700, 64, true, e4m3},
      rotated({"d64_hadamard_gqa", 2, 8, 2, 100, 300, 64, true, e4m3}),
  };
}

class Fa3Fp8Shapes : public ::testing::TestWithParam<Shape> {};

TEST_P(Fa3Fp8Shapes, EveryConfigMatchesReference) {
  FB_SKIP_WITHOUT_HOPPER();
  const AttentionProblem prob = GetParam().problem();
  Case cs(prob);
  const int hd = int(prob.head_dim);
  for (const auto &e : fp8().space().expand()) {
    if (e.invalid_reason)
      continue;
    // The configs compiled for this head_dim that fit Hopper's shared memory (register.cpp's other refusals).
    const fa3fp8::Params prm = fa3fp8::params_of(e.config);
    if (!fa3fp8::tile_compiled(hd, prm.block_n) || (hd == 256 && (prm.q_in_regs || prm.o_tma)) ||
        (prm.overlap && !fa3fp8::overlap_compiled(prm.block_n, hd)) ||
        fa3fp8::smem_bytes(prm, hd) > fa3fp8::kSmemOptinHopper)
      continue;
    cs.expect_pass(fp8(), e.config, /*launches=*/2);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fa3Fp8Shapes, ::testing::ValuesIn(fp8_shapes()),
                         fb::test::shape_name);

TEST(Fa3Fp8, WrongBlockDescaleFails) {
  FB_SKIP_WITHOUT_HOPPER();
  Case cs(Shape{"two_blocks", 1, 2, 2, 256, 256, 128, false, DType::e4m3}.problem());
  const Config c = fp8().space().default_config();
  ASSERT_TRUE(cs.run(fp8(), c).pass);
  float ds = 0.f;
  FB_CUDA_CHECK(cudaMemcpy(&ds, cs.k_descale() + 1, sizeof ds, cudaMemcpyDeviceToHost));
  ds *= 2.f; // K block 1 of (batch 0, kv head 0)
  FB_CUDA_CHECK(cudaMemcpy(cs.k_descale() + 1, &ds, sizeof ds, cudaMemcpyHostToDevice));
  const VerifyResult r = cs.run(fp8(), c);
  EXPECT_FALSE(r.pass) << "a doubled K block descale went unnoticed: " << r.summary();
}

// ---- host only
TEST(Fa3Fp8Host, SupportsE4m3HeadDim64128And256) {
  DeviceInfo none; // no device: no compute-capability or memory check
  const Config c = fp8().space().default_config();
  AttentionProblem p = Shape{"p", 1, 2, 2, 100, 100, 128, true, DType::e4m3}.problem();
  EXPECT_TRUE(fp8().supports(p, c, none).ok);
  p.dtype = DType::bf16;
  EXPECT_NE(fp8().supports(p, c, none).reason.find("takes e4m3"), std::string::npos);
  p.dtype = DType::e4m3;
  p.head_dim = 96;
  EXPECT_NE(fp8().supports(p, c, none).reason.find("compiled for 64, 128 and 256"),
            std::string::npos)
      << fp8().supports(p, c, none).reason;
  // head_dim 256: block_n 64 or 128, Q from shared memory, O from registers. Block_n 128 fits shared memory on the
  // one-shot grid at stages 2 only, without intra_wg_overlap; that is its default.
  p.head_dim = 256;
  EXPECT_NE(fp8().supports(p, c, none).reason.find("q_in_regs"), std::string::npos)
      << fp8().supports(p, c, none).reason;
  Config b128 = c;
  b128.set("q_in_regs", 0);
  b128.set("o_store", 0);
  b128.set("stages", 2);
  b128.set("intra_wg_overlap", 0);
  EXPECT_NE(fp8().supports(p, b128, none).reason.find("shared memory"), std::string::npos)
      << fp8().supports(p, b128, none).reason;
  b128.set("scheduler", 0);
  EXPECT_TRUE(fp8().supports(p, b128, none).ok) << fp8().supports(p, b128, none).reason;
  // With intra_wg_overlap it spills at the consumers' registers, so it is not compiled.
  b128.set("intra_wg_overlap", 1);
  EXPECT_NE(fp8().supports(p, b128, none).reason.find("intra_wg_overlap"), std::string::npos)
      << fp8().supports(p, b128, none).reason;
  b128.set("intra_wg_overlap", 0);
  b128.set("block_n", 192);
  EXPECT_NE(
      fp8().supports(p, b128, none).reason.find("block_n 192 is not compiled for head_dim 256"),
      std::string::npos)
      << fp8().supports(p, b128, none).reason;
  const Config d = fp8().space().default_config(p, none);
  EXPECT_TRUE(fp8().supports(p, d, none).ok) << fp8().supports(p, d, none).reason;
  EXPECT_EQ(d.get("block_n"), 128);
  EXPECT_EQ(d.get("intra_wg_overlap"), 0);
  Config q = d;
  q.set("q_in_regs", 1);
  EXPECT_NE(fp8().supports(p, q, none).reason.find("q_in_regs"), std::string::npos);
  Config o = d;
  o.set("o_store", 1);
  EXPECT_NE(fp8().supports(p, o, none).reason.find("o_store"), std::string::npos);
  p.head_dim = 128;
  Config b64 = c;
  b64.set("block_n", 64);
  EXPECT_NE(fp8().supports(p, b64, none).reason.find("not compiled for head_dim 128"),
            std::string::npos);
}

TEST(Fa3Fp8Host, HeadDim64TakesBlockN128) {
  // Head_dim 64: block_n 128 at stages 2-4, with and without intra_wg_overlap, q_in_regs, pingpong, either grid and
  // either O store; block_n 64 and 192 are not compiled there. The default is the base config.
  DeviceInfo none;
  AttentionProblem p = Shape{"p", 2, 32, 8, 1000, 1000, 64, true, DType::e4m3}.problem();
  const Config d = fp8().space().default_config(p, none);
  EXPECT_TRUE(fp8().supports(p, d, none).ok) << fp8().supports(p, d, none).reason;
  EXPECT_EQ(d.get("block_n"), 128);
  int ok = 0;
  for (const auto &e : fp8().space().expand()) {
    if (e.invalid_reason)
      continue;
    const fa3fp8::Params prm = fa3fp8::params_of(e.config);
    const Support s = fp8().supports(p, e.config, none);
    if (prm.block_n == 128) {
      EXPECT_TRUE(s.ok) << fp8().space().to_string(e.config) << ": " << s.reason;
      EXPECT_LE(fa3fp8::smem_bytes(prm, 64), fa3fp8::kSmemOptinHopper);
      ok += s.ok ? 1 : 0;
    } else {
      EXPECT_FALSE(s.ok) << fp8().space().to_string(e.config);
      EXPECT_NE(s.reason.find("not compiled for head_dim 64 (use block_n 128"), std::string::npos)
          << s.reason;
    }
  }
  EXPECT_EQ(ok,
            3 * 3 * 2 * 2 * 2); // stages x (overlap, q_in_regs) x pingpong x scheduler x o_store
  // Shared memory: Q, K, raw V and V^T tiles of 8 KB (V^T: 64 rows of 128 keys), O's staging as at head_dim 128.
  EXPECT_EQ(fa3fp8::vt_tile_bytes(128, 64), 8192);
  fa3fp8::Params big;
  big.stages = 4;
  EXPECT_EQ(fa3fp8::smem_bytes(big, 64), 2 * 8192 + 32768 + 4 * (8192 + 8192) + 2 * 8192 + 3072);
}

TEST(Fa3Fp8Host, OtherVariantsTurnDownE4m3) {
  DeviceInfo none;
  const AttentionProblem p = Shape{"p", 1, 2, 2, 100, 100, 128, false, DType::e4m3}.problem();
  for (const auto &v : catalog().all()) {
    if (v->name() == "fa3_fp8")
      continue;
    const Support s = v->supports(p, v->space().default_config(), none);
    EXPECT_FALSE(s.ok) << v->name() << " accepted e4m3 inputs";
  }
}

TEST(Fa3Fp8Host, QInRegsNeedsIntraWarpgroupOverlap) {
  // Without intra_wg_overlap, ptxas reused Q's fragment registers for P; the space must not offer it.
  int invalid = 0, valid_with_q = 0;
  for (const auto &e : fp8().space().expand()) {
    const fa3fp8::Params p = fa3fp8::params_of(e.config);
    if (p.q_in_regs && !p.overlap) {
      ASSERT_TRUE(e.invalid_reason.has_value());
      if (p.block_n == 128 || p.stages == 2)
        EXPECT_NE(e.invalid_reason->find("intra_wg_overlap"), std::string::npos)
            << *e.invalid_reason;
      ++invalid;
    } else if (p.block_n == 192 && p.stages != 2) {
      ASSERT_TRUE(e.invalid_reason.has_value());
      EXPECT_NE(e.invalid_reason->find("stages 2"), std::string::npos) << *e.invalid_reason;
    } else if (p.block_n == 192 && p.q_in_regs) {
      // S, O and the P in flight leave no registers for Q's fragments (ptxas spilled).
      ASSERT_TRUE(e.invalid_reason.has_value());
      EXPECT_NE(e.invalid_reason->find("registers"), std::string::npos) << *e.invalid_reason;
    } else {
      EXPECT_FALSE(e.invalid_reason.has_value()) << *e.invalid_reason;
      valid_with_q += p.q_in_regs ? 1 : 0;
    }
  }
  EXPECT_GT(invalid, 0);
  EXPECT_GT(valid_with_q, 0);
}

TEST(Fa3Fp8Host, Block192DescaleRunsMatchTheKeys) {
  // Every key of a 192-key tile takes the descale of its own 128-token block.
  for (int j = 0; j < 64; ++j)
    for (int key = 0; key < 192; ++key)
      ASSERT_EQ(fa3fp8::descale_block_192(j, key / 8), (192 * j + key) / kFp8ScaleBlock)
          << "tile " << j << " key " << key;
}

TEST(Fa3Fp8Host, SharedMemoryFitsHopperAtEveryValidConfig) {
  // Every config the space accepts fits Hopper's opt-in shared memory, the largest ones exactly.
  int64_t largest = 0;
  for (const auto &e : fp8().space().expand()) {
    if (e.invalid_reason)
      continue;
    const int64_t smem = fa3fp8::smem_bytes(fa3fp8::params_of(e.config));
    EXPECT_LE(smem, fa3fp8::kSmemOptinHopper) << fp8().space().to_string(e.config);
    largest = std::max(largest, smem);
  }
  EXPECT_EQ(largest, fa3fp8::kSmemOptinHopper);
  fa3fp8::Params p;
  p.block_n = 192;
  p.stages = 2;
  EXPECT_EQ(fa3fp8::smem_bytes(p), fa3fp8::kSmemOptinHopper); // persistent, O through TMA
  p.stages = 3;
  EXPECT_GT(fa3fp8::smem_bytes(p), fa3fp8::kSmemOptinHopper);
}

} // namespace
