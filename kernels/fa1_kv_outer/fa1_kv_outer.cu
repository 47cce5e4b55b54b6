// FlashAttention-1, Algorithm 1 (KV-outer), in plain fp32 SIMT arithmetic.
//
// What it changes relative to naive: S and P never leave the chip. A CTA loads a K/V tile into
// shared memory once, then for each of its Q tiles computes S = scale·Q·Kᵀ and P = exp(S - m) in
// registers and shared memory and folds P·V into the running output with the online-softmax
// rescaling. What it keeps from the unfused world: the running state O (fp32), l and m of every
// query row goes back to HBM after every K/V step and is read again at the next one, and each Q
// tile is re-read from HBM at every step. That round trip is FA1's signature traffic (the one FA2
// removes by swapping the loops), so it is kept on purpose and the traffic model counts it.
//
// Structure: grid = (Q chunks, q heads, batch); a CTA owns q_tiles_per_cta consecutive Q tiles of
// block_m rows.
//   for each K/V tile j up to the CTA's last visible one:      K_j, V_j -> shared (fp32), once per
//   CTA
//     for each Q tile i of the CTA that still sees keys in j:   (causal: fully masked (i, j) pairs
//     are skipped)
//       each warp takes its rows of Q_i, kRowsPerPass at a time: Q rows from HBM; O, l, m from HBM
//       (not at j = 0, where they are known to be 0, 0, -inf); S, row max and sum by warp shuffles;
//       P·V; O, l, m back to HBM, or, at the tile's last step, O in the problem dtype and LSE = m +
//       log l.
// Warps own disjoint rows, so the inner loop needs no CTA barrier: only the K/V reload is
// block-synchronous. Scores are kept in log2 units (Q is pre-multiplied by scale·log2 e) so every
// exponential is one exp2. A row that sees no key keeps m = -inf and l = 0; every exponential
// subtracts a finite stand-in for m, so such rows end as O = 0 and LSE = -inf, never NaN.
#include "kernels/fa1_kv_outer/traits.hpp"

