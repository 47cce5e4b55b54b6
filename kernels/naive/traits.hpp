// Naive variant: the config space, the workspace layout, and the launch entry point (naive.cu).
// Shared by the launch code and the host-side Variant so that both agree on where S and P live.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace fb::naive {

// The only tunable: threads per softmax row block. The GEMMs are cuBLAS's own choice.
inline ConfigSpace make_space() {
  return ConfigSpace(
      {Axis{"softmax_threads", {128, 256}, {}, "threads per block of the row-softmax kernel"}},
      Config({{"softmax_threads", 256}}), [](const Config &c) -> std::optional<std::string> {
        const int64_t t = c.get_or("softmax_threads", 256);
        if (t < 32 || t > 1024 || t % 32 != 0)
          return "softmax_threads must be a multiple of 32 up to 1024";
        return std::nullopt;
      });
}

constexpr size_t round_up_256(size_t n) { return (n + 255) / 256 * 256; }

// Workspace: six device pointer arrays for the two batched GEMMs (K, Q, S for Q·Kᵀ; V, P, O for
// P·V; one entry per (batch, q head)), then S (fp32) and P (problem dtype), each [batch, heads_q,
// seqlen_q, seqlen_kv].
struct WorkspaceLayout {
  // Entries between consecutive pointer arrays: each array starts 256-byte aligned, because
  // cuBLAS's batched GEMMs check the alignment of the pointer arrays themselves (they cannot see
  // the device-side pointers).
  size_t pointer_stride = 0;
  size_t s_offset = 0;
  size_t p_offset = 0;
  size_t total = 0;
};

inline WorkspaceLayout workspace_layout(const AttentionProblem &p) {
  const size_t slices = static_cast<size_t>(p.batch * p.heads_q);
  const size_t scores = slices * static_cast<size_t>(p.seqlen_q) * static_cast<size_t>(p.seqlen_kv);
  WorkspaceLayout w;
  w.pointer_stride = round_up_256(slices * sizeof(void *)) / sizeof(void *);
  w.s_offset = 6 * w.pointer_stride * sizeof(void *);
  w.p_offset = w.s_offset + round_up_256(scores * sizeof(float));
  w.total = w.p_offset + round_up_256(scores * static_cast<size_t>(dtype_bytes(p.dtype)));
  return w;
}

// Enqueues Q·Kᵀ, softmax and P·V on `stream` (naive.cu).
// The softmax kernel launch() queues (the GEMMs are cuBLAS's), for the occupancy report.
std::vector<KernelDesc> kernels(const AttentionProblem &p, int softmax_threads);

void launch(const AttentionProblem &p, int softmax_threads, const LaunchArgs &args,
            cudaStream_t stream);

} // namespace fb::naive
