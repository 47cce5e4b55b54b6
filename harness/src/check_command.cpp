#include "flashbench/check.hpp"
#include "flashbench/sweep.hpp"
#include "point_runner.hpp"

#include <algorithm>
#include <cstdio>
#include <ostream>

namespace fb {

std::vector<AttentionProblem> awkward_shapes() {
  auto P = [](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d, bool causal,
              DType t, Layout l = Layout::bshd) {
    AttentionProblem p;
    p.batch = b;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.seqlen_q = sq;
    p.seqlen_kv = skv;
    p.head_dim = d;
    p.causal = causal;
    p.dtype = t;
    p.layout = l;
    return p;
  };
  std::vector<AttentionProblem> v;
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    v.push_back(P(1, 1, 1, 1, 1, 64, false, t));    // length 1
    v.push_back(P(2, 4, 4, 77, 131, 64, false, t)); // multiples of no tile
    v.push_back(P(1, 8, 2, 131, 77, 128, true, t)); // causal, Sq > Skv: 54 rows see no key (GQA 4)
    v.push_back(P(2, 8, 1, 65, 257, 128, true, t)); // causal, Sq < Skv, MQA
  }
  // e4m3 inputs (fa3_fp8; the others skip them): the same kinds of shapes at head_dim 128, and two at 256 and 64.
  v.push_back(P(1, 1, 1, 1, 1, 128, false, DType::e4m3));
  v.push_back(P(2, 4, 4, 77, 131, 128, false, DType::e4m3));
  v.push_back(P(1, 8, 2, 131, 77, 128, true, DType::e4m3));
  v.push_back(P(2, 8, 1, 65, 257, 128, true, DType::e4m3));
  v.push_back(P(1, 4, 2, 300, 700, 128, true, DType::e4m3, Layout::bhsd));
  // The same inputs rotated before quantization (quant: block_hadamard): the kernel sees other codes only.
  for (AttentionProblem p :
       {P(2, 4, 4, 77, 131, 128, false, DType::e4m3), P(1, 8, 2, 131, 77, 128, true, DType::e4m3),
        P(1, 4, 2, 300, 700, 128, true, DType::e4m3, Layout::bhsd)}) {
    p.quant = Quant::block_hadamard;
    v.push_back(p);
  }
  v.push_back(P(2, 4, 4, 77, 131, 256, false, DType::e4m3));
  v.push_back(P(1, 8, 2, 300, 700, 256, true, DType::e4m3, Layout::bhsd));
  v.push_back(
      P(2, 4, 4, 77, 131, 64, false, DType::e4m3)); // head_dim 64: 64-byte rows, the 64B swizzle
  v.push_back(P(1, 8, 2, 300, 700, 64, true, DType::e4m3, Layout::bhsd));
  v.push_back(P(1, 2, 2, 1, 300, 128, true, DType::bf16)); // decode-like: one query over many keys
  v.push_back(P(1, 3, 3, 257, 257, 64, true, DType::bf16, Layout::bhsd));
  v.push_back(P(1, 2, 1, 200, 200, 256, false, DType::f16)); // head_dim 256 where supported
  v.push_back(
      P(2, 6, 2, 300, 300, 256, true, DType::bf16));      // d256 causal GQA: its own default tile
  v.push_back(P(1, 2, 2, 33, 47, 96, true, DType::bf16)); // an unusual head_dim
  // Decode-style (variants without kv_lens / paging skip these with a reason): GQA 32/8 over mixed lengths with
  // an empty entry; the same paged (16-token pages, shuffled); speculative decoding, causal per entry.
  AttentionProblem mixed = P(4, 32, 8, 1, 1000, 128, false, DType::bf16);
  mixed.kv_lens = {1, 257, 0, 1000};
  v.push_back(mixed);
  mixed.page_size = 16;
  v.push_back(mixed);
  AttentionProblem spec = P(2, 32, 8, 16, 600, 128, true, DType::f16);
  spec.kv_lens = {600, 7};
  spec.page_size = 64;
  v.push_back(spec);
  v.push_back(P(1, 32, 8, 1, 8191, 128, false, DType::bf16)); // uniform decode, many splits
  // The backward (pass: bwd; dense bshd only): the same awkward kinds, where dK and dV sum over GQA groups and
  // rows that see no key must give zero gradients.
  auto B = [&](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d, bool causal,
               DType t) {
    AttentionProblem p = P(b, hq, hkv, sq, skv, d, causal, t);
    p.pass = Pass::bwd;
    v.push_back(p);
  };
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    B(1, 1, 1, 1, 1, 64, false, t);    // length 1
    B(2, 4, 4, 77, 131, 64, false, t); // multiples of no tile
    B(1, 8, 2, 131, 77, 128, true, t); // causal, Sq > Skv: 54 rows see no key (GQA 4)
    B(2, 8, 1, 65, 257, 128, true, t); // causal, Sq < Skv, MQA
    B(1, 2, 2, 1, 300, 64, true, t);   // one query over many keys
  }
  B(2, 6, 2, 300, 300, 256, true, DType::bf16); // d256 causal GQA where it fits
  B(1, 2, 1, 200, 200, 256, false, DType::f16);
  B(1, 2, 2, 33, 47, 96, true, DType::bf16);    // an unusual head_dim
  B(1, 4, 4, 257, 257, 128, true, DType::bf16); // one past a tile, square causal
  return v;
}

int run_check(int device, const std::vector<std::string> &only, std::ostream &os,
              bool defaults_only) {
  FB_CUDA_CHECK(cudaSetDevice(device));
  const DeviceInfo dev = query_device(device);
  cudaStream_t stream;
  FB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  PointRunner runner(dev, stream);
  int pass = 0, fail = 0, skipped = 0;
  for (const auto &v : catalog().all()) {
    if (!only.empty() && std::find(only.begin(), only.end(), v->name()) == only.end())
      continue;
    // Test-only variants (FLASHBENCH_TEST_VARIANTS=1) fail on purpose: only when named.
    if (only.empty() && v->name().rfind("test_", 0) == 0)
      continue;
    for (const auto &p : awkward_shapes()) {
      if (p.pass != v->pass())
        continue; // the other pass's shapes: not this variant's to check, nor a skip
      std::vector<ConfigSpace::Entry> entries;
      if (defaults_only) {
        const Config d = v->space().default_config(p, dev);
        entries.push_back({d, v->space().check(d)});
      } else {
        entries = v->space().expand();
      }
      for (const auto &entry : entries) {
        const std::string label =
            v->name() + "/" + v->space().to_string(entry.config) + "/" + key(p);
        if (entry.invalid_reason) {
          ++skipped;
          continue;
        }
        const Support s = support_for(*v, p, entry.config, dev);
        if (!s.ok) {
          ++skipped;
          continue;
        }
        try {
          runner.prepare(p);
          const VerifyResult r = runner.verify(*v, entry.config, 120.0);
          os << (r.pass ? "PASS " : "FAIL ") << label << "  " << r.summary() << "\n";
          (r.pass ? pass : fail)++;
        } catch (const std::exception &e) {
          os << "FAIL " << label << "  " << e.what() << "\n";
          ++fail;
          if (const auto *ce = dynamic_cast<const CudaError *>(&e); ce && ce->sticky()) {
            os << "stopping: the CUDA context is lost\n";
            return 1;
          }
        }
      }
    }
  }
  os << pass << " passed, " << fail << " failed, " << skipped
     << " skipped (unsupported or invalid configs)\n";
  cudaStreamDestroy(stream);
  return fail ? 1 : 0;
}

} // namespace fb
