// The per-row kernels around a column-parallel attention backward (FA2's and FA3's structure):
//  - preprocess, before the main kernel: per query row, D = rowsum(dO∘O) in fp32 and the LSE in base 2 (+inf
//    for a row that sees no key, so that its P = exp2(S·c − LSE) is 0 rather than NaN); it also zeroes the fp32
//    dQ accumulator. Rows are padded to a whole number of row blocks (LSE +inf, D 0), so a main kernel needs no
//    row predicates for them.
//  - convert, after it: dQ = scale · accumulator, in the input type. The accumulator of a (batch, head) is
//    row-major (RowMajorOrder) or in a main kernel's own order of its rows_pad x D elements (an Order type with
//    offset<D>(row, col), such as fa3_bwd's DqTileOrder), which keeps either each pair of columns (col, col + 1)
//    of a row adjacent, or, where it declares kRowPairs, each pair of rows (2i, 2i + 1) of a column.
// The workspace layout is kernels/common/bwd.hpp's.
#pragma once

#include "flashbench/check.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"
#include "kernels/common/bwd.hpp"
#include "kernels/common/mma.cuh"

#include <cuda_runtime.h>

namespace fb::kernels::bwd {

template <class T> struct RowArgs {
  const T *o, *dout;
  const float *lse; // natural-log LSE of the forward, [batch, heads_q, seqlen_q]
  T *dq;
  float *dq_acc, *lse2, *delta; // workspace
  int seqlen_q, rows_pad, heads_q;
  Strides qs; // Q, O, dO, dQ
  float scale;
};

template <class T>
RowArgs<T> row_args(const AttentionProblem &p, const LaunchArgs &args, int block_m) {
  const Workspace ws = workspace_layout(p, block_m);
  unsigned char *w = static_cast<unsigned char *>(args.workspace);
  RowArgs<T> a{};
  a.o = static_cast<const T *>(args.o);
  a.dout = static_cast<const T *>(args.dout);
  a.lse = args.lse;
  a.dq = static_cast<T *>(args.dq);
  a.dq_acc = reinterpret_cast<float *>(w + ws.dq_acc);
  a.lse2 = reinterpret_cast<float *>(w + ws.lse2);
  a.delta = reinterpret_cast<float *>(w + ws.delta);
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.rows_pad = static_cast<int>(padded_rows(p.seqlen_q, block_m));
  a.heads_q = static_cast<int>(p.heads_q);
  a.qs = p.q_strides();
  a.scale = static_cast<float>(p.softmax_scale());
  return a;
}

// Values the optimiser can neither hoist out of a main kernel's row-block loop nor keep live across it: per-lane
// addresses (ldmatrix bases, copy offsets, mask coordinates, shared-memory rows) are recomputed from these each
// iteration for a few integer instructions, instead of hoisted registers that spill next to the dK and dV
// accumulators.
__device__ __forceinline__ unsigned fresh_tid() {
  unsigned t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// Threads of the preprocess and convert kernels; D / 8 lanes (16 bytes each) per row.
constexpr int kRowThreads = 256;

template <class T, int D>
__global__ void __launch_bounds__(kRowThreads) bwd_preprocess(const RowArgs<T> a) {
  constexpr int kLanes = D / 8, kRows = kRowThreads / kLanes;
  constexpr float kLog2e = 1.4426950408889634f;
  const int tid = threadIdx.x, ch = tid % kLanes;
  const int row = blockIdx.x * kRows + tid / kLanes, h = blockIdx.y, b = blockIdx.z;
  float dot = 0.f;
  if (row < a.seqlen_q) {
    const int64_t off =
        int64_t(b) * a.qs.batch + int64_t(row) * a.qs.seq + int64_t(h) * a.qs.head + ch * 8;
    const uint4 o = *reinterpret_cast<const uint4 *>(a.o + off);
    const uint4 d = *reinterpret_cast<const uint4 *>(a.dout + off);
    const T *ov = reinterpret_cast<const T *>(&o), *dv = reinterpret_cast<const T *>(&d);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      dot = fmaf(float(ov[i]), float(dv[i]), dot);
  }
#pragma unroll
  for (int s = kLanes / 2; s > 0; s /= 2)
    dot += __shfl_xor_sync(0xffffffffu, dot, s);
  if (row >= a.rows_pad)
    return;
  const int64_t r = (int64_t(b) * a.heads_q + h) * a.rows_pad + row;
  if (ch == 0) {
    const float lse =
        row < a.seqlen_q ? a.lse[(int64_t(b) * a.heads_q + h) * a.seqlen_q + row] : -INFINITY;
    a.delta[r] = dot;
    a.lse2[r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
  float4 *z = reinterpret_cast<float4 *>(a.dq_acc + r * D + ch * 8);
  z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
  z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
}

struct RowMajorOrder {
  static constexpr bool kRowMajor = true;
  template <int D> FB_HOST_DEVICE static int64_t offset(int row, int col) {
    return int64_t(row) * D + col;
  }
};
template <class T>
__device__ __forceinline__ void store_dq_row(const RowArgs<T> &a, int b, int h, int row, int ch,
                                             const float (&v)[8]) {
  const float s = a.scale;
  uint4 out;
  out.x = Mma<T>::pack(v[0] * s, v[1] * s);
  out.y = Mma<T>::pack(v[2] * s, v[3] * s);
  out.z = Mma<T>::pack(v[4] * s, v[5] * s);
  out.w = Mma<T>::pack(v[6] * s, v[7] * s);
  *reinterpret_cast<uint4 *>(a.dq + int64_t(b) * a.qs.batch + int64_t(row) * a.qs.seq +
                             int64_t(h) * a.qs.head + ch * 8) = out;
}

template <class T, int D, class Order = RowMajorOrder>
__global__ void __launch_bounds__(kRowThreads) bwd_convert(const RowArgs<T> a) {
  constexpr int kLanes = D / 8, kRows = kRowThreads / kLanes, kStep = row_pairs<Order>() ? 2 : 1;
  const int tid = threadIdx.x, ch = tid % kLanes;
  const int row = (blockIdx.x * kRows + tid / kLanes) * kStep, h = blockIdx.y, b = blockIdx.z;
  if (row >= a.seqlen_q)
    return;
  const float *head = a.dq_acc + (int64_t(b) * a.heads_q + h) * a.rows_pad * D;
  float x[8];
  if constexpr (Order::kRowMajor) {
    const float4 *src =
        reinterpret_cast<const float4 *>(head + Order::template offset<D>(row, ch * 8));
    const float4 p = src[0], q = src[1];
    const float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 8; ++k)
      x[k] = v[k];
  } else if constexpr (
      kStep == 2) { // rows `row` and `row + 1` of a column are adjacent (the pair is in rows_pad)
    float y[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float2 v =
          *reinterpret_cast<const float2 *>(head + Order::template offset<D>(row, ch * 8 + k));
      x[k] = v.x, y[k] = v.y;
    }
    if (row + 1 < a.seqlen_q)
      store_dq_row(a, b, h, row + 1, ch, y);
  } else { // columns `col` and `col + 1` of a row are adjacent
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 v =
          *reinterpret_cast<const float2 *>(head + Order::template offset<D>(row, ch * 8 + 2 * k));
      x[2 * k] = v.x, x[2 * k + 1] = v.y;
    }
  }
  store_dq_row(a, b, h, row, ch, x);
}

template <int D> dim3 row_grid(int64_t rows, int64_t heads_q, int64_t batch) {
  constexpr int kRows = kRowThreads / (D / 8);
  return dim3(static_cast<unsigned>((rows + kRows - 1) / kRows), static_cast<unsigned>(heads_q),
              static_cast<unsigned>(batch));
}

template <class T, int D>
void launch_preprocess(const RowArgs<T> &a, int64_t batch, cudaStream_t s) {
  bwd_preprocess<T, D><<<row_grid<D>(a.rows_pad, a.heads_q, batch), kRowThreads, 0, s>>>(a);
  FB_CHECK_LAUNCH();
}
template <class T, int D, class Order = RowMajorOrder>
void launch_convert(const RowArgs<T> &a, int64_t batch, cudaStream_t s) {
  bwd_convert<T, D, Order>
      <<<row_grid<D>(convert_rows<Order>(a.seqlen_q), a.heads_q, batch), kRowThreads, 0, s>>>(a);
  FB_CHECK_LAUNCH();
}

// The two kernels' entries in a variant's kernel list (for the occupancy report); `prefix` names the variant.
template <class T, int D>
KernelDesc preprocess_desc(const std::string &prefix, const AttentionProblem &p, int block_m) {
  const dim3 g = row_grid<D>(padded_rows(p.seqlen_q, block_m), p.heads_q, p.batch);
  return {prefix + "_preprocess", reinterpret_cast<const void *>(&bwd_preprocess<T, D>),
          kRowThreads, 0, int64_t(g.x) * g.y * g.z};
}
template <class T, int D, class Order = RowMajorOrder>
KernelDesc convert_desc(const std::string &prefix, const AttentionProblem &p) {
  const dim3 g = row_grid<D>(convert_rows<Order>(p.seqlen_q), p.heads_q, p.batch);
  return {prefix + "_convert", reinterpret_cast<const void *>(&bwd_convert<T, D, Order>),
          kRowThreads, 0, int64_t(g.x) * g.y * g.z};
}

} // namespace fb::kernels::bwd
