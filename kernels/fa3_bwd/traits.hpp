// FA3-style backward for Hopper (TMA, WGMMA, warp specialization): the config space, the tile geometry and
// shared-memory map that the kernel, supports(), the workspace and the traffic model share, and which shapes are
// compiled. Host-only code may include this file; everything here is constexpr or inline.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/device.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"
#include "kernels/common/bwd.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fb::fa3_bwd {

// A CTA owns one column block of kBlockN keys: two consumer warpgroups of 64 keys each (one m64 WGMMA row block
// of Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, and of the dK and dV accumulators), plus a producer warpgroup that issues the TMA
// loads. Both consumers hold dK and dV for their keys in registers: 2 · 64 · head_dim fp32 over 128 threads is
// head_dim registers a thread, so head_dim 256 (256 registers for dK and dV alone) does not fit the 240 a
// consumer gets.
constexpr int kKeysPerWarpgroup = 64;
constexpr int kConsumers = 2;
constexpr int kBlockN = kKeysPerWarpgroup * kConsumers;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kMaxStages = 2;
// setmaxnreg budgets: 24 x 128 + 240 x 256 = 64512 of the SM's 65536 registers.
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;

constexpr int kOrderNatural = 0;
constexpr int kOrderLpt = 1;

// Query rows per row block (the inner loop's step). Each consumer's Sᵀ and dPᵀ are then 64 x 64 (32 + 32
// registers), dK and dV 64 x head_dim (head_dim registers), and its dQ slice 64 x head_dim/2 (dQ = dS·K is split
// between the two consumers by columns). block_m 128 at head_dim 64 (Sᵀ and dPᵀ 64 + 64 registers, dQ split by
// rows) spilled 48 bytes and had ptxas serialise its WGMMAs for want of registers.
constexpr int kBlockM = 64;

struct Params {
  int stages = 2;            // Q/dO/LSE/D row blocks in the shared-memory ring
  int order = kOrderNatural; // launch order of the column blocks (see grid_order)
  int deterministic = 0;     // 1: column blocks add their dQ partials in a fixed order
};

constexpr bool head_dim_ok(int64_t d) { return d == 64 || d == 128; }

inline std::optional<std::string> config_problem(const Params &c) {
  if (c.stages < 1 || c.stages > kMaxStages)
    return "stages must be 1 or 2";
  if (c.order != kOrderNatural && c.order != kOrderLpt)
    return "order must be natural or lpt";
  if (c.deterministic != 0 && c.deterministic != 1)
    return "deterministic must be off or on";
  if (c.deterministic && c.order != kOrderNatural)
    return "deterministic fixes the launch order (each (batch, head) from its last column block, "
           "the "
           "order in which the dQ partials are added): use order natural";
  return std::nullopt;
}

inline Params params_of(const Config &c) {
  const Params d;
  return Params{static_cast<int>(c.get_or("stages", d.stages)),
                static_cast<int>(c.get_or("order", d.order)),
                static_cast<int>(c.get_or("deterministic", d.deterministic))};
}

// The default of a problem: 2 stages; lpt only where column blocks differ in length (causal) and the order is
// free (not deterministic).
inline Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &) {
  const bool det = base.get_or("deterministic", 0) != 0;
  base.set("order", p.causal && !det ? kOrderLpt : kOrderNatural);
  return base;
}

inline ConfigSpace make_space() {
  const Params d;
  return ConfigSpace(
      {Axis{"stages",
            {1, 2},
            {},
            "Q/dO/LSE/D row blocks in the TMA ring (2: the next loads during this one)"},
       Axis{"order",
            {kOrderNatural, kOrderLpt},
            {"natural", "lpt"},
            "launch order: natural (each head's column blocks together) or lpt (longest column "
            "blocks of every head first; causal)"},
       Axis{"deterministic",
            {0, 1},
            {"off", "on"},
            "on: column blocks add dQ in a fixed order (per-row-block counters), bit-identical run "
            "to run"}},
      Config({{"stages", d.stages}, {"order", d.order}, {"deterministic", d.deterministic}}),
      [](const Config &c) { return config_problem(params_of(c)); }, default_for);
}

