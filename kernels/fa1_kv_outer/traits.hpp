// FA1 (KV-outer): the config space, the tile geometry that the kernel and the traffic model share,
// the shared memory budget, and the launch entry point (fa1_kv_outer.cu). Host-only code may
// include this file.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"
#include "kernels/common/mask.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace fb::fa1 {

// Each warp processes this many query rows at a time, so that one K column read from shared memory
// serves four dot products and one V element four accumulators.
constexpr int kRowsPerPass = 4;
constexpr int kMaxHeadDim = 256;
// K rows are padded by 4 floats: 16-byte aligned for float4 reads, and an odd multiple of 4 words
// apart, so the eight lanes of each quarter-warp hit distinct banks.
constexpr int kKPad = 4;

struct Params {
  int block_m = 64; // query rows per Q tile
  int block_n = 64; // key rows per K/V tile
  int q_tiles_per_cta =
      4; // consecutive Q tiles one CTA owns; 0 = all tiles of the head (FA1's original form)
  int threads = 256;
};

// The kernel's own limits, wider than the axes: block_n up to two key columns per lane in float4
// groups, at most 256 threads (the launch bound). A reason when a hand-built config breaks them.
inline std::optional<std::string> config_problem(const Params &c) {
  if (c.block_m < 1)
    return "block_m must be at least 1";
  if (c.block_n < 4 || c.block_n > 64 || c.block_n % 4 != 0)
    return "block_n must be a multiple of 4 up to 64";
  if (c.q_tiles_per_cta < 0)
    return "q_tiles_per_cta must be 0 (all) or positive";
  if (c.threads < 32 || c.threads > 256 || c.threads % 32 != 0)
    return "threads must be a multiple of 32 up to 256";
  return std::nullopt;
}

inline Params params_of(const Config &c) {
  const Params d;
  return Params{static_cast<int>(c.get_or("block_m", d.block_m)),
                static_cast<int>(c.get_or("block_n", d.block_n)),
                static_cast<int>(c.get_or("q_tiles_per_cta", d.q_tiles_per_cta)),
                static_cast<int>(c.get_or("threads", d.threads))};
}

Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &dev);

inline ConfigSpace make_space() {
  const Params d;
  return ConfigSpace(
      {Axis{"block_m", {16, 32, 64}, {}, "query rows per Q tile"},
       Axis{"block_n", {16, 32, 64}, {}, "key rows per K/V tile (the outer loop's step)"},
       Axis{"q_tiles_per_cta",
            {0, 1, 4, 16},
            {},
            "Q tiles per CTA, each K/V tile is loaded once per CTA; 0 = all"},
       Axis{"threads", {128, 256}, {}, "threads per CTA"}},
      Config({{"block_m", d.block_m},
              {"block_n", d.block_n},
              {"q_tiles_per_cta", d.q_tiles_per_cta},
              {"threads", d.threads}}),
      [](const Config &c) { return config_problem(params_of(c)); }, default_for);
}

inline bool head_dim_ok(int64_t d) { return d >= 8 && d <= kMaxHeadDim && d % 8 == 0; }

// Dynamic shared memory: K tile (padded rows), V tile, and per warp kRowsPerPass rows of Q and of
// P, all fp32.
inline int64_t smem_bytes(int64_t head_dim, const Params &c) {
  const int64_t warps = c.threads / 32;
  const int64_t floats = int64_t(c.block_n) * (head_dim + kKPad) + int64_t(c.block_n) * head_dim +
                         warps * kRowsPerPass * head_dim + warps * kRowsPerPass * c.block_n;
  return floats * int64_t(sizeof(float));
}

// The default config of a problem (ConfigSpace::default_config(p, dev)): the base (64 x 64 tiles, 4 Q tiles a
// CTA, 256 threads) where its shared memory fits the device; else block_n 32, then 16 (d256 on an A100: 173.1 KB
// at block_n 64, 166.9 KB allowed; 103 KB at 32).
inline Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &dev) {
  for (int bn : {32, 16})
    if (dev.smem_per_block_optin > 0 &&
        smem_bytes(p.head_dim, params_of(base)) > dev.smem_per_block_optin)
      base.set("block_n", bn);
  return base;
}

inline int64_t num_q_tiles(const AttentionProblem &p, const Params &c) {
  return (p.seqlen_q + c.block_m - 1) / c.block_m;
}
// Q tiles per CTA after resolving 0 (= all).
inline int64_t tiles_per_cta(const AttentionProblem &p, const Params &c) {
  return c.q_tiles_per_cta == 0 ? num_q_tiles(p, c)
                                : std::min<int64_t>(c.q_tiles_per_cta, num_q_tiles(p, c));
}
inline int64_t num_q_chunks(const AttentionProblem &p, const Params &c) {
  const int64_t t = tiles_per_cta(p, c);
  return (num_q_tiles(p, c) + t - 1) / t;
}

// The last K/V tile that Q tile i must visit (its last row's last visible key), or -1 when no row
// of the tile sees any key. Monotone in i, so a CTA's last K/V step is its last tile's.
FB_HOST_DEVICE int64_t last_kv_tile(int64_t i, int64_t block_m, int64_t block_n, int64_t seqlen_q,
                                    int64_t seqlen_kv, bool causal) {
  int64_t last_row = (i + 1) * block_m - 1;
  if (last_row > seqlen_q - 1)
    last_row = seqlen_q - 1;
  const int64_t visible = fb::kernels::visible_keys(last_row, seqlen_q, seqlen_kv, causal);
  return visible == 0 ? -1 : (visible - 1) / block_n;
}

// fp32 running state in HBM, in the kernel's own dense [batch, heads_q, seqlen_q] row order
// (independent of the problem's layout): O (head_dim floats per row), then l and m (one float per
// row each).
struct WorkspaceLayout {
  size_t o_offset = 0, l_offset = 0, m_offset = 0, total = 0;
};
constexpr size_t round_up_256(size_t n) { return (n + 255) / 256 * 256; }
inline WorkspaceLayout workspace_layout(const AttentionProblem &p) {
  const size_t rows = static_cast<size_t>(p.lse_elems());
  WorkspaceLayout w;
  w.l_offset = round_up_256(rows * static_cast<size_t>(p.head_dim) * sizeof(float));
  w.m_offset = w.l_offset + round_up_256(rows * sizeof(float));
  w.total = w.m_offset + round_up_256(rows * sizeof(float));
  return w;
}

// HBM bytes the kernel's loop structure moves, counted from the same tile walk the kernel makes
// (see the kernel file's header for the per-step pattern). Every (batch, q head) does the same
// walk.
// Blocks of this config resident on one SM: shared memory, registers (the kernel's launch bounds cap it at 128 per
// thread) and warps.
inline int64_t ctas_per_sm(const AttentionProblem &p, const Params &c, const DeviceInfo &dev) {
  const int64_t smem = smem_bytes(p.head_dim, c) + 1024; // the runtime reserves 1 KB per block
  const int64_t by_smem = smem > 0 ? dev.smem_per_sm / smem : 64;
  const int64_t by_regs = dev.regs_per_sm / (128 * static_cast<int64_t>(c.threads));
  const int64_t by_warps = dev.max_threads_per_sm / c.threads;
  return std::max<int64_t>(1,
                           std::min({by_smem, by_regs, by_warps, int64_t(dev.max_blocks_per_sm)}));
}

// Enqueues the kernel on `stream` (fa1_kv_outer.cu).
// The kernel launch() queues, for the occupancy report.
std::vector<KernelDesc> kernels(const AttentionProblem &p, const Params &c);

void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream);

} // namespace fb::fa1
