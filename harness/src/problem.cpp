#include "flashbench/problem.hpp"

#include "flashbench/errors.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace fb {

const char *to_string(DType t) {
  switch (t) {
  case DType::f32:
    return "fp32";
  case DType::f16:
    return "fp16";
  case DType::bf16:
    return "bf16";
  case DType::e4m3:
    return "e4m3";
  }
  return "?";
}

DType parse_dtype(const std::string &s) {
  if (s == "fp32" || s == "f32" || s == "float32")
    return DType::f32;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half")
    return DType::f16;
  if (s == "bf16" || s == "bfloat16")
    return DType::bf16;
  if (s == "e4m3" || s == "fp8" || s == "float8_e4m3fn")
    return DType::e4m3;
  throw UserError("unknown dtype '" + s + "'; use one of fp32, fp16, bf16, e4m3");
}

int dtype_bytes(DType t) { return t == DType::f32 ? 4 : t == DType::e4m3 ? 1 : 2; }

DType out_dtype(DType t) { return t == DType::e4m3 ? DType::bf16 : t; }

const char *to_string(Layout l) { return l == Layout::bshd ? "bshd" : "bhsd"; }

Layout parse_layout(const std::string &s) {
  if (s == "bshd")
    return Layout::bshd;
  if (s == "bhsd")
    return Layout::bhsd;
  throw UserError("unknown layout '" + s + "'; use bshd ([batch, seq, heads, dim]) or bhsd");
}

const char *to_string(Pass p) { return p == Pass::fwd ? "fwd" : "bwd"; }

Pass parse_pass(const std::string &s) {
  if (s == "fwd" || s == "forward")
    return Pass::fwd;
  if (s == "bwd" || s == "backward")
    return Pass::bwd;
  throw UserError("unknown pass '" + s + "'; use fwd (forward) or bwd (backward)");
}

const char *to_string(Quant q) { return q == Quant::block ? "block" : "block_hadamard"; }

Quant parse_quant(const std::string &s) {
  if (s == "block")
    return Quant::block;
  if (s == "block_hadamard")
    return Quant::block_hadamard;
  throw UserError("unknown quant '" + s +
                  "'; use block (per-block descales) or block_hadamard (Q and K rotated first)");
}

