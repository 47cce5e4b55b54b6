// What the backward kernels share on the host and the device: the padded per-(batch, head) row buffers of the
// fp32 workspace (dQ accumulator, base-2 LSE, D = rowsum(dO∘O)), which (row block, column block) pairs a
// column-parallel backward visits, with causal masks aligned bottom-right (mask.hpp), and the order in which its
// column blocks are launched.
#pragma once

#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"
#include "kernels/common/host_device.hpp"
#include "kernels/common/mask.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace fb::kernels::bwd {

// Rows of the padded per-(batch, head) buffers: a whole number of row blocks, so that a main kernel reads LSE
// and D and adds dQ without row predicates.
inline int64_t padded_rows(int64_t seqlen_q, int block_m) {
  return (seqlen_q + block_m - 1) / block_m * block_m;
}

// Whether a dQ accumulator order (kernels/common/bwd_rows.cuh) keeps pairs of rows adjacent, so that the convert
// kernel reads two rows a thread, rather than pairs of columns.
template <class Order> constexpr bool row_pairs() {
  if constexpr (requires { Order::kRowPairs; })
    return Order::kRowPairs;
  else
    return false;
}
// The rows of the convert kernel's grid: one a thread, or one pair of rows a thread.
template <class Order> constexpr int64_t convert_rows(int64_t seqlen_q) {
  return row_pairs<Order>() ? (seqlen_q + 1) / 2 : seqlen_q;
}

// Workspace (fp32, not zero on entry): dQ accumulator [batch, heads_q, padded rows, head_dim], then the base-2
// LSE and D, each [batch, heads_q, padded rows]. The preprocess kernel (bwd_rows.cuh) writes all three. Every
// offset is a multiple of 16 bytes when block_m is a multiple of 4 (bulk copies of LSE and D rows need that).
struct Workspace {
  int64_t dq_acc = 0, lse2 = 0, delta = 0, total = 0; // byte offsets and size
};
inline Workspace workspace_layout(const AttentionProblem &p, int block_m) {
  const int64_t rows = p.batch * p.heads_q * padded_rows(p.seqlen_q, block_m);
  Workspace w;
  w.dq_acc = 0;
  w.lse2 = 4 * rows * p.head_dim;
  w.delta = w.lse2 + 4 * rows;
  w.total = w.delta + 4 * rows;
  return w;
}

// Row blocks that column block n visits: from the first one holding a row that sees key n·block_n (causal:
// bottom-right aligned) to the last; first == end when no row sees it.
struct RowRange {
  int64_t first, end;
};
FB_HOST_DEVICE RowRange row_blocks_for(int64_t n, int64_t block_m, int64_t block_n,
                                       int64_t seqlen_q, int64_t seqlen_kv, bool causal) {
  const int64_t end = (seqlen_q + block_m - 1) / block_m;
  if (!causal)
    return {0, end};
  const int64_t first_row =
      n * block_n - (seqlen_kv - seqlen_q); // first row that sees key n·block_n
  if (first_row > seqlen_q - 1)
    return {end, end};
  return {first_row <= 0 ? 0 : first_row / block_m, end};
}

// Column blocks that visit row block m: 0 .. the one holding its last row's last visible key (0 when no row of
// the block sees a key).
FB_HOST_DEVICE int64_t col_blocks_for(int64_t m, int64_t block_m, int64_t block_n, int64_t seqlen_q,
                                      int64_t seqlen_kv, bool causal) {
  int64_t last_row = (m + 1) * block_m - 1;
  if (last_row > seqlen_q - 1)
    last_row = seqlen_q - 1;
  const int64_t visible = visible_keys(last_row, seqlen_q, seqlen_kv, causal);
  return (visible + block_n - 1) / block_n;
}

// Row order `rotated` (non-causal): column block n of C starts at row block rotated_start(n) = floor(n·R / C) of R
// and wraps around, so that at any moment the column blocks of a head are on different row blocks and their dQ
// additions do not all meet on one. Deterministic mode then adds a row block's partials in the order the columns
// reach it when all run at one speed (no column waits in that steady state): the columns whose start is at or
// before m in descending n, then the others in descending n. rotated_rank is n's place in that order (0: first,
// C - 1: last, which resets the row block's counter).
FB_HOST_DEVICE int rotated_start(int n, int rows, int cols) {
  return static_cast<int>(static_cast<unsigned>(n) * static_cast<unsigned>(rows) /
                          static_cast<unsigned>(cols));
}
FB_HOST_DEVICE int rotated_rank(int n, int m, int rows, int cols) {
  // Columns 0 .. k-1 start at or before m: n·R / C < m + 1 for n < (m + 1)·C / R.
  const unsigned kc = (static_cast<unsigned>(m + 1) * static_cast<unsigned>(cols) +
                       static_cast<unsigned>(rows) - 1) /
                      static_cast<unsigned>(rows);
  const int k = kc < static_cast<unsigned>(cols) ? static_cast<int>(kc) : cols;
  return n < k ? k - 1 - n : k + cols - 1 - n;
}