#include "flashbench/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/mask.hpp"
#include "kernels/common/reduce.cuh"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fb::fa1 {
namespace {

using fb::kernels::Elem;

template <class T> struct KernelArgs {
  const T *q;
  const T *k;
  const T *v;
  T *o;
  float *lse;
  float *o_acc; // running state: not const and never read through the non-coherent path, the kernel
                // writes it
  float *l_acc;
  float *m_acc;
  int64_t seqlen_q, seqlen_kv, heads_q, group;
  Strides qs, ks;
  int head_dim, block_m, block_n, tiles_per_cta, num_q_tiles;
  float scale_log2;
  bool causal;
};

__device__ __forceinline__ float fma4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

__device__ __forceinline__ float component(const float4 &v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ void store8(float *dst, const float f[8]) {
  reinterpret_cast<float4 *>(dst)[0] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4 *>(dst)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

// s[r][c] = Q row r · K column (lane + 32c) for the warp's kRowsPerPass rows. NCOLS = 2 only for
// block_n = 64. Lanes past block_n (block_n = 16) compute a duplicate column that the caller masks
// out.
template <int NCOLS>
__device__ __forceinline__ void qk_rows(const float *qw, const float *ks, int ldk, int d, int lane,
                                        int block_n, float s[kRowsPerPass][2]) {
  const float *k0 = ks + (lane % block_n) * ldk;
  const float *k1 = ks + (lane + 32) * ldk;
#pragma unroll
  for (int r = 0; r < kRowsPerPass; ++r)
    s[r][0] = s[r][1] = 0.f;
  for (int x = 0; x < d; x += 4) {
    const float4 a = *reinterpret_cast<const float4 *>(k0 + x);
    float4 b;
    if (NCOLS == 2)
      b = *reinterpret_cast<const float4 *>(k1 + x);
#pragma unroll
    for (int r = 0; r < kRowsPerPass; ++r) {
      const float4 qv = *reinterpret_cast<const float4 *>(qw + r * d + x);
      s[r][0] = fma4(qv, a, s[r][0]);
      if (NCOLS == 2)
        s[r][1] = fma4(qv, b, s[r][1]);
    }
  }
}

// Two CTAs of 256 threads per SM (a 128-register cap): more warps to hide shared-memory latency
// matter more here than the few registers the cap costs (none spilled on sm_90, a few bytes on
// sm_80).
template <class T>
__global__ void __launch_bounds__(256, 2) fa1_kv_outer_kernel(const KernelArgs<T> a) {
  extern __shared__ float4 smem_f4[];
  const int d = a.head_dim, bm = a.block_m, bn = a.block_n, ldk = d + kKPad;
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks_per_row = d / 8;
  float *ks = reinterpret_cast<float *>(smem_f4);
  float *vs = ks + bn * ldk;
  float *qw = vs + bn * d + warp * kRowsPerPass * d;
  float *pw = vs + bn * d + warps * kRowsPerPass * d + warp * kRowsPerPass * bn;

  const int64_t sq = a.seqlen_q, skv = a.seqlen_kv;
  const int64_t b = blockIdx.z, h = blockIdx.y, bh = b * a.heads_q + h, hkv = h / a.group;
  const T *qh = a.q + b * a.qs.batch + h * a.qs.head;
  T *oh = a.o + b * a.qs.batch + h * a.qs.head;
  const T *kh = a.k + b * a.ks.batch + hkv * a.ks.head;
  const T *vh = a.v + b * a.ks.batch + hkv * a.ks.head;
  float *lse_h = a.lse + bh * sq;
  float *oacc_h = a.o_acc + bh * sq * d;
  float *l_h = a.l_acc + bh * sq;
  float *m_h = a.m_acc + bh * sq;

  const int64_t tile0 = int64_t(blockIdx.x) * a.tiles_per_cta;
  const int64_t tile1 = min(int64_t(a.num_q_tiles), tile0 + a.tiles_per_cta);

  // Tiles that no K/V step visits (every row masked): their outputs are final now.
  if (a.causal) {
    for (int64_t i = tile0; i < tile1; ++i) {
      if (last_kv_tile(i, bm, bn, sq, skv, true) >= 0)
        break; // monotone: later tiles are visited
      const int64_t r0 = i * bm, rows = min(int64_t(bm), sq - r0);
      for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x)
        oh[(r0 + e / d) * a.qs.seq + e % d] = Elem<T>::from_float(0.f);
      for (int64_t e = threadIdx.x; e < rows; e += blockDim.x)
        lse_h[r0 + e] = -INFINITY;
    }
  }

  const int64_t j_end = last_kv_tile(tile1 - 1, bm, bn, sq, skv, a.causal) + 1;
  for (int64_t j = 0; j < j_end; ++j) {
    const int64_t kv0 = j * bn;
    const int n_kv = static_cast<int>(min(int64_t(bn), skv - kv0));
    __syncthreads(); // every warp is done with the previous K/V tile
    for (int e = threadIdx.x; e < bn * chunks_per_row; e += blockDim.x) {
      const int r = e / chunks_per_row, x = (e % chunks_per_row) * 8;
      float kf[8], vf[8];
      if (r < n_kv) {
        Elem<T>::load8(kh + (kv0 + r) * a.ks.seq + x, kf);
        Elem<T>::load8(vh + (kv0 + r) * a.ks.seq + x, vf);
      } else {
        // Rows past the sequence end: P is 0 there, and V must be finite so that 0·V stays 0.
#pragma unroll
        for (int t = 0; t < 8; ++t)
          kf[t] = vf[t] = 0.f;
      }
      store8(ks + r * ldk + x, kf);
      store8(vs + r * d + x, vf);
    }
    __syncthreads();
    const int n_c =
        (n_kv + 3) & ~3; // P·V runs over whole float4 groups; the zero padding contributes nothing

    for (int64_t i = tile0; i < tile1; ++i) {
      const int64_t j_last = last_kv_tile(i, bm, bn, sq, skv, a.causal);
      if (j > j_last)
        continue;
      const bool first = j == 0, last = j == j_last;
      const int64_t r0 = i * bm;
      const int rows = static_cast<int>(min(int64_t(bm), sq - r0));

      // Rows of this pass: base + r * warps for r < kRowsPerPass (interleaved so that warps share
      // the tile evenly).
      for (int base = warp; base < rows; base += warps * kRowsPerPass) {
        __syncwarp(); // the previous pass's reads of qw and pw are done
        for (int e = lane; e < kRowsPerPass * chunks_per_row; e += 32) {
          const int r = e / chunks_per_row, x = (e % chunks_per_row) * 8;
          const int lr = base + r * warps;
          float f[8];
          if (lr < rows) {
            Elem<T>::load8(qh + (r0 + lr) * a.qs.seq + x, f);
#pragma unroll
            for (int t = 0; t < 8; ++t)
              f[t] *= a.scale_log2;
          } else {
#pragma unroll
            for (int t = 0; t < 8; ++t)
              f[t] = 0.f;
          }
          store8(qw + r * d + x, f);
        }
        __syncwarp();

        float s[kRowsPerPass][2];
        if (bn > 32)
          qk_rows<2>(qw, ks, ldk, d, lane, bn, s);
        else
          qk_rows<1>(qw, ks, ldk, d, lane, bn, s);

        // Online softmax per row: new max, P = exp2(S - m_new), l_new, and the two weights of the O
        // update
        //   O_new = (l_old·e^(m_old - m_new)·O_old + P·V) / l_new.
        float w_old[kRowsPerPass], w_new[kRowsPerPass], m_new[kRowsPerPass], l_new[kRowsPerPass];
#pragma unroll
        for (int r = 0; r < kRowsPerPass; ++r) {
          const int lr = base + r * warps;
          w_old[r] = w_new[r] = 0.f, m_new[r] = -INFINITY, l_new[r] = 0.f;
          float p0 = 0.f, p1 = 0.f;
          if (lr < rows) { // warp-uniform
            const int64_t row = r0 + lr;
            const int64_t limit =
                fb::kernels::visible_keys(row, sq, skv, a.causal) - kv0; // visible columns
            const float x0 = (lane < bn && lane < limit) ? s[r][0] : -INFINITY;
            const float x1 = (lane + 32 < bn && lane + 32 < limit) ? s[r][1] : -INFINITY;
            const float m_old = first ? -INFINITY : m_h[row];
            const float l_old = first ? 0.f : l_h[row];
            const float mn = fmaxf(m_old, fb::kernels::warp_max(fmaxf(x0, x1)));
            const float m_use =
                mn == -INFINITY ? 0.f : mn; // keeps (-inf) - (-inf) out of every exp2
            p0 = exp2f(x0 - m_use);
            p1 = exp2f(x1 - m_use);
            const float ln = exp2f(m_old - m_use) * l_old + fb::kernels::warp_sum(p0 + p1);
            const float inv = ln > 0.f ? 1.f / ln : 0.f;
            w_old[r] = exp2f(m_old - m_use) * l_old * inv;
            w_new[r] = inv;
            m_new[r] = mn;
            l_new[r] = ln;
          }
          if (lane < bn)
            pw[r * bn + lane] = p0;
          if (lane + 32 < bn)
            pw[r * bn + lane + 32] = p1;
        }
        __syncwarp();

        // P·V in blocks of 64 head_dim columns (lane, lane + 32), so the accumulators stay at 2 per
        // row.
        for (int xb = 0; xb < d; xb += 64) {
          const int x0 = xb + lane, x1 = xb + 32 + lane;
          const int x0c = min(x0, d - 1), x1c = min(x1, d - 1);
          float acc[kRowsPerPass][2];
#pragma unroll
          for (int r = 0; r < kRowsPerPass; ++r)
            acc[r][0] = acc[r][1] = 0.f;
          for (int c = 0; c < n_c; c += 4) {
            float4 p4[kRowsPerPass];
#pragma unroll
            for (int r = 0; r < kRowsPerPass; ++r)
              p4[r] = *reinterpret_cast<const float4 *>(pw + r * bn + c);
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
              const float v0 = vs[(c + cc) * d + x0c], v1 = vs[(c + cc) * d + x1c];
#pragma unroll
              for (int r = 0; r < kRowsPerPass; ++r) {
                acc[r][0] = fmaf(component(p4[r], cc), v0, acc[r][0]);
                acc[r][1] = fmaf(component(p4[r], cc), v1, acc[r][1]);
              }
            }
          }
#pragma unroll
          for (int r = 0; r < kRowsPerPass; ++r) {
            const int lr = base + r * warps;
            if (lr >= rows)
              continue;
            const int64_t row = r0 + lr;
#pragma unroll
            for (int t = 0; t < 2; ++t) {
              const int x = t == 0 ? x0 : x1;
              if (x >= d)
                continue;
              const float o_old = first ? 0.f : oacc_h[row * d + x];
              const float o = w_old[r] * o_old + w_new[r] * acc[r][t];
              if (last)
                oh[row * a.qs.seq + x] = Elem<T>::from_float(o);
              else
                oacc_h[row * d + x] = o;
            }
          }
        }
        if (lane == 0) {
#pragma unroll
          for (int r = 0; r < kRowsPerPass; ++r) {
            const int lr = base + r * warps;
            if (lr >= rows)
              continue;
            const int64_t row = r0 + lr;
            if (last) {
              lse_h[row] =
                  l_new[r] > 0.f ? (m_new[r] + log2f(l_new[r])) * 0.69314718055994531f : -INFINITY;
            } else {
              l_h[row] = l_new[r];
              m_h[row] = m_new[r];
            }
          }
        }
      }
    }
  }
}

template <class T>
void launch_typed(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
                  cudaStream_t stream) {
  const WorkspaceLayout w = workspace_layout(p);
  char *ws = static_cast<char *>(args.workspace);
  KernelArgs<T> a{};
  a.q = static_cast<const T *>(args.q);
  a.k = static_cast<const T *>(args.k);
  a.v = static_cast<const T *>(args.v);
  a.o = static_cast<T *>(args.o);
  a.lse = args.lse;
  a.o_acc = reinterpret_cast<float *>(ws + w.o_offset);
  a.l_acc = reinterpret_cast<float *>(ws + w.l_offset);
  a.m_acc = reinterpret_cast<float *>(ws + w.m_offset);
  a.seqlen_q = p.seqlen_q;
  a.seqlen_kv = p.seqlen_kv;
  a.heads_q = p.heads_q;
  a.group = p.group_size();
  a.qs = p.q_strides();
  a.ks = p.kv_strides();
  a.head_dim = static_cast<int>(p.head_dim);
  a.block_m = c.block_m;
  a.block_n = c.block_n;
  a.tiles_per_cta = static_cast<int>(tiles_per_cta(p, c));
  a.num_q_tiles = static_cast<int>(num_q_tiles(p, c));
  a.scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
  a.causal = p.causal;

  const int64_t smem = smem_bytes(p.head_dim, c);
  if (smem > 48 * 1024)
    FB_CUDA_CHECK(cudaFuncSetAttribute(fa1_kv_outer_kernel<T>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(num_q_chunks(p, c)), static_cast<unsigned>(p.heads_q),
                  static_cast<unsigned>(p.batch));
  fa1_kv_outer_kernel<T><<<grid, c.threads, static_cast<size_t>(smem), stream>>>(a);
  FB_CHECK_LAUNCH();
}

} // namespace

std::vector<KernelDesc> kernels(const AttentionProblem &p, const Params &c) {
  const void *func =
      p.dtype == DType::f32   ? reinterpret_cast<const void *>(fa1_kv_outer_kernel<float>)
      : p.dtype == DType::f16 ? reinterpret_cast<const void *>(fa1_kv_outer_kernel<__half>)
                              : reinterpret_cast<const void *>(fa1_kv_outer_kernel<__nv_bfloat16>);
  KernelDesc k;
  k.name = "fa1_kv_outer_kernel";
  k.func = func;
  k.block_threads = c.threads;
  k.dynamic_smem = static_cast<size_t>(smem_bytes(p.head_dim, c));
  k.grid_blocks = num_q_chunks(p, c) * p.heads_q * p.batch;
  if (k.dynamic_smem > 48 * 1024) // the occupancy API needs the raised limit, as launch() sets it
    FB_CUDA_CHECK(cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(k.dynamic_smem)));
  return {k};
}

void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream) {
  // supports() rejects these first; this guards direct callers against out-of-bounds shared memory
  // use.
  if (!head_dim_ok(p.head_dim))
    throw std::invalid_argument("fa1_kv_outer: head_dim " + std::to_string(p.head_dim) +
                                " is not supported");
  if (auto why = config_problem(c))
    throw std::invalid_argument("fa1_kv_outer: " + *why);
  switch (p.dtype) {
  case DType::f32:
    launch_typed<float>(p, c, args, stream);
    break;
  case DType::f16:
    launch_typed<__half>(p, c, args, stream);
    break;
  case DType::bf16:
    launch_typed<__nv_bfloat16>(p, c, args, stream);
    break;
  case DType::e4m3:
    throw std::invalid_argument("fa1_kv_outer: e4m3 inputs are not supported (supports() says so)");
  }
}

} // namespace fb::fa1
