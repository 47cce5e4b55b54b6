// The GPU reference for problems too large for the float64 CPU one. Both GEMMs run in plain fp32
// through cuBLAS with TF32 excluded (pedantic math), and the softmax statistics are taken in
// float64, so the reference's error is a few fp32 ulps of the dot products: well under every
// dtype's tolerance. It favours being obviously right over speed: one (batch, head) slice and a
// bounded block of query rows at a time.
#include "flashbench/buffers.hpp"
#include "flashbench/check.hpp"
#include "flashbench/reference.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

namespace fb {
namespace {

__device__ __forceinline__ float load_as_float(const void *base, DType t, int64_t i) {
  switch (t) {
  case DType::f16:
    return __half2float(static_cast<const __half *>(base)[i]);
  case DType::bf16:
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
  default:
    return static_cast<const float *>(base)[i];
  }
}

// Gathers one (batch, head) slice of `rows` rows (row stride `seq_stride` elements) into a dense
// fp32 [rows, d].
__global__ void gather_slice_kernel(const void *src, DType t, int64_t offset, int64_t seq_stride,
                                    int64_t rows, int64_t d, float *dst) {
  const int64_t n = rows * d;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, x = e % d;
    dst[e] = load_as_float(src, t, offset + r * seq_stride + x);
  }
}

// One block per query row of the current row block: S (unscaled Q·Kᵀ, fp32) is overwritten in place
// by P. Statistics in float64 so that the reference's softmax adds no error of its own beyond the
// final fp32 rounding.
__global__ void softmax_rows_kernel(float *s, int64_t skv, int64_t row0, int64_t seqlen_q,
                                    bool causal, double scale, float *lse) {
  __shared__ double red[32];
  const int64_t r = blockIdx.x;
  const int64_t i = row0 + r;
  float *row = s + r * skv;
  int64_t visible = skv;
  if (causal) {
    visible = i + (skv - seqlen_q) + 1;
    visible = visible < 0 ? 0 : (visible > skv ? skv : visible);
  }

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  auto block_reduce = [&](double v, bool is_max) {
    for (int o = 16; o > 0; o >>= 1) {
      const double w = __shfl_xor_sync(0xffffffffu, v, o);
      v = is_max ? fmax(v, w) : v + w;
    }
    if (lane == 0)
      red[warp] = v;
    __syncthreads();
    double out = is_max ? -INFINITY : 0.0;
    for (int k = 0; k < warps; ++k)
      out = is_max ? fmax(out, red[k]) : out + red[k];
    __syncthreads();
    return out;
  };

  if (visible == 0) {
    for (int64_t j = threadIdx.x; j < skv; j += blockDim.x)
      row[j] = 0.f;
    if (threadIdx.x == 0)
      lse[r] = -INFINITY;
    return;
  }
  double m = -INFINITY;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x)
    m = fmax(m, scale * double(row[j]));
  m = block_reduce(m, true);
  double l = 0.0;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x)
    l += exp(scale * double(row[j]) - m);
  l = block_reduce(l, false);
  for (int64_t j = threadIdx.x; j < skv; j += blockDim.x)
    row[j] = j < visible ? static_cast<float>(exp(scale * double(row[j]) - m) / l) : 0.f;
  if (threadIdx.x == 0)
    lse[r] = static_cast<float>(m + log(l));
}

// A batch entry with no keys: its rows see nothing, O = 0 and LSE = -inf (the GEMMs cannot take k = 0 with
// leading dimension 0).
__global__ void empty_rows_kernel(float *o, int64_t seq_stride, int64_t rows, int64_t d,
                                  float *lse) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < rows * d;
       e += int64_t(gridDim.x) * blockDim.x)
    o[(e / d) * seq_stride + e % d] = 0.f;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x)
    lse[r] = -INFINITY;
}