inline int64_t num_row_blocks(const AttentionProblem &p) {
  return (p.seqlen_q + kBlockM - 1) / kBlockM;
}
inline int64_t num_col_blocks(const AttentionProblem &p) {
  return (p.seqlen_kv + kBlockN - 1) / kBlockN;
}
// Semaphores (deterministic only): one int per (batch, query head, row block), the number of column blocks that
// have added their dQ partial to it so far (zero between launches).
inline int64_t semaphore_count(const AttentionProblem &p, const Params &c) {
  return c.deterministic ? p.batch * p.heads_q * num_row_blocks(p) : 0;
}

// Shared memory, every tile 1024-byte aligned (the 128B swizzle): K and V of the column block; `stages` slots of
// Q and dO (TMA, 128B-swizzled column chunks of 64) with the row block's base-2 LSE and D; two dS buffers
// (bf16/fp16, [block_m][128 keys] in two 64-key chunks: the A operand of dQ = dS·K, written by both consumers);
// the mbarriers.
struct SmemMap {
  int64_t k = 0, v = 0, slots = 0, slot_bytes = 0, q = 0, dout = 0, lse2 = 0, delta = 0, ds = 0,
          ds_bytes = 0, bars = 0, total = 0;
};
constexpr int64_t align1k(int64_t x) { return (x + 1023) / 1024 * 1024; }
constexpr SmemMap smem_map(int64_t head_dim, int stages) {
  constexpr int block_m = kBlockM;
  SmemMap m;
  const int64_t kv = int64_t(kBlockN) * head_dim * 2, qt = int64_t(block_m) * head_dim * 2;
  m.k = 0;
  m.v = kv;
  m.slots = 2 * kv;
  m.q = 0; // offsets inside a slot
  m.dout = qt;
  m.lse2 = 2 * qt;
  m.delta = 2 * qt + 4 * block_m;
  m.slot_bytes = align1k(2 * qt + 8 * block_m);
  m.ds = m.slots + stages * m.slot_bytes;
  m.ds_bytes = int64_t(block_m) * kBlockN * 2;
  m.bars = m.ds + 2 * m.ds_bytes;
  m.total = m.bars + 8 * (1 + 2 * kMaxStages) + 1024; // + the base's alignment slack
  return m;
}
inline int64_t smem_bytes(int64_t head_dim, const Params &c) {
  return smem_map(head_dim, c.stages).total;
}

// The CTA order of a launch: CTA x of the grid (x fastest, then the flattened kv head and batch) takes column
// block col of (batch, kv head) bh.
//  - natural: bh = x / cols; within it col = x % cols, from the last column block when deterministic (a row
//    block's dQ partials are added from the rightmost column block leftwards: a causal diagonal block reaches its
//    row block first, so a CTA only waits on CTAs launched before it), from the first otherwise;
//  - lpt: col = x / (heads_kv · batch), bh = x % (heads_kv · batch): every head's first column block, the longest
//    under a causal mask, before any head's second (longest processing time first keeps the grid's tail short).
struct GridSlot {
  int64_t col, bh;
};
FB_HOST_DEVICE GridSlot grid_order(int64_t x, int64_t cols, int64_t bh_count, int order,
                                   bool deterministic) {
  if (order == kOrderLpt)
    return {x / bh_count, x % bh_count};
  const int64_t c = x % cols;
  return {deterministic ? cols - 1 - c : c, x / cols};
}

using kernels::bwd::col_blocks_for;
using kernels::bwd::padded_rows;
using kernels::bwd::row_blocks_for;
using kernels::bwd::RowRange;
using kernels::bwd::Workspace;
inline Workspace workspace_layout(const AttentionProblem &p, const Params &) {
  return kernels::bwd::workspace_layout(p, kBlockM);
}

using LaunchFn = void (*)(const AttentionProblem &, const Params &, const LaunchArgs &,
                          cudaStream_t);
using KernelsFn = std::vector<KernelDesc> (*)(const AttentionProblem &, const Params &);
struct Instance {
  LaunchFn launch = nullptr;
  KernelsFn kernels = nullptr;
};

// Enqueues the preprocess, main and convert kernels on `stream`; the caller has checked supports(). A shape that
// was not compiled throws std::invalid_argument.
void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream);
std::vector<KernelDesc> kernels(const AttentionProblem &p, const Params &c);

} // namespace fb::fa3_bwd
