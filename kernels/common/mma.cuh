// Ampere-style tensor-core building blocks (sm_80 and later): cp.async copies into shared memory, ldmatrix
// fragment loads, mma.sync m16n8k16 with fp32 accumulation, and the register packing between them. Inline PTX
// because the CUDA C++ wmma API hides the fragment layout, and the FlashAttention kernels need that layout to turn
// the S accumulator into the A operand of P·V without a trip through shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fb::kernels {

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1 (.cg: tiles are used once per CTA). When `valid` is false the 16 bytes
// are zero-filled and nothing is read, so rows past a sequence end become zeros that are safe to multiply by 0.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// The pipeline depth is a run-time value (so that it costs no template instantiations), but wait_group takes an
// immediate: a switch over the depths the kernels use keeps it one uniform branch.
__device__ __forceinline__ void cp_async_wait_dynamic(int pending) {
  switch (pending) {
  case 0:
    cp_async_wait<0>();
    break;
  case 1:
    cp_async_wait<1>();
    break;
  case 2:
    cp_async_wait<2>();
    break;
  default:
    cp_async_wait<3>();
    break;
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A·B + D for one 16x8x16 tile: A row-major 16x16 (4 regs), B column-major 16x8 (2 regs), D fp32 (4 regs).
template <class T> struct Mma;
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
  }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
  }
};

// In the m16n8 accumulator layout the four lanes of a quad hold one row: row statistics reduce over lanes 1 and 2
// apart, without shared memory.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Online softmax in log2 units with a stand-in for an empty row: a row whose running max is still -inf (no key
// seen) subtracts 0 instead, so exp2(-inf - (-inf)) never produces NaN and the row keeps l = 0.
__device__ __forceinline__ float softmax_offset(float m_scaled) {
  return m_scaled == -INFINITY ? 0.f : m_scaled;
}

// 2^x on the MUFU unit alone (ex2.approx.ftz): exp2f adds a compare and two predicated multiplies per call to get
// subnormal results right (FSETP, FMUL 0.5 before and FMUL x·x after MUFU.EX2 in the SASS), which softmax does not
// need: a weight under 2^-126 of the row max is 0 in bf16/fp16 P and negligible in l. exp2(-inf) = +0, as the
// empty-row handling (softmax_offset) needs. fa2_q_outer, 64 exponentials per tile and thread at 128x64: ~190 fewer ALU
// instructions per K/V tile per warp, and 3 fewer predicate registers in the softmax.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

} // namespace fb::kernels