struct CublasHandle {
  cublasHandle_t h = nullptr;
  CublasHandle() { FB_CUBLAS_CHECK(cublasCreate(&h)); }
  ~CublasHandle() { cublasDestroy(h); }
  CublasHandle(const CublasHandle &) = delete;
  CublasHandle &operator=(const CublasHandle &) = delete;
};

int grid_for(int64_t n, int threads) {
  return static_cast<int>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65536));
}

} // namespace

void gpu_reference(const AttentionProblem &p, const void *q, const void *k, const void *v,
                   float *o_ref, float *lse_ref, cudaStream_t stream) {
  const int64_t sq = p.seqlen_q, skv_max = p.seqlen_kv, d = p.head_dim;
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  // Bound S to ~1 GiB (2^28 floats); at least one row.
  const int64_t block_rows = std::clamp<int64_t>((int64_t(1) << 28) / skv_max, 1, sq);

  CublasHandle cublas;
  FB_CUBLAS_CHECK(cublasSetStream(cublas.h, stream));
  // Pedantic math: fp32 GEMMs stay fp32 (no TF32, no reduced-precision split), whatever the
  // environment says.
  FB_CUBLAS_CHECK(cublasSetMathMode(cublas.h, CUBLAS_PEDANTIC_MATH));

  DeviceBuffer kf(size_t(skv_max * d) * sizeof(float)), vf(size_t(skv_max * d) * sizeof(float));
  DeviceBuffer qf(size_t(sq * d) * sizeof(float)),
      sbuf(size_t(block_rows * skv_max) * sizeof(float));
  constexpr int kThreads = 256;
  const float one = 1.f, zero = 0.f;

  for (int64_t b = 0; b < p.batch; ++b) {
    // Each entry against its own length (kv_lens): only its first skv rows of K/V exist for it.
    const int64_t skv = p.kv_len(b);
    if (skv == 0) {
      for (int64_t h = 0; h < p.heads_q; ++h) {
        empty_rows_kernel<<<grid_for(sq * d, kThreads), kThreads, 0, stream>>>(
            o_ref + b * qs.batch + h * qs.head, qs.seq, sq, d, lse_ref + (b * p.heads_q + h) * sq);
        FB_CHECK_LAUNCH();
      }
      continue;
    }
    for (int64_t hkv = 0; hkv < p.heads_kv; ++hkv) {
      const int64_t kv_off = b * ks.batch + hkv * ks.head;
      gather_slice_kernel<<<grid_for(skv * d, kThreads), kThreads, 0, stream>>>(
          k, p.dtype, kv_off, ks.seq, skv, d, kf.as<float>());
      FB_CHECK_LAUNCH();
      gather_slice_kernel<<<grid_for(skv * d, kThreads), kThreads, 0, stream>>>(
          v, p.dtype, kv_off, ks.seq, skv, d, vf.as<float>());
      FB_CHECK_LAUNCH();
      for (int64_t g = 0; g < p.group_size(); ++g) {
        const int64_t h = hkv * p.group_size() + g;
        const int64_t q_off = b * qs.batch + h * qs.head;
        gather_slice_kernel<<<grid_for(sq * d, kThreads), kThreads, 0, stream>>>(
            q, p.dtype, q_off, qs.seq, sq, d, qf.as<float>());
        FB_CHECK_LAUNCH();
        for (int64_t row0 = 0; row0 < sq; row0 += block_rows) {
          const int64_t rows = std::min(block_rows, sq - row0);
          // Row-major S[rows, skv] = Q·Kᵀ is column-major Sᵀ = K·Qᵀ: K is column-major Kᵀ[d, skv],
          // hence OP_T.
          FB_CUBLAS_CHECK(cublasSgemm(
              cublas.h, CUBLAS_OP_T, CUBLAS_OP_N, int(skv), int(rows), int(d), &one, kf.as<float>(),
              int(d), qf.as<float>() + row0 * d, int(d), &zero, sbuf.as<float>(), int(skv)));
          float *lse = lse_ref + (b * p.heads_q + h) * sq + row0;
          softmax_rows_kernel<<<unsigned(rows), kThreads, 0, stream>>>(
              sbuf.as<float>(), skv, row0, sq, p.causal, p.softmax_scale(), lse);
          FB_CHECK_LAUNCH();
          // Row-major O[rows, d] = P·V is column-major Oᵀ = Vᵀ·Pᵀ, written straight into the
          // problem's layout (column stride = the sequence stride). Fully masked rows have P = 0,
          // hence O = 0 exactly.
          FB_CUBLAS_CHECK(cublasSgemm(cublas.h, CUBLAS_OP_N, CUBLAS_OP_N, int(d), int(rows),
                                      int(skv), &one, vf.as<float>(), int(d), sbuf.as<float>(),
                                      int(skv), &zero, o_ref + q_off + row0 * qs.seq, int(qs.seq)));
        }
      }
    }
  }
  FB_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// ---- The backward (reference.hpp states the formulas).

namespace {

// Whether row i (of seqlen_q) sees key j under the bottom-right causal mask, as the forward's softmax decides it.
__device__ __forceinline__ int64_t visible_keys(int64_t i, int64_t skv, int64_t seqlen_q,
                                                bool causal) {
  if (!causal)
    return skv;
  const int64_t v = i + (skv - seqlen_q) + 1;
  return v < 0 ? 0 : (v > skv ? skv : v);
}

// D[r] = rowsum(dO * O) over a dense fp32 [rows, d] pair, in float64.
__global__ void row_dot_kernel(const float *dout, const float *o, int64_t rows, int64_t d,
                               float *out) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    double acc = 0;
    for (int64_t x = 0; x < d; ++x)
      acc += double(dout[r * d + x]) * double(o[r * d + x]);
    out[r] = static_cast<float>(acc);
  }
}

