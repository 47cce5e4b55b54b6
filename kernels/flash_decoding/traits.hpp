// Flash-decoding: the config space, the split plan (how many CTAs share one KV sequence) and the
// workspace layout that the kernels, the traffic model and the heuristic share. Host-only code may
// include this file; the kernels are in flash_decoding.cuh.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fb::fdec {

// One CTA = `warps` warps; each warp owns block_n / warps consecutive keys of every CTA step (split-K
// inside the CTA), all kRowsPerCta packed query rows (one m16n8k16 row block) and its own cp.async ring
// of `stages` sub-tiles: no barrier between the warps until the end-of-CTA merge.
constexpr int kRowsPerCta = 16;
constexpr int kMaxSplits = 128;
constexpr int kCombineThreads = 128; // the non-fused combine kernel's block

struct Params {
  int block_n = 64;   // keys per CTA step (per pipeline stage), block_n / warps per warp
  int stages = 3;     // cp.async ring depth of every warp (3: two CTAs per SM at block_n 64, d 128)
  int num_splits = 0; // CTAs per (entry, KV head, row block); 0 = heuristic (split_plan)
  int fused = 1;      // 1: the last CTA of a group combines (one launch); 0: a combine kernel
  int warps = 4;      // warps per CTA (4 or 8)
};

inline int keys_per_warp(const Params &c) { return c.block_n / c.warps; }
inline int threads_of(const Params &c) { return 32 * c.warps; }

inline std::optional<std::string> config_problem(const Params &c) {
  if (c.block_n != 64 && c.block_n != 128)
    return "block_n must be 64 or 128";
  if (c.warps != 4 && c.warps != 8)
    return "warps must be 4 or 8";
  if (keys_per_warp(c) != 16 && keys_per_warp(c) != 32)
    return "block_n / warps must be 16 or 32 keys a warp (P·V's m16n8k16 takes 16 keys at a time): "
           "use block_n 128 with 8 warps";
  if (c.stages < 2 || c.stages > 4)
    return "stages must be 2, 3 or 4";
  if (c.num_splits < 0 || c.num_splits > kMaxSplits)
    return "num_splits must be 0 (heuristic) .. " + std::to_string(kMaxSplits);
  if (c.fused != 0 && c.fused != 1)
    return "fused must be 0 or 1";
  return std::nullopt;
}

inline Params params_of(const Config &c) {
  const Params d;
  return Params{static_cast<int>(c.get_or("block_n", d.block_n)),
                static_cast<int>(c.get_or("stages", d.stages)),
                static_cast<int>(c.get_or("num_splits", d.num_splits)),
                static_cast<int>(c.get_or("fused", d.fused)),
                static_cast<int>(c.get_or("warps", d.warps))};
}

inline ConfigSpace make_space() {
  const Params d;
  return ConfigSpace(
      {Axis{"block_n",
            {64, 128},
            {},
            "keys per CTA step (one pipeline stage; block_n / warps per warp)"},
       Axis{"stages",
            {2, 3, 4},
            {},
            "cp.async ring depth of each warp (K/V sub-tiles in flight per warp)"},
       Axis{"num_splits",
            {0, 1, 2, 4, 8, 16, 32, 64},
            {},
            "CTAs that share one KV sequence; 0 = heuristic (wave efficiency)"},
       // One launch first: the tuner breaks 1% ties toward lower axis positions (fewer resources), and a
       // second kernel is not fewer (the first tune-decode run gave L=128k to two_kernels on a -1.0% tie;
       // re-measured in the same call it was 1.3% slower).
       Axis{"fused",
            {1, 0},
            {"last_cta", "two_kernels"},
            "combine in the last CTA of each group (one launch), or in a second kernel"},
       Axis{"warps",
            {4, 8},
            {},
            "warps per CTA, each with its own K/V ring (block_n / warps keys each)"}},
      Config({{"block_n", d.block_n},
              {"stages", d.stages},
              {"num_splits", d.num_splits},
              {"fused", d.fused},
              {"warps", d.warps}}),
      [](const Config &c) { return config_problem(params_of(c)); });
}

inline bool head_dim_ok(int64_t d) { return d == 64 || d == 128 || d == 256; }

