// AttentionProblem: the shape of one attention call (forward or backward), and what it costs (FLOPs, minimum HBM
// bytes).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace fb {

// e4m3 (float8_e4m3fn) is a quantized input type: Q, K and V are 1-byte e4m3 codes with float32 descales (the
// value is code * descale), O comes out in bf16 (out_dtype), LSE in fp32 as always. Descales: Q and K one per
// (batch, head, block of kFp8ScaleBlock tokens), V one per (batch, kv head); see fp8_descale_elems.
enum class DType { f32, f16, bf16, e4m3 };

const char *to_string(DType t);
DType parse_dtype(const std::string &s); // throws UserError
int dtype_bytes(DType t);
// The dtype of O for inputs of dtype t: t itself, bf16 for e4m3.
DType out_dtype(DType t);
constexpr int64_t kFp8ScaleBlock = 128; // tokens per Q/K descale

// Memory layout of Q, K, V and O. The head dimension is always contiguous.
//   bshd: [batch, seqlen, heads, head_dim] (FlashAttention's native layout)
//   bhsd: [batch, heads, seqlen, head_dim] (torch SDPA's layout)
enum class Layout { bshd, bhsd };
const char *to_string(Layout l);
Layout parse_layout(const std::string &s); // throws UserError

// Which pass a problem measures. fwd: O and LSE from Q, K, V. bwd: dQ, dK, dV from Q, K, V, O, dO and LSE (the
// forward's O and LSE are inputs; variant.hpp's LaunchArgs says where each lives).
enum class Pass { fwd, bwd };
const char *to_string(Pass p);
Pass parse_pass(const std::string &s); // throws UserError

// How an e4m3 problem's Q and K were quantized (quantize.hpp). block: per-(batch, head, 128-token block) descales
// of the values as drawn. block_hadamard: the same after rotating each row of Q and K by one random orthogonal
// matrix M = H diag(s) / sqrt(head_dim) (H the Hadamard matrix, s random signs; incoherent processing): Q K^T is
// unchanged in exact arithmetic and outliers spread over all head_dim dimensions before the amax is taken. V is
// never rotated. The kernel sees codes and descales either way, so the tuning key leaves it out.
enum class Quant { block, block_hadamard };
const char *to_string(Quant q);
Quant parse_quant(const std::string &s); // throws UserError

// Element strides of one tensor (head_dim stride is 1).
struct Strides {
  int64_t batch = 0, seq = 0, head = 0;
};

struct AttentionProblem {
  int64_t batch = 1;
  int64_t heads_q = 1;
  int64_t heads_kv =
      1; // heads_q % heads_kv == 0; heads_q / heads_kv query heads share one K/V head (GQA/MQA)
  int64_t seqlen_q = 1;
  int64_t seqlen_kv = 1;
  int64_t head_dim = 64;
  // Causal masks are aligned bottom-right, as FlashAttention does: query i sees key j iff
  // j <= i + (seqlen_kv - seqlen_q). When seqlen_q > seqlen_kv the first rows see no key and their output is 0.
  bool causal = false;
  DType dtype = DType::bf16;
  Layout layout = Layout::bshd;
  double scale = 0.0; // softmax scale; 0 means 1/sqrt(head_dim)
  // Per-entry KV lengths (a serving batch's cache_seqlens), each in [0, seqlen_kv]; empty means every entry has
  // seqlen_kv keys. seqlen_kv is then the cache capacity: K/V keep seqlen_kv rows per entry and rows past an
  // entry's length hold data that no query may see. Causal alignment is bottom-right against each entry's own
  // length; an entry of length 0 gives O = 0 and LSE = -inf.
  std::vector<int64_t> kv_lens;
  // Paged KV cache (bshd only): 0 = contiguous. Otherwise K and V are pools [num_pages(), page_size, heads_kv,
  // head_dim] and a page table int32 [batch, pages_per_seq()] maps entry b's logical page j to a pool page.
  int64_t page_size = 0;
  // The backward takes dense bshd problems of bf16, fp16 or fp32 only (validate() says so).
  Pass pass = Pass::fwd;
  // e4m3 only (validate() refuses anything else for other dtypes); block_hadamard needs head_dim 64, 128 or 256.
  Quant quant = Quant::block;