__global__ void abs_copy_kernel(const float *src, int64_t n, float *dst) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x)
    dst[e] = fabsf(src[e]);
}

// One block per row of the current row block: S (unscaled Q K^T) becomes P = exp(scale S - LSE) where the row
// sees the key and has a finite LSE, else 0; `mask` gets 1 where it sees the key, else 0.
__global__ void bwd_probs_kernel(float *s, float *mask, int64_t skv, int64_t row0, int64_t seqlen_q,
                                 bool causal, double scale, const float *lse) {
  const int64_t r = blockIdx.x;
  const int64_t i = row0 + r;
  const double row_lse = lse[r];
  const int64_t visible = isfinite(row_lse) ? visible_keys(i, skv, seqlen_q, causal) : 0;
  float *row = s + r * skv, *mrow = mask + r * skv;
  for (int64_t j = threadIdx.x; j < skv; j += blockDim.x) {
    const bool sees = j < visible;
    row[j] = sees ? static_cast<float>(exp(scale * double(row[j]) - row_lse)) : 0.f;
    mrow[j] = sees ? 1.f : 0.f;
  }
}

// dS = P * (dP - D) in place of dP, and |dS| beside it.
__global__ void bwd_ds_kernel(const float *p, float *dp, float *ds_abs, int64_t rows, int64_t skv,
                              const float *d_rows) {
  const int64_t n = rows * skv;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const float ds = static_cast<float>(double(p[e]) * (double(dp[e]) - double(d_rows[e / skv])));
    dp[e] = ds;
    ds_abs[e] = fabsf(ds);
  }
}

} // namespace