// head_dim 256 keeps 128 fp32 accumulators and 64 Q registers a thread: only 16 keys a warp fit the
// register file without spilling (and block_n 128 does not fit two stages of shared memory anyway).
inline std::optional<std::string> head_dim_problem(int64_t d, const Params &c) {
  if (d == 256 && keys_per_warp(c) != 16)
    return std::string(
        "head_dim 256 takes 16 keys a warp (block_n / warps = 16): 32 would spill registers");
  if (d == 256 && c.warps != 4)
    return std::string(
        "head_dim 256 runs with 4 warps only (8 warps need block_n 128: 256 KB for two stages)");
  return std::nullopt;
}

// K and V sub-tiles of every warp and stage (16-bit elements). The end-of-CTA merge of the warps'
// partial O reuses this space (warps * 16 * D floats + 1 KB, always smaller: block_n >= 16 * warps),
// and so does the fused combine's weight table (kMaxSplits * 16 floats = 8 KB <= 32 KB). Callers pass
// the plan's stages.
inline int64_t smem_bytes(int64_t head_dim, const Params &c) {
  return int64_t(c.stages) * c.block_n * head_dim * 2 * 2;
}

// Query rows per KV head: the GQA group's heads times seqlen_q, packed so one K/V load serves all.
inline int64_t packed_rows(const AttentionProblem &p) { return p.group_size() * p.seqlen_q; }
inline int64_t row_blocks(const AttentionProblem &p) {
  return (packed_rows(p) + kRowsPerCta - 1) / kRowsPerCta;
}
// Independent (entry, KV head, row block) groups; each is split num_splits ways.
inline int64_t num_groups(const AttentionProblem &p) {
  return p.batch * p.heads_kv * row_blocks(p);
}

inline int64_t max_kv_len(const AttentionProblem &p) {
  if (p.kv_lens.empty())
    return p.seqlen_kv;
  return *std::max_element(p.kv_lens.begin(), p.kv_lens.end());
}

// Keys that row block mb of entry b must read: up to the last visible key of its last row.
inline int64_t group_kv_end(const AttentionProblem &p, int64_t b, int64_t mb) {
  const int64_t len = p.kv_len(b);
  if (!p.causal)
    return len;
  const int64_t last_row = std::min(packed_rows(p), (mb + 1) * kRowsPerCta) - 1;
  const int64_t i = last_row / p.group_size();
  return std::clamp<int64_t>(i + 1 + len - p.seqlen_q, 0, len);
}

// What the heuristic needs to know about the GPU.
struct DeviceFacts {
  int sm_count = 132;
  int64_t smem_per_sm = 228 * 1024;
  int64_t smem_per_block_optin = 227 * 1024;
};

// How the KV sequence is cut: every group's keys [0, kv_end) go to splits of keys_per_split keys (a
// multiple of block_n); grid.x = splits. Entries shorter than the longest use fewer splits; their
// other CTAs exit at once.
struct SplitPlan {
  int splits = 1;
  int64_t keys_per_split = 0;
  int ctas_per_sm = 1;
  int stages =
      2; // the config's stages, lowered to what fits a block's shared memory (0: not even 1)
};

// `stages` is an upper bound: head_dim 256 with block_n 64 fits 3 stages in 227 KB, so stages = 4
// runs with 3 there (and block_n 128 at head_dim 256, 128 KB a stage, cannot run).
inline int fitting_stages(const AttentionProblem &p, const Params &c, const DeviceFacts &dev) {
  const int64_t per_stage = int64_t(c.block_n) * p.head_dim * 2 * 2;
  const int64_t fit = dev.smem_per_block_optin / per_stage;
  return fit >= 2 ? static_cast<int>(std::min<int64_t>(c.stages, fit)) : 0;
}

// Resident CTAs per SM: shared memory bound, and the register file (64K registers; about 168 a
// thread at head_dim <= 128, 255 at 256: three 4-warp CTAs, or one 8-warp CTA, at head_dim 128).
inline int ctas_per_sm(const AttentionProblem &p, const Params &c, const DeviceFacts &dev) {
  Params fit = c;
  fit.stages = std::max(fitting_stages(p, c, dev), 1);
  const int64_t by_smem = dev.smem_per_sm / (smem_bytes(p.head_dim, fit) + 1024);
  const int regs = p.head_dim <= 128 ? 168 : 255;
  const int by_regs = std::max(1, 65536 / (regs * threads_of(c)));
  return static_cast<int>(std::clamp<int64_t>(by_smem, 1, by_regs));
}

