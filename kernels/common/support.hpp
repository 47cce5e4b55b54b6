// Host helpers for Variant::supports(): the checks every variant makes the same way, with reasons
// in SI units.
#pragma once

#include "flashbench/device.hpp"
#include "flashbench/problem.hpp"

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace fb::kernels {

// "137.4 GB" (SI, one decimal).
inline std::string format_gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

// "160 KB" (SI; shared memory sizes are reported the way ptxas and the occupancy calculator users
// read them).
inline std::string format_kb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f KB", bytes / 1e3);
  return buf;
}

// Dynamic shared memory a Hopper block may opt in to (227 KB on H100 and H200): what the sm_90a variants plan against
// when no device is present.
constexpr int64_t kSmemOptinHopper = 232448;

// For every variant but fa3_fp8: e4m3 inputs (quantized, with descales) are that variant's alone.
inline std::optional<std::string> fp8_reason(const AttentionProblem &p) {
  if (p.dtype == DType::e4m3)
    return std::string("e4m3 inputs (per-block descales) are taken by fa3_fp8 only");
  return std::nullopt;
}

// Q, K, V, O and LSE: what the harness allocates for every point besides the workspace.
inline double io_bytes(const AttentionProblem &p) {
  const double e = dtype_bytes(p.dtype);
  return e * (p.q_elems() + 2.0 * p.kv_elems()) +
         dtype_bytes(out_dtype(p.dtype)) * double(p.q_elems()) + 4.0 * p.lse_elems();
}

// Leave 10% of device memory to the context, cuBLAS and the L2 flush buffer.
constexpr double kUsableMemFraction = 0.9;

// A reason when inputs, outputs and `workspace` (what it holds in `what`) do not fit; no check when
// the device's memory size is unknown (0).
inline std::optional<std::string> memory_reason(const AttentionProblem &p, double workspace,
                                                const char *what, const DeviceInfo &dev) {
  if (dev.total_mem_bytes <= 0)
    return std::nullopt;
  const double need = workspace + io_bytes(p);
  if (need <= kUsableMemFraction * static_cast<double>(dev.total_mem_bytes))
    return std::nullopt;
  return "needs " + format_gb(need) + " of device memory for " + what + "; the GPU has " +
         format_gb(static_cast<double>(dev.total_mem_bytes));
}

// For variants that read K/V as one contiguous [batch, seqlen_kv] cache: a reason when the problem has per-entry
// KV lengths or a paged cache, which only the decode variants handle.
inline std::optional<std::string> needs_decode_variant(const AttentionProblem &p) {
  if (p.paged())
    return std::string("paged KV cache (page_size ") + std::to_string(p.page_size) +
           ") needs a decode variant (flash_decoding)";
  if (!p.kv_lens.empty())
    return std::string("per-entry KV lengths (kv_lens) need a decode variant (flash_decoding)");
  return std::nullopt;
}

// The problem checks every column-parallel backward variant (`name`, tensor cores) makes the same way: the pass,
// one contiguous KV cache, fp16 or bf16 inputs.
inline std::optional<std::string> backward_problem_reason(const AttentionProblem &p,
                                                          const std::string &name) {
  if (p.pass != Pass::bwd)
    return "forward pass: " + name + " computes the backward (pass: bwd)";
  if (auto why = needs_decode_variant(p))
    return why;
  if (auto why = fp8_reason(p))
    return why;
  if (p.dtype == DType::f32)
    return std::string("fp32 inputs: the tensor-core kernels take fp16 or bf16");
  // Row indices and sequence coordinates are 32-bit in the kernels; the preprocess and convert kernels
  // (bwd_rows.cuh) put heads_q and batch in grid y and z.
  if (p.seqlen_q > (int64_t(1) << 30) || p.seqlen_kv > (int64_t(1) << 30))
    return std::string("seqlen_q and seqlen_kv must each be at most 2^30 (32-bit row indices)");
  if (p.heads_q > 65535 || p.batch > 65535)
    return std::string(
        "heads_q and batch must each be at most 65535 (CUDA grid y/z limit of the row kernels)");
  return std::nullopt;
}

// A backward point's memory beyond io_bytes() (Q, K, V, O, LSE): dO, dQ, dK and dV, the fp32 workspace and the
// semaphores.
inline std::optional<std::string> backward_memory_reason(const AttentionProblem &p,
                                                         double workspace, double semaphores,
                                                         const DeviceInfo &dev) {
  const double e = dtype_bytes(p.dtype);
  const double extra =
      e * (2.0 * double(p.q_elems()) + 2.0 * double(p.kv_elems())) + workspace + semaphores;
  return memory_reason(p, extra, "inputs, gradients and the fp32 dQ workspace", dev);
}

} // namespace fb::kernels