void gpu_reference_backward(const AttentionProblem &p, const void *q, const void *k, const void *v,
                            const void *o, const void *dout, const float *lse,
                            const BackwardReferenceDevice &out, cudaStream_t stream) {
  const int64_t sq = p.seqlen_q, skv = p.seqlen_kv, d = p.head_dim;
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  const float scale = static_cast<float>(p.softmax_scale());
  // Three [rows, skv] fp32 blocks (P, dP then dS, |dS| then the mask): each bounded to 2^26 floats (256 MiB).
  const int64_t block_rows = std::clamp<int64_t>((int64_t(1) << 26) / skv, 1, sq);

  CublasHandle cublas;
  FB_CUBLAS_CHECK(cublasSetStream(cublas.h, stream));
  FB_CUBLAS_CHECK(cublasSetMathMode(cublas.h, CUBLAS_PEDANTIC_MATH));

  const size_t kv_slice = size_t(skv * d) * sizeof(float), q_slice = size_t(sq * d) * sizeof(float);
  DeviceBuffer kf(kv_slice), vf(kv_slice), kabs(kv_slice);
  DeviceBuffer qf(q_slice), qabs(q_slice), dof(q_slice), doabs(q_slice), of(q_slice);
  DeviceBuffer d_rows(size_t(sq) * sizeof(float));
  const size_t block_bytes = size_t(block_rows * skv) * sizeof(float);
  DeviceBuffer pbuf(block_bytes), dsbuf(block_bytes), auxbuf(block_bytes);
  constexpr int kThreads = 256;

  // dK and dV (and their sums) accumulate over the group's query heads and the row blocks.
  for (float *t : {out.dk, out.dv, out.dk_abs, out.dv_abs, out.dk_floor, out.dv_floor})
    FB_CUDA_CHECK(cudaMemsetAsync(t, 0, size_t(p.kv_elems()) * sizeof(float), stream));

  auto gemm = [&](cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t kk,
                  float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                  float *c, int64_t ldc) {
    FB_CUBLAS_CHECK(cublasSgemm(cublas.h, ta, tb, int(m), int(n), int(kk), &alpha, a, int(lda), b,
                                int(ldb), &beta, c, int(ldc)));
  };
  auto gather = [&](const void *src, int64_t offset, int64_t seq_stride, int64_t rows, float *dst) {
    gather_slice_kernel<<<grid_for(rows * d, kThreads), kThreads, 0, stream>>>(
        src, p.dtype, offset, seq_stride, rows, d, dst);
    FB_CHECK_LAUNCH();
  };
  auto absolute = [&](const float *src, int64_t n, float *dst) {
    abs_copy_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(src, n, dst);
    FB_CHECK_LAUNCH();
  };

  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hkv = 0; hkv < p.heads_kv; ++hkv) {
      const int64_t kv_off = b * ks.batch + hkv * ks.head;
      gather(k, kv_off, ks.seq, skv, kf.as<float>());
      gather(v, kv_off, ks.seq, skv, vf.as<float>());
      absolute(kf.as<float>(), skv * d, kabs.as<float>());
      // Row-major [skv, d] outputs of this slice, straight in the layout (row stride ks.seq).
      float *dk = out.dk + kv_off, *dv = out.dv + kv_off;
      float *dk_abs = out.dk_abs + kv_off, *dv_abs = out.dv_abs + kv_off;
      float *dk_floor = out.dk_floor + kv_off, *dv_floor = out.dv_floor + kv_off;
      for (int64_t g = 0; g < p.group_size(); ++g) {
        const int64_t h = hkv * p.group_size() + g;
        const int64_t q_off = b * qs.batch + h * qs.head;
        gather(q, q_off, qs.seq, sq, qf.as<float>());
        gather(dout, q_off, qs.seq, sq, dof.as<float>());
        gather(o, q_off, qs.seq, sq, of.as<float>());
        absolute(qf.as<float>(), sq * d, qabs.as<float>());
        absolute(dof.as<float>(), sq * d, doabs.as<float>());
        row_dot_kernel<<<grid_for(sq, kThreads), kThreads, 0, stream>>>(
            dof.as<float>(), of.as<float>(), sq, d, d_rows.as<float>());
        FB_CHECK_LAUNCH();
        for (int64_t row0 = 0; row0 < sq; row0 += block_rows) {
          const int64_t rows = std::min(block_rows, sq - row0);
          const float *qb = qf.as<float>() + row0 * d, *qab = qabs.as<float>() + row0 * d;
          const float *dob = dof.as<float>() + row0 * d, *doab = doabs.as<float>() + row0 * d;
          float *pb = pbuf.as<float>(), *dsb = dsbuf.as<float>(), *aux = auxbuf.as<float>();
          float *dq = out.dq + q_off + row0 * qs.seq, *dq_abs = out.dq_abs + q_off + row0 * qs.seq,
                *dq_floor = out.dq_floor + q_off + row0 * qs.seq;
          // Row-major X[m, n] is column-major X^T with the same leading dimension, so each product is
          // written transposed: row-major C = A B is column-major C^T = B^T A^T.
          // S[rows, skv] = Q K^T, then P and the mask.
          gemm(CUBLAS_OP_T, CUBLAS_OP_N, skv, rows, d, 1.f, kf.as<float>(), d, qb, d, 0.f, pb, skv);
          bwd_probs_kernel<<<unsigned(rows), kThreads, 0, stream>>>(
              pb, aux, skv, row0, sq, p.causal, p.softmax_scale(),
              lse + (b * p.heads_q + h) * sq + row0);
          FB_CHECK_LAUNCH();
          // dV[skv, d] += P^T dO; its sums: P^T |dO| and mask^T |dO|.
          gemm(CUBLAS_OP_N, CUBLAS_OP_T, d, skv, rows, 1.f, dob, d, pb, skv, 1.f, dv, ks.seq);
          gemm(CUBLAS_OP_N, CUBLAS_OP_T, d, skv, rows, 1.f, doab, d, pb, skv, 1.f, dv_abs, ks.seq);
          gemm(CUBLAS_OP_N, CUBLAS_OP_T, d, skv, rows, 1.f, doab, d, aux, skv, 1.f, dv_floor,
               ks.seq);
          // Floors of dQ and dK while aux still holds the mask: scale mask |K| and scale mask^T |Q|.
          gemm(CUBLAS_OP_N, CUBLAS_OP_N, d, rows, skv, scale, kabs.as<float>(), d, aux, skv, 0.f,
               dq_floor, qs.seq);
          gemm(CUBLAS_OP_N, CUBLAS_OP_T, d, skv, rows, scale, qab, d, aux, skv, 1.f, dk_floor,
               ks.seq);
          // dP[rows, skv] = dO V^T, then dS = P (dP - D) in its place and |dS| in aux.
          gemm(CUBLAS_OP_T, CUBLAS_OP_N, skv, rows, d, 1.f, vf.as<float>(), d, dob, d, 0.f, dsb,
               skv);
          bwd_ds_kernel<<<grid_for(rows * skv, kThreads), kThreads, 0, stream>>>(
              pb, dsb, aux, rows, skv, d_rows.as<float>() + row0);
          FB_CHECK_LAUNCH();
          // dQ[rows, d] = scale dS K and dK[skv, d] += scale dS^T Q, with their sums over |dS|.
          gemm(CUBLAS_OP_N, CUBLAS_OP_N, d, rows, skv, scale, kf.as<float>(), d, dsb, skv, 0.f, dq,
               qs.seq);
          gemm(CUBLAS_OP_N, CUBLAS_OP_N, d, rows, skv, scale, kabs.as<float>(), d, aux, skv, 0.f,
               dq_abs, qs.seq);
          gemm(CUBLAS_OP_N, CUBLAS_OP_T, d, skv, rows, scale, qb, d, dsb, skv, 1.f, dk, ks.seq);
          gemm(CUBLAS_OP_N, CUBLAS_OP_T, d, skv, rows, scale, qab, d, aux, skv, 1.f, dk_abs,
               ks.seq);
        }
      }
    }
  FB_CUDA_CHECK(cudaStreamSynchronize(stream));
}

} // namespace fb