  double softmax_scale() const;
  int64_t group_size() const { return heads_q / heads_kv; }
  Strides q_strides() const; // also O's
  Strides kv_strides() const;
  int64_t q_elems() const { return batch * heads_q * seqlen_q * head_dim; }
  int64_t kv_elems() const { return batch * heads_kv * seqlen_kv * head_dim; }
  int64_t lse_elems() const { return batch * heads_q * seqlen_q; }
  // e4m3 descales (float32): Q [batch, heads_q, ceil(seqlen_q / 128)], K [batch, heads_kv, ceil(seqlen_kv / 128)],
  // V [batch, heads_kv]; all row-major.
  int64_t q_descale_elems() const {
    return batch * heads_q * ((seqlen_q + kFp8ScaleBlock - 1) / kFp8ScaleBlock);
  }
  int64_t k_descale_elems() const {
    return batch * heads_kv * ((seqlen_kv + kFp8ScaleBlock - 1) / kFp8ScaleBlock);
  }
  int64_t v_descale_elems() const { return batch * heads_kv; }
  // Keys of batch entry b (its cache_seqlens entry).
  int64_t kv_len(int64_t b) const {
    return kv_lens.empty() ? seqlen_kv : kv_lens[static_cast<size_t>(b)];
  }
  bool paged() const { return page_size > 0; }
  int64_t pages_per_seq() const { return paged() ? (seqlen_kv + page_size - 1) / page_size : 0; }
  int64_t num_pages() const { return batch * pages_per_seq(); }
  // Elements of one K (or V) allocation as the kernels see it: the page pool when paged, else kv_elems().
  int64_t kv_storage_elems() const {
    return paged() ? num_pages() * page_size * heads_kv * head_dim : kv_elems();
  }

  // Last key visible to query row i (inclusive), or seqlen_kv - 1 when not causal. May be negative.
  int64_t last_key(int64_t i) const { return causal ? i + (seqlen_kv - seqlen_q) : seqlen_kv - 1; }
  // The same for batch entry b, against its own length.
  int64_t last_key(int64_t i, int64_t b) const {
    const int64_t len = kv_len(b);
    return causal ? i + (len - seqlen_q) : len - 1;
  }

  bool operator==(const AttentionProblem &) const = default;
};

// Throws UserError with what is wrong and what to do (seqlen 0, heads_q not a multiple of heads_kv, a backward of
// e4m3 or of a paged or ragged cache, ...).
void validate(const AttentionProblem &p);

// Number of (query, key) pairs that are not masked, per (batch, head), for an entry of seqlen_kv keys (kv_lens
// ignored; see unmasked_pairs_total).
int64_t unmasked_pairs(const AttentionProblem &p);
// ... for an entry of kv_len keys.
int64_t unmasked_pairs(const AttentionProblem &p, int64_t kv_len);
// Summed over the batch with each entry's own length, per head: batch * unmasked_pairs(p) when kv_lens is empty.
int64_t unmasked_pairs_total(const AttentionProblem &p);
// FlashAttention's FLOP convention: 4 * Hq * d * (unmasked pairs over the batch), the forward's two GEMMs only;
// the backward counts its five GEMMs (S = Q K^T recomputed, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q):
// kBwdFlopsFactor times the forward's, over the same unmasked pairs.
constexpr double kBwdFlopsFactor = 2.5;
double flops(const AttentionProblem &p);
// K and V bytes any implementation must read: each entry's kv_len rows of every KV head, once.
double kv_bytes(const AttentionProblem &p);
// The fewest bytes any implementation must move. fwd: Q, K, V read once (K/V: each entry's own length; page tables
// and cache_seqlens are too small to count), O written once, LSE (fp32) written once. bwd: Q, K, V, O and dO read
// once, LSE (fp32) read once, dQ, dK and dV written once (all in the problem's dtype).
double min_bytes(const AttentionProblem &p);
// Deterministic per-entry lengths in [1, seqlen_kv] for the spec shorthand `kv_lens: random` (splitmix64 of
// (seed, b), the same on every platform).
std::vector<int64_t> random_kv_lens(int64_t batch, int64_t seqlen_kv, uint64_t seed);

// Stable, human-readable key: "b2_hq16_hkv4_sq512_skv1024_d128_causal_bf16" (quant, layout, scale, kv_lens,
// page_size and pass only when not the default: "_e4m3_hadamard" right after the dtype; "_kvl1-257-0" for up to 8
// entries, else "_kvl" + sum + "x" + a hash; "_page16"; "_bwd" last). Used in benchmark names and to group points that share inputs.
std::string key(const AttentionProblem &p);

void to_json(nlohmann::json &j, const AttentionProblem &p);
void from_json(const nlohmann::json &j, AttentionProblem &p);

} // namespace fb
