#include "flashbench/problem.hpp"

#include "flashbench/errors.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace fb {

const char* to_string(DType t) {
  switch (t) {
  case DType::f32: return "fp32";
  case DType::f16: return "fp16";
  case DType::bf16: return "bf16";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::f32;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  throw UserError("unknown dtype '" + s + "'; use one of fp32, fp16, bf16");
}

int dtype_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

const char* to_string(Layout l) { return l == Layout::bshd ? "bshd" : "bhsd"; }

Layout parse_layout(const std::string& s) {
  if (s == "bshd") return Layout::bshd;
  if (s == "bhsd") return Layout::bhsd;
  throw UserError("unknown layout '" + s + "'; use bshd ([batch, seq, heads, dim]) or bhsd");
}

double AttentionProblem::softmax_scale() const {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

static Strides strides_for(Layout l, int64_t heads, int64_t seqlen, int64_t d) {
  if (l == Layout::bshd) return {seqlen * heads * d, heads * d, d};
  return {heads * seqlen * d, d, seqlen * d};
}

Strides AttentionProblem::q_strides() const { return strides_for(layout, heads_q, seqlen_q, head_dim); }
Strides AttentionProblem::kv_strides() const { return strides_for(layout, heads_kv, seqlen_kv, head_dim); }

void validate(const AttentionProblem& p) {
  auto positive = [](const char* field, int64_t v) {
    if (v < 1)
      throw UserError(std::string(field) + " = " + std::to_string(v) + " is impossible; it must be at least 1");
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
  if (!(p.scale >= 0.0) || !std::isfinite(p.scale))
    throw UserError("scale must be a finite number >= 0 (0 means 1/sqrt(head_dim))");
  // Guard against shapes whose element counts overflow the 64-bit index math downstream.
  const double elems = static_cast<double>(p.batch) * std::max(p.heads_q, p.heads_kv) *
                       std::max(p.seqlen_q, p.seqlen_kv) * p.head_dim;
  if (elems > 4e12) throw UserError("problem " + key(p) + " is too large (over 4e12 elements per tensor)");
}

int64_t unmasked_pairs(const AttentionProblem& p) {
  if (!p.causal) return p.seqlen_q * p.seqlen_kv;
  // Row i sees keys 0 .. i + (Skv - Sq), clamped to [0, Skv]: a sum of a clamped arithmetic series.
  const int64_t off = p.seqlen_kv - p.seqlen_q;
  int64_t total = 0;
  // Rows where the visible count is between 1 and Skv-1 form an arithmetic run; the rest are 0 or Skv.
  const int64_t first_visible = std::max<int64_t>(0, -off);            // first row that sees >= 1 key
  const int64_t first_full = std::max<int64_t>(0, p.seqlen_kv - 1 - off); // first row that sees all keys
  const int64_t a = std::min(first_visible, p.seqlen_q);
  const int64_t b = std::min(std::max(first_full, a), p.seqlen_q);
  // rows [a, b): count = i + off + 1, from a+off+1 to b+off
  if (b > a) total += (b - a) * ((a + off + 1) + (b + off)) / 2;
  total += (p.seqlen_q - b) * p.seqlen_kv;
  return total;
}

double flops(const AttentionProblem& p) {
  return 4.0 * static_cast<double>(p.batch) * p.heads_q * p.head_dim * static_cast<double>(unmasked_pairs(p));
}

double min_bytes(const AttentionProblem& p) {
  const double e = dtype_bytes(p.dtype);
  return e * (2.0 * p.q_elems() + 2.0 * p.kv_elems()) + 4.0 * p.lse_elems();
}

std::string key(const AttentionProblem& p) {
  std::ostringstream os;
  os << "b" << p.batch << "_hq" << p.heads_q << "_hkv" << p.heads_kv << "_sq" << p.seqlen_q << "_skv"
     << p.seqlen_kv << "_d" << p.head_dim << (p.causal ? "_causal" : "") << "_" << to_string(p.dtype);
  if (p.layout != Layout::bshd) os << "_" << to_string(p.layout);
  if (p.scale != 0.0) os << "_scale" << p.scale;
  return os.str();
}

void to_json(nlohmann::json& j, const AttentionProblem& p) {
  j = nlohmann::json{{"batch", p.batch},         {"heads_q", p.heads_q},   {"heads_kv", p.heads_kv},
                     {"seqlen_q", p.seqlen_q},   {"seqlen_kv", p.seqlen_kv}, {"head_dim", p.head_dim},
                     {"causal", p.causal},       {"dtype", to_string(p.dtype)},
                     {"layout", to_string(p.layout)}, {"scale", p.scale}};
}

void from_json(const nlohmann::json& j, AttentionProblem& p) {
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
}

} // namespace fb
