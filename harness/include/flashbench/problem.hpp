// AttentionProblem: the shape of one forward attention call, and what it costs (FLOPs, minimum HBM bytes).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace fb {

enum class DType { f32, f16, bf16 };

const char* to_string(DType t);
DType parse_dtype(const std::string& s); // throws UserError
int dtype_bytes(DType t);

// Memory layout of Q, K, V and O. The head dimension is always contiguous.
//   bshd: [batch, seqlen, heads, head_dim] (FlashAttention's native layout)
//   bhsd: [batch, heads, seqlen, head_dim] (torch SDPA's layout)
enum class Layout { bshd, bhsd };
const char* to_string(Layout l);
Layout parse_layout(const std::string& s); // throws UserError

// Element strides of one tensor (head_dim stride is 1).
struct Strides {
  int64_t batch = 0, seq = 0, head = 0;
};

struct AttentionProblem {
  int64_t batch = 1;
  int64_t heads_q = 1;
  int64_t heads_kv = 1; // heads_q % heads_kv == 0; heads_q / heads_kv query heads share one K/V head (GQA/MQA)
  int64_t seqlen_q = 1;
  int64_t seqlen_kv = 1;
  int64_t head_dim = 64;
  // Causal masks are aligned bottom-right, as FlashAttention does: query i sees key j iff
  // j <= i + (seqlen_kv - seqlen_q). When seqlen_q > seqlen_kv the first rows see no key and their output is 0.
  bool causal = false;
  DType dtype = DType::bf16;
  Layout layout = Layout::bshd;
  double scale = 0.0; // softmax scale; 0 means 1/sqrt(head_dim)

  double softmax_scale() const;
  int64_t group_size() const { return heads_q / heads_kv; }
  Strides q_strides() const; // also O's
  Strides kv_strides() const;
  int64_t q_elems() const { return batch * heads_q * seqlen_q * head_dim; }
  int64_t kv_elems() const { return batch * heads_kv * seqlen_kv * head_dim; }
  int64_t lse_elems() const { return batch * heads_q * seqlen_q; }

  // Last key visible to query row i (inclusive), or seqlen_kv - 1 when not causal. May be negative.
  int64_t last_key(int64_t i) const { return causal ? i + (seqlen_kv - seqlen_q) : seqlen_kv - 1; }

  bool operator==(const AttentionProblem&) const = default;
};

// Throws UserError with what is wrong and what to do (seqlen 0, heads_q not a multiple of heads_kv, ...).
void validate(const AttentionProblem& p);

// Number of (query, key) pairs that are not masked, per (batch, head).
int64_t unmasked_pairs(const AttentionProblem& p);
// FlashAttention's FLOP convention: 4 * B * Hq * d * (unmasked pairs); the two GEMMs only.
double flops(const AttentionProblem& p);
// The fewest bytes any implementation must move: Q, K, V read once, O written once, LSE (fp32) written once.
double min_bytes(const AttentionProblem& p);

// Stable, human-readable key: "b2_hq16_hkv4_sq512_skv1024_d128_causal_bf16" (layout and scale only when
// not the default). Used in benchmark names and to group points that share inputs.
std::string key(const AttentionProblem& p);

void to_json(nlohmann::json& j, const AttentionProblem& p);
void from_json(const nlohmann::json& j, AttentionProblem& p);

} // namespace fb
