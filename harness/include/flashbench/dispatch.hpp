// The library entry point: one forward attention call with the best known kernel for the current GPU.
//
// Choice (choose_kernel):
//  1. The tuning table of this GPU (tuner.hpp; $FLASHBENCH_TUNING_DIR/<gpu-slug>.json, else the source tree's
//     tuning/): for `variant = "auto"` the variant whose entry for the problem's bucket (or the nearest bucket of
//     the same dtype, head_dim and causal) has the highest measured TFLOPs; for a named variant, that variant's
//     entry. An entry is used only when its config supports the problem on this device.
//  2. Heuristic fallback (no table, no entry, or an entry that does not fit): the first variant of this preference
//     list that exists in the catalog and supports the problem with its default config (else its first config that
//     does): decode-like problems (seqlen_q <= 16) try flash_decoding first; then fa2_q_outer (fa3_pipelined joins once proven on a GPU),
//     fa1_kv_outer, naive. A named variant uses its default config (else its first supported one).
// Test-only variants are never chosen by "auto".
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/device.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/tuner.hpp"
#include "flashbench/variant.hpp"

#include <cuda_runtime_api.h>

#include <string>

namespace fb {

struct KernelChoice {
  const Variant* variant = nullptr;
  Config config;
  std::string source; // "table <path> ..." or "heuristic: ..."
};

// Throws UserError when nothing in the catalog supports the problem (or the named variant does not exist or
// supports it with no config). `table` null: no table (heuristic only).
KernelChoice choose_kernel(const AttentionProblem& p, const DeviceInfo& dev, const std::string& variant,
                           const TuningTable* table);
// The same with the current GPU's table (tuning_table_for(dev)).
KernelChoice choose_kernel(const AttentionProblem& p, const DeviceInfo& dev, const std::string& variant = "auto");

// Enqueues the forward pass on `stream` for the current device (cudaGetDevice). q, k, v, o in p.dtype and
// p.layout; lse fp32 [batch, heads_q, seqlen_q]. Workspace and semaphores, when the chosen kernel needs them, come
// from buffers of this (device, stream) that only grow: growing one waits for the stream's earlier calls, and is
// refused (UserError) while the stream is being captured into a graph, so make one call with the largest problem
// first. Calls on different streams never share them and may run concurrently; host threads are serialised on a
// per-device lock while they enqueue. A destroyed stream's buffers are freed when its handle comes back for a new
// stream, else kept until the process ends.
void attention_forward(const AttentionProblem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                       cudaStream_t stream, const std::string& variant = "auto");

} // namespace fb

// The name the README uses for the library entry point.
namespace flashbench {
using fb::attention_forward;
using fb::choose_kernel;
} // namespace flashbench
