// Every variant's default config (ConfigSpace::default_config(p, dev)) on the whole support matrix
// of forward and backward problems, on the CPU: wherever some config of a variant supports a
// problem on a device (support_for: each variant meets its own pass), its default for that problem
// does too, so `configs: default`, the C API's "default" and the dispatcher's fallback
// never refuse a supported problem.
#include "flashbench/variant.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace fb;

namespace {

DeviceInfo hopper(const std::string &name, int64_t mem_bytes) {
  DeviceInfo d = nominal_device();
  d.present = true;
  d.name = name;
  d.total_mem_bytes = mem_bytes;
  return d;
}

// The devices whose limits decide support: an H100 and an H200 (sm_90: 227 KB of shared memory a
// block), an A100 (sm_80: 163 KB, 108 SMs, no wgmma) and no device at all (planning against the
// nominal H100).
std::vector<DeviceInfo> devices() {
  DeviceInfo a100 = nominal_device();
  a100.present = true;
  a100.name = "NVIDIA A100-SXM4-80GB";
  a100.cc_major = 8;
  a100.cc_minor = 0;
  a100.sm_count = 108;
  a100.l2_bytes = 40LL * 1024 * 1024;
  a100.smem_per_block_optin = 163 * 1024;
  a100.smem_per_sm = 164 * 1024;
  a100.total_mem_bytes = 80LL * 1000 * 1000 * 1000;
  return {hopper("NVIDIA H100 80GB HBM3", 80LL * 1000 * 1000 * 1000),
          hopper("NVIDIA H200", 141LL * 1000 * 1000 * 1000), a100, nominal_device()};
}

struct Heads {
  int64_t batch, heads_q, heads_kv;
};

std::vector<AttentionProblem> problems() {
  // (seqlen_q, seqlen_kv): decode (1 query, short to 128k keys), speculative decode (4 and 16
  // queries), prefill from awkward to long, and cross-attention with more and fewer queries than
  // keys.
  const std::pair<int64_t, int64_t> lengths[] = {
      {1, 1000},  {1, 32768}, {1, 131072},  {4, 4096},    {16, 20000},    {77, 131},
      {333, 777}, {512, 512}, {2048, 2048}, {3000, 3000}, {16384, 16384}, {1024, 300}};
  // MHA, GQA 6:1 at an odd batch, MQA, a serving batch of GQA 4:1 (Llama-3 8B) and 8:1 (70B).
  const Heads heads[] = {{2, 16, 16}, {3, 48, 8}, {1, 32, 1}, {64, 32, 8}, {4, 64, 8}};
  std::vector<AttentionProblem> out;
  for (DType t : {DType::bf16, DType::f16, DType::f32, DType::e4m3})
    for (int64_t d : {32, 64, 96, 128, 256})
      for (bool causal : {false, true})
        for (const auto &[sq, skv] : lengths)
          for (const Heads &h : heads) {
            AttentionProblem p;
            p.batch = h.batch;
            p.heads_q = h.heads_q;
            p.heads_kv = h.heads_kv;
            p.seqlen_q = sq;
            p.seqlen_kv = skv;
            p.head_dim = d;
            p.causal = causal;
            p.dtype = t;
            out.push_back(p);
            if (t != DType::e4m3) { // the backward of the same dense problem (validate(): no e4m3)
              AttentionProblem g = p;
              g.pass = Pass::bwd;
              out.push_back(g);
            }
            if (sq <= 16) { // a serving batch: per-entry lengths, and the same from a paged cache
              AttentionProblem v = p;
              v.kv_lens.assign(size_t(v.batch), 0);
              for (int64_t b = 0; b < v.batch; ++b)
                v.kv_lens[size_t(b)] = skv - (b * 37) % skv;
              out.push_back(v);
              v.page_size = 256;
              out.push_back(v);
            }
          }
  return out;
}

} // namespace

TEST(DefaultConfigs, TheDefaultSupportsEveryProblemThatAnyConfigSupports) {
  const auto devs = devices();
  const auto probs = problems();
  int supported = 0;
  std::vector<std::string> failures;
  for (const auto &v : catalog().all()) {
    std::vector<Config> valid;
    for (const auto &e : v->space().expand())
      if (!e.invalid_reason)
        valid.push_back(e.config);
    for (const DeviceInfo &dev : devs)
      for (const AttentionProblem &p : probs) {
        const Config def = v->space().default_config(p, dev);
        if (auto why = v->space().check(def)) {
          failures.push_back(v->name() + " on " + key(p) + " (" + dev.name + "): default " +
                             v->space().to_string(def) + " is invalid: " + *why);
          continue;
        }
        const Support s = support_for(*v, p, def, dev);
        if (s.ok) {
          ++supported;
          continue;
        }
        for (const Config &c : valid)
          if (support_for(*v, p, c, dev)) {
            failures.push_back(v->name() + " on " + key(p) + " (" + dev.name + "): default " +
                               v->space().to_string(def) + " refused (" + s.reason + ") but " +
                               v->space().to_string(c) + " is supported");
            break;
          }
      }
  }
  // The matrix is not vacuous: every variant of the catalog supports a good part of it.
  EXPECT_GT(supported, 1000);
  for (size_t i = 0; i < failures.size() && i < 20; ++i)
    ADD_FAILURE() << failures[i];
  EXPECT_TRUE(failures.empty()) << failures.size()
                                << " (variant, problem, device) defaults refused";
}

TEST(DefaultConfigs, FollowTheProblem) {
  const DeviceInfo h100 = devices().front();
  AttentionProblem p;
  p.batch = 2, p.heads_q = p.heads_kv = 16, p.seqlen_q = p.seqlen_kv = 4096;
  const Variant &fa3 = catalog().get("fa3_pipelined");
  p.head_dim = 128;
  EXPECT_EQ(fa3.space().default_config(p, h100), fa3.space().default_config()); // d128: the base
  p.head_dim = 256; // block_n 128 is not compiled
  EXPECT_TRUE(fa3.supports(p, fa3.space().default_config(p, h100), h100).ok);
  EXPECT_FALSE(fa3.supports(p, fa3.space().default_config(), h100).ok);
  p.head_dim = 64;
  EXPECT_EQ(fa3.space().default_config(p, h100).get("consumer_wgs"), 3);
  EXPECT_EQ(fa3.space().default_config(p, h100).get("stages"), 2);
  p.seqlen_q = p.seqlen_kv = 1024; // few keys: a deeper ring, no ping-pong
  const Config short_keys = fa3.space().default_config(p, h100);
  EXPECT_EQ(short_keys.get("stages"), 4);
  EXPECT_EQ(short_keys.get("pingpong"), 0);
  EXPECT_TRUE(fa3.supports(p, short_keys, h100).ok);
}