double AttentionProblem::softmax_scale() const {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

static Strides strides_for(Layout l, int64_t heads, int64_t seqlen, int64_t d) {
  if (l == Layout::bshd)
    return {seqlen * heads * d, heads * d, d};
  return {heads * seqlen * d, d, seqlen * d};
}

Strides AttentionProblem::q_strides() const {
  return strides_for(layout, heads_q, seqlen_q, head_dim);
}
Strides AttentionProblem::kv_strides() const {
  return strides_for(layout, heads_kv, seqlen_kv, head_dim);
}

void validate(const AttentionProblem &p) {
  auto positive = [](const char *field, int64_t v) {
    if (v < 1)
      throw UserError(std::string(field) + " = " + std::to_string(v) +
                      " is impossible; it must be at least 1");
  };
  positive("batch", p.batch);
  positive("heads_q", p.heads_q);
  positive("heads_kv", p.heads_kv);
  positive("seqlen_q", p.seqlen_q);
  positive("seqlen_kv", p.seqlen_kv);
  positive("head_dim", p.head_dim);
  if (p.heads_q % p.heads_kv != 0)
    throw UserError("heads_q = " + std::to_string(p.heads_q) + " is not a multiple of heads_kv = " +
                    std::to_string(p.heads_kv) + "; GQA needs heads_q = k * heads_kv");
  if (!p.kv_lens.empty()) {
    if (static_cast<int64_t>(p.kv_lens.size()) != p.batch)
      throw UserError("kv_lens has " + std::to_string(p.kv_lens.size()) + " entries but batch = " +
                      std::to_string(p.batch) + "; give one length per batch entry");
    for (int64_t len : p.kv_lens)
      if (len < 0 || len > p.seqlen_kv)
        throw UserError("kv_lens entry " + std::to_string(len) +
                        " is outside [0, seqlen_kv = " + std::to_string(p.seqlen_kv) +
                        "]; seqlen_kv is the cache capacity, raise it");
  }
  if (p.page_size < 0)
    throw UserError("page_size = " + std::to_string(p.page_size) +
                    " is impossible; use 0 (contiguous) or a page size");
  if (p.page_size > 0 && p.layout != Layout::bshd)
    throw UserError("a paged KV cache (page_size > 0) stores pages as [page_size, heads_kv, "
                    "head_dim]; use layout bshd");
  if (p.dtype == DType::e4m3 && (p.paged() || !p.kv_lens.empty()))
    throw UserError("dtype e4m3 takes one contiguous K/V per batch entry (its descales are per "
                    "128-token block of "
                    "it); drop kv_lens and page_size, or use bf16 for a decode cache");
  if (p.quant != Quant::block && p.dtype != DType::e4m3)
    throw UserError(std::string("quant ") + to_string(p.quant) +
                    " quantizes e4m3 inputs, but dtype is " + to_string(p.dtype) +
                    "; use dtype e4m3 or drop quant");
  if (p.quant == Quant::block_hadamard && p.head_dim != 64 && p.head_dim != 128 &&
      p.head_dim != 256)
    throw UserError("quant block_hadamard rotates head_dim = " + std::to_string(p.head_dim) +
                    " by a Hadamard transform of 64, 128 or 256 points; use one of those head_dims "
                    "or quant block");
  if (p.pass == Pass::bwd) {
    if (p.dtype == DType::e4m3)
      throw UserError("the backward (pass: bwd) takes bf16, fp16 or fp32 inputs, not e4m3 (an "
                      "inference format); use dtype bf16");
    if (p.paged())
      throw UserError("the backward (pass: bwd) takes contiguous K/V, not a paged cache "
                      "(an inference layout); drop page_size");
    if (!p.kv_lens.empty())
      throw UserError("the backward (pass: bwd) takes one seqlen_kv for every batch entry, not "
                      "per-entry kv_lens (a decode cache); drop kv_lens");
    if (p.layout != Layout::bshd)
      throw UserError("the backward (pass: bwd) takes layout bshd (Q, K, V, O, dO and the "
                      "gradients as [batch, seq, heads, dim]); use layout bshd");
  }
  if (!(p.scale >= 0.0) || !std::isfinite(p.scale))
    throw UserError("scale must be a finite number >= 0 (0 means 1/sqrt(head_dim))");
  // Guard against shapes whose element counts overflow the 64-bit index math downstream.
  const double elems = static_cast<double>(p.batch) * std::max(p.heads_q, p.heads_kv) *
                       std::max(p.seqlen_q, p.seqlen_kv) * p.head_dim;
  if (elems > 4e12)
    throw UserError("problem " + key(p) + " is too large (over 4e12 elements per tensor)");
}

int64_t unmasked_pairs(const AttentionProblem &p) { return unmasked_pairs(p, p.seqlen_kv); }

int64_t unmasked_pairs(const AttentionProblem &p, int64_t skv) {
  if (!p.causal)
    return p.seqlen_q * skv;
  // Row i sees keys 0 .. i + (Skv - Sq), clamped to [0, Skv]: a sum of a clamped arithmetic series.
  const int64_t off = skv - p.seqlen_q;
  int64_t total = 0;
  // Rows where the visible count is between 1 and Skv-1 form an arithmetic run; the rest are 0 or Skv.
  const int64_t first_visible = std::max<int64_t>(0, -off);       // first row that sees >= 1 key
  const int64_t first_full = std::max<int64_t>(0, skv - 1 - off); // first row that sees all keys
  const int64_t a = std::min(first_visible, p.seqlen_q);
  const int64_t b = std::min(std::max(first_full, a), p.seqlen_q);
  // rows [a, b): count = i + off + 1, from a+off+1 to b+off
  if (b > a)
    total += (b - a) * ((a + off + 1) + (b + off)) / 2;
  total += (p.seqlen_q - b) * skv;
  return total;
}

int64_t unmasked_pairs_total(const AttentionProblem &p) {
  if (p.kv_lens.empty())
    return p.batch * unmasked_pairs(p);
  int64_t total = 0;
  for (int64_t len : p.kv_lens)
    total += unmasked_pairs(p, len);
  return total;
}

double flops(const AttentionProblem &p) {
  const double fwd = 4.0 * static_cast<double>(p.heads_q) * p.head_dim *
                     static_cast<double>(unmasked_pairs_total(p));
  return p.pass == Pass::bwd ? kBwdFlopsFactor * fwd : fwd;
}

double kv_bytes(const AttentionProblem &p) {
  int64_t keys = p.batch * p.seqlen_kv;
  if (!p.kv_lens.empty()) {
    keys = 0;
    for (int64_t len : p.kv_lens)
      keys += len;
  }
  return 2.0 * dtype_bytes(p.dtype) * static_cast<double>(keys) * p.heads_kv * p.head_dim;
}

double min_bytes(const AttentionProblem &p) {
  if (p.pass == Pass::bwd) {
    // Q, O, dO read and dQ written: four q-shaped tensors; K, V read and dK, dV written: kv_bytes twice; LSE read.
    return 4.0 * dtype_bytes(p.dtype) * static_cast<double>(p.q_elems()) + 2.0 * kv_bytes(p) +
           4.0 * p.lse_elems();
  }
  // Q in the input dtype, O in the output dtype (bf16 for e4m3 inputs); descales are too small to count.
  return (dtype_bytes(p.dtype) + dtype_bytes(out_dtype(p.dtype))) *
             static_cast<double>(p.q_elems()) +
         kv_bytes(p) + 4.0 * p.lse_elems();
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<int64_t> random_kv_lens(int64_t batch, int64_t seqlen_kv, uint64_t seed) {
  std::vector<int64_t> lens(static_cast<size_t>(std::max<int64_t>(batch, 0)));
  for (int64_t b = 0; b < batch; ++b)
    lens[static_cast<size_t>(b)] =
        1 + static_cast<int64_t>(splitmix64(seed * 0x100000001b3ull + static_cast<uint64_t>(b)) %
                                 static_cast<uint64_t>(std::max<int64_t>(seqlen_kv, 1)));
  return lens;
}

std::string key(const AttentionProblem &p) {
  std::ostringstream os;
  os << "b" << p.batch << "_hq" << p.heads_q << "_hkv" << p.heads_kv << "_sq" << p.seqlen_q
     << "_skv" << p.seqlen_kv << "_d" << p.head_dim << (p.causal ? "_causal" : "") << "_"
     << to_string(p.dtype);
  if (p.quant == Quant::block_hadamard)
    os << "_hadamard";
  if (p.layout != Layout::bshd)
    os << "_" << to_string(p.layout);
  if (p.scale != 0.0)
    os << "_scale" << p.scale;
  if (!p.kv_lens.empty()) {
    os << "_kvl";
    if (p.kv_lens.size() <= 8) {
      for (size_t i = 0; i < p.kv_lens.size(); ++i)
        os << (i ? "-" : "") << p.kv_lens[i];
    } else {
      int64_t sum = 0;
      uint64_t h = 0xcbf29ce484222325ull; // FNV-1a over the lengths
      for (int64_t len : p.kv_lens) {
        sum += len;
        h = (h ^ static_cast<uint64_t>(len)) * 0x100000001b3ull;
      }
      char buf[16];
      std::snprintf(buf, sizeof buf, "%08llx", static_cast<unsigned long long>(h & 0xffffffffull));
      os << sum << "x" << buf;
    }
  }
  if (p.page_size > 0)
    os << "_page" << p.page_size;
  if (p.pass != Pass::fwd)
    os << "_" << to_string(p.pass);
  return os.str();
}

void to_json(nlohmann::json &j, const AttentionProblem &p) {
  j = nlohmann::json{
      {"batch", p.batch},       {"heads_q", p.heads_q},        {"heads_kv", p.heads_kv},
      {"seqlen_q", p.seqlen_q}, {"seqlen_kv", p.seqlen_kv},    {"head_dim", p.head_dim},
      {"causal", p.causal},     {"dtype", to_string(p.dtype)}, {"layout", to_string(p.layout)},
      {"scale", p.scale},       {"pass", to_string(p.pass)}};
  // Only when set, so that records of uniform contiguous problems keep their old shape.
  if (!p.kv_lens.empty())
    j["kv_lens"] = p.kv_lens;
  if (p.page_size > 0)
    j["page_size"] = p.page_size;
  // Every e4m3 record says how its inputs were quantized; other dtypes have no quantization to name.
  if (p.dtype == DType::e4m3)
    j["quant"] = to_string(p.quant);
}

void from_json(const nlohmann::json &j, AttentionProblem &p) {
  p = AttentionProblem{};
  p.batch = j.at("batch").get<int64_t>();
  p.heads_q = j.at("heads_q").get<int64_t>();
  p.heads_kv = j.at("heads_kv").get<int64_t>();
  p.seqlen_q = j.at("seqlen_q").get<int64_t>();
  p.seqlen_kv = j.at("seqlen_kv").get<int64_t>();
  p.head_dim = j.at("head_dim").get<int64_t>();
  p.causal = j.at("causal").get<bool>();
  p.dtype = parse_dtype(j.at("dtype").get<std::string>());
  p.layout = parse_layout(j.value("layout", std::string("bshd")));
  p.scale = j.value("scale", 0.0);
  if (j.contains("kv_lens") && j["kv_lens"].is_array())
    p.kv_lens = j["kv_lens"].get<std::vector<int64_t>>();
  p.page_size = j.value("page_size", int64_t{0});
  // Records and tables written before the backward existed have no pass: they are forward.
  p.pass = parse_pass(j.value("pass", std::string("fwd")));
  // Records written before the option existed quantized per block without rotation.
  p.quant = parse_quant(j.value("quant", std::string("block")));
}

} // namespace fb
