// Hopper pieces that only the backward's 80-row blocks use (fa3_bwd at head_dim 128), kept out of the shared
// wrappers (wgmma_f16.cuh, tma.cuh) so that the forward kernels' sources, and the tuning tables' hashes of them,
// stay as they are.
#pragma once

#include "kernels/common/hopper/wgmma_f16.cuh"

#include <cstdint>

namespace fb::hopper {

// N = 80 (the 80-row blocks of the backward at head_dim 128): SS with both operands K-major (Sᵀ = K·Qᵀ and
// dPᵀ = V·dOᵀ), and SS with an MN-major A (tnspA = 1: dQᵀ = Kᵀ·dSᵀ, A the K tile, whose head_dim columns are
// contiguous). One macro writes the four (form, type) wrappers: their operand lists differ only in the type and the
// transpose flag.
#define FB_WGMMA_N80(NAME, TAG, TY, TNSP_A)                                                        \
  __device__ __forceinline__ void NAME(float(&d)[40], uint64_t desc_a, uint64_t desc_b,            \
                                       int scale_d, TAG, IntC<80>) {                               \
    asm volatile(                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"                                               \
        "wgmma.mma_async.sync.aligned.m64n80k16.f32." TY "." TY "\n"                               \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                  \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "         \
        "%32, %33, %34, %35, %36, %37, %38, %39}, "                                                \
        "%40, %41, p, 1, 1, " TNSP_A ", 0;\n}\n"                                                   \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),      \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),  \
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),            \
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),            \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),            \
          "+f"(d[38]), "+f"(d[39])                                                                 \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                                 \
  }
FB_WGMMA_N80(wgmma_ss, Bf16Tag, "bf16", "0")
FB_WGMMA_N80(wgmma_ss, F16Tag, "f16", "0")
FB_WGMMA_N80(wgmma_ss_ta, Bf16Tag, "bf16", "1")
FB_WGMMA_N80(wgmma_ss_ta, F16Tag, "f16", "1")
#undef FB_WGMMA_N80

// The partial last row block of an 80-row schedule (row_tail: its rows rounded up to 16) as N = 16, 32, 48 or 64,
// in the same two forms (the N = 64 SS form is wgmma_f16.cuh's). FB_ACC8(i): accumulators i .. i + 7.
#define FB_ACC8(i)                                                                                 \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),      \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FB_ACC_N16 FB_ACC8(0)
#define FB_ACC_N32 FB_ACC8(0), FB_ACC8(8)
#define FB_ACC_N48 FB_ACC8(0), FB_ACC8(8), FB_ACC8(16)
#define FB_ACC_N64 FB_ACC8(0), FB_ACC8(8), FB_ACC8(16), FB_ACC8(24)
#define FB_REGS_N16 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define FB_REGS_N32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FB_REGS_N48                                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23}"
#define FB_REGS_N64                                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
// IA, IB, IP: the operand numbers of the two descriptors and of scale_d (after the N / 2 accumulators).
#define FB_WGMMA_TAIL(NAME, TAG, TY, TNSP_A, N, IA, IB, IP)                                        \
  __device__ __forceinline__ void NAME(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b,         \
                                       int scale_d, TAG, IntC<N>) {                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY "\n" FB_REGS_N##N     \
                 ", %" #IA ", %" #IB ", p, 1, 1, " TNSP_A ", 0;\n}\n"                              \
                 : FB_ACC_N##N                                                                     \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                        \
  }
FB_WGMMA_TAIL(wgmma_ss, Bf16Tag, "bf16", "0", 16, 8, 9, 10)
FB_WGMMA_TAIL(wgmma_ss, F16Tag, "f16", "0", 16, 8, 9, 10)
FB_WGMMA_TAIL(wgmma_ss, Bf16Tag, "bf16", "0", 32, 16, 17, 18)
FB_WGMMA_TAIL(wgmma_ss, F16Tag, "f16", "0", 32, 16, 17, 18)
FB_WGMMA_TAIL(wgmma_ss, Bf16Tag, "bf16", "0", 48, 24, 25, 26)
FB_WGMMA_TAIL(wgmma_ss, F16Tag, "f16", "0", 48, 24, 25, 26)
FB_WGMMA_TAIL(wgmma_ss_ta, Bf16Tag, "bf16", "1", 16, 8, 9, 10)
FB_WGMMA_TAIL(wgmma_ss_ta, F16Tag, "f16", "1", 16, 8, 9, 10)
FB_WGMMA_TAIL(wgmma_ss_ta, Bf16Tag, "bf16", "1", 32, 16, 17, 18)
FB_WGMMA_TAIL(wgmma_ss_ta, F16Tag, "f16", "1", 32, 16, 17, 18)
FB_WGMMA_TAIL(wgmma_ss_ta, Bf16Tag, "bf16", "1", 48, 24, 25, 26)
FB_WGMMA_TAIL(wgmma_ss_ta, F16Tag, "f16", "1", 48, 24, 25, 26)
FB_WGMMA_TAIL(wgmma_ss_ta, Bf16Tag, "bf16", "1", 64, 32, 33, 34)
FB_WGMMA_TAIL(wgmma_ss_ta, F16Tag, "f16", "1", 64, 32, 33, 34)
#undef FB_WGMMA_TAIL
#undef FB_REGS_N16
#undef FB_REGS_N32
#undef FB_REGS_N48
#undef FB_REGS_N64
#undef FB_ACC_N16
#undef FB_ACC_N32
#undef FB_ACC_N48
#undef FB_ACC_N64
#undef FB_ACC8

} // namespace fb::hopper
