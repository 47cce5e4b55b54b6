// What the backward kernels share on the host and the device: the padded per-(batch, head) row buffers of the
// fp32 workspace (dQ accumulator, base-2 LSE, D = rowsum(dO∘O)), and which (row block, column block) pairs a
// column-parallel backward visits, with causal masks aligned bottom-right (mask.hpp).
#pragma once

#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"
#include "kernels/common/host_device.hpp"
#include "kernels/common/mask.hpp"

#include <cstdint>
#include <vector>

namespace fb::kernels::bwd {

// Rows of the padded per-(batch, head) buffers: a whole number of row blocks, so that a main kernel reads LSE
// and D and adds dQ without row predicates.
inline int64_t padded_rows(int64_t seqlen_q, int block_m) {
  return (seqlen_q + block_m - 1) / block_m * block_m;
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

// A compiled instantiation of a backward variant with config parameters P, as its register.cpp finds it: the launch
// (preprocess, main and convert kernels on a stream) and the kernels one launch queues, for the occupancy report.
template <class P> struct Instance {
  using LaunchFn = void (*)(const AttentionProblem &, const P &, const LaunchArgs &, cudaStream_t);
  using KernelsFn = std::vector<KernelDesc> (*)(const AttentionProblem &, const P &);
  LaunchFn launch = nullptr;
  KernelsFn kernels = nullptr;
};

} // namespace fb::kernels::bwd