// The heuristic (num_splits = 0), FlashAttention's wave-efficiency rule adapted to a memory-bound
// kernel: with G groups and one CTA per SM as the target, s splits give waves w = G*s/SMs and
// efficiency w/ceil(w). Take the smallest s whose efficiency is within 5% of the best s in
// [1, max_s], where max_s leaves every split at least four CTA steps (so every warp's ring fills and
// the per-CTA ramp, partial store and combine are paid for by >= 4 steps of streaming). Unlike
// FlashAttention (which keeps 1 split once G >= 0.8 * SMs and accepts 85% of the best), a
// half-empty last wave here is not hidden by the other CTAs' arithmetic.
// The target is one CTA per SM, not every resident slot. Measured on the H200: at 2 resident CTAs
// per SM, targeting every resident slot took twice the splits (B=1 GQA: 32, B=8:
// 4, MHA B=1: 8) and each ran 2-8% slower than half as many (B=1 L=8k 19.5 -> 18.0 us, L=128k 130.0
// -> 125.7 us): the stream is DRAM-bound with one CTA's rings per SM, and more CTAs only add
// partials to combine and ragged finishes.
inline SplitPlan split_plan(const AttentionProblem &p, const Params &c, const DeviceFacts &dev) {
  SplitPlan plan;
  plan.stages = fitting_stages(p, c, dev);
  plan.ctas_per_sm = ctas_per_sm(p, c, dev);
  const int64_t len = std::max<int64_t>(max_kv_len(p), 1);
  const int64_t tiles = (len + c.block_n - 1) / c.block_n;
  int s = c.num_splits;
  if (s == 0) {
    const double slots = double(dev.sm_count);
    const double groups = double(num_groups(p));
    const int max_s = static_cast<int>(std::clamp<int64_t>(tiles / 4, 1, kMaxSplits));
    auto eff = [&](int n) {
      const double w = groups * n / slots;
      return w / std::ceil(w);
    };
    double best = 0;
    for (int n = 1; n <= max_s; ++n)
      best = std::max(best, eff(n));
    s = 1;
    for (int n = 1; n <= max_s; ++n)
      if (eff(n) >= 0.95 * best) {
        s = n;
        break;
      }
  }
  const int64_t tiles_per_split = (tiles + s - 1) / s;
  plan.keys_per_split = tiles_per_split * c.block_n;
  plan.splits = static_cast<int>((tiles + tiles_per_split - 1) / tiles_per_split);
  return plan;
}

// Workspace: partial O (fp32, normalised) and partial LSE (log2 units) of every (group, split, row).
struct WorkspaceLayout {
  size_t o_offset = 0, lse_offset = 0, total = 0;
};
constexpr size_t round_up_256(size_t n) { return (n + 255) / 256 * 256; }
inline WorkspaceLayout workspace_layout(const AttentionProblem &p, const SplitPlan &plan) {
  WorkspaceLayout w;
  if (plan.splits <= 1)
    return w; // every group writes its final O directly
  const size_t slots = size_t(num_groups(p)) * size_t(plan.splits) * kRowsPerCta;
  w.lse_offset = round_up_256(slots * size_t(p.head_dim) * sizeof(float));
  w.total = w.lse_offset + round_up_256(slots * sizeof(float));
  return w;
}

// Semaphores (LaunchArgs::semaphores, zero on entry and on exit): the fused combine's arrival counter of
// every group, 32 bits each; the last CTA of a group to arrive resets its counter to 0.
inline size_t semaphore_bytes(const AttentionProblem &p, const Params &c, const SplitPlan &plan) {
  if (plan.splits <= 1 || c.fused == 0)
    return 0;
  return round_up_256(size_t(num_groups(p)) * sizeof(unsigned int));
}

// The launch entry points (flash_decoding_bf16.cu, flash_decoding_fp16.cu). Launches may share a workspace and
// semaphores in stream order: the partials are rewritten before they are read, and the arrival counters are
// left at zero.
void launch_bf16(const AttentionProblem &p, const Params &c, const SplitPlan &plan,
                 const LaunchArgs &args, cudaStream_t stream);
void launch_fp16(const AttentionProblem &p, const Params &c, const SplitPlan &plan,
                 const LaunchArgs &args, cudaStream_t stream);
std::vector<KernelDesc> kernel_descs(const AttentionProblem &p, const Params &c,
                                     const SplitPlan &plan);
std::vector<KernelDesc> kernel_descs_fp16(const AttentionProblem &p, const Params &c,
                                          const SplitPlan &plan);

} // namespace fb::fdec