// The launch order of a backward's column blocks (the `order` axis of fa2_bwd and fa3_bwd): see grid_order.
constexpr int kOrderNatural = 0;
constexpr int kOrderLpt = 1;
constexpr int kOrderSections = 2;

// The CTA order of a launch: CTA x of the grid (x fastest, then the flattened kv head and batch) takes column
// block col of (batch, kv head) bh.
//  - natural: bh = x / cols; within it col = x % cols, from the last column block when deterministic (a row
//    block's dQ partials are added from the rightmost column block leftwards: a causal diagonal block reaches its
//    row block first, so a CTA only waits on CTAs launched before it), from the first otherwise;
//  - lpt: col = x / (heads_kv · batch), bh = x % (heads_kv · batch): every head's first column block, the longest
//    under a causal mask, before any head's second (longest processing time first keeps the grid's tail short).
//    The CTAs in flight then belong to every head at once: where the heads' Q, dO and dQ rows exceed the L2, each
//    CTA streams them from DRAM, and every bulk dQ add is a read-modify-write in DRAM;
//  - sections: the (batch, kv head) pairs cut into `sections` runs of consecutive pairs (sizes differing by at
//    most one, the larger first), and lpt inside each run: its pairs' first column blocks, then their second, ...
//    (section_count sizes the runs so that the CTAs in flight share their rows through L2).
struct GridSlot {
  int64_t col, bh;
};
template <class I>
FB_HOST_DEVICE GridSlot grid_order_in(I x, I cols, I bh_count, int order, bool deterministic,
                                      I sections) {
  if (order == kOrderLpt)
    return {x / bh_count, x % bh_count};
  if (order == kOrderSections) {
    const I small = bh_count / sections, big = bh_count % sections;
    const I big_ctas = big * (small + 1) * cols;
    const I n = x < big_ctas ? small + 1 : small; // pairs in x's section
    const I u = x < big_ctas ? x : x - big_ctas;  // x counted from the first section of its size
    const I s = u / (n * cols),
            r = u - s * n * cols; // section (among its size) and place in it
    const I first = x < big_ctas ? s * (small + 1) : big * (small + 1) + s * small;
    return {r / n, first + r % n};
  }
  const I c = x % cols;
  return {deterministic ? cols - 1 - c : c, x / cols};
}
// The same in 64-bit arithmetic (the host's). The kernel calls grid_order_in<int>: a grid has fewer than 2^31 CTAs,
// so every intermediate fits, and the kernel is spared a 64-bit division (fa3_bwd's producer warps have 24 registers).
FB_HOST_DEVICE GridSlot grid_order(int64_t x, int64_t cols, int64_t bh_count, int order,
                                   bool deterministic, int64_t sections = 1) {
  return grid_order_in<int64_t>(x, cols, bh_count, order, deterministic, sections);
}

// The sections of the `sections` order: as few as keep a section's rows within half the L2, and a section's CTAs
// within two waves (each backward's main kernel fits one CTA an SM), so that a head's column blocks run close
// together and its Q, dO and dQ rows are read from DRAM about once. A (batch, kv head) pair's rows: Q and dO of its
// query heads, 16-bit, and their fp32 dQ accumulator, 8 bytes per element. Where a section holds a wave or more,
// it is cut down to a whole number of waves: sections of 1.5 waves (3 heads of 64 causal column blocks on 132
// SMs) left SMs idle at each section's end, 5% of fa2_bwd's time at d128 N 8192 against lpt, as a greedy
// simulation of the launch predicts (kernels/fa2_bwd/HISTORY.md).
inline int64_t section_count(const AttentionProblem &p, int block_m, int64_t cols, int64_t sms,
                             int64_t l2_bytes) {
  const int64_t pairs = p.batch * p.heads_kv;
  const int64_t rows_bytes = 8 * padded_rows(p.seqlen_q, block_m) * p.head_dim * p.group_size();
  cols = std::max<int64_t>(1, cols), sms = std::max<int64_t>(1, sms);
  int64_t per = std::max<int64_t>(1, (l2_bytes / 2) / std::max<int64_t>(1, rows_bytes));
  per = std::min(per, std::max<int64_t>(1, 2 * sms / cols));
  if (const int64_t waves = per * cols / sms; waves >= 1)
    per = std::max<int64_t>(1, waves * sms / cols);
  per = std::min(per, pairs);
  return (pairs + per - 1) / per;
}

// A compiled instantiation of a backward variant with config parameters P, as its register.cpp finds it: the launch
// (preprocess, main and convert kernels on a stream) and the kernels one launch queues, for the occupancy report.
template <class P> struct Instance {
  using LaunchFn = void (*)(const AttentionProblem &, const P &, const LaunchArgs &, cudaStream_t);
  using KernelsFn = std::vector<KernelDesc> (*)(const AttentionProblem &, const P &);
  LaunchFn launch = nullptr;
  KernelsFn kernels = nullptr;
};

} // namespace fb::kernels::bwd
