// The library entry point: one forward attention call with the best known kernel for the current GPU.
//
// Choice (choose_kernel):
//  1. The tuning table of this GPU (tuner.hpp; $FLASHBENCH_TUNING_DIR/<gpu-slug>.json, else the source tree's
//     tuning/): for `variant = "auto"` each variant's entry for the problem by the nearest-bucket rule below, and
//     of those the nearest, then the one with the highest measured TFLOPs; for a named variant, that variant's
//     entry. An entry is used only when its config supports the problem on this device. A table with stale
//     entries (their variant's sources changed since: `flashbench tune --check`) is still used, with one warning
//     on stderr when it is loaded.
//  2. Heuristic fallback (no table, no entry, or an entry that does not fit): the first variant of this preference
//     list that exists in the catalog and supports the problem with its default config for the problem
//     (ConfigSpace::default_config(p, dev), else its first config that does): e4m3 problems try fa3_fp8 first,
//     decode-like problems (seqlen_q <= 16) flash_decoding; then fa3_pipelined (sm_90 only), fa2_q_outer,
//     fa1_kv_outer, naive. Backward problems (pass: bwd) try fa3_bwd, fa2_bwd, fa1_bwd. A named variant uses its
//     default config for the problem.
// Only variants of the problem's pass are candidates, in both steps (support_for, variant.hpp), and table entries
// are keyed by pass too, so a backward entry never serves a forward problem. Test-only variants are never chosen
// by "auto".
//
// The nearest-bucket rule (TuningTable::lookup). Entries are keyed by variant, dtype, head_dim, causality and the
// power-of-two buckets (the smallest power of two >= the value) of seqlen_q, seqlen_kv, batch*heads_q and
// heads_q/heads_kv. For a problem:
//  a. only entries with its variant, pass, dtype, head_dim and causality are candidates (these change the kernel or the
//     mask; a config never crosses them);
//  b. the entry of the problem's own bucket wins;
//  c. else the entry whose measured problem is nearest: the smallest sum over the four dimensions of
//     |log2(problem's value / entry's value)| (one per doubling, whichever dimension);
//  d. ties (within 1e-9) go to the smaller length part of that sum (seqlen_q and seqlen_kv set the loop length
//     and the tile count, which decide the tile shape most), then to the entry of the larger problem (the sum of
//     the signed log2 ratios: a config tuned for more work keeps the grid full, one tuned for less may not), then
//     to the entry that comes first in the table;
//  e. an entry farther than kMaxBucketDistance (6 doublings) is not near: with no nearer entry the heuristic
//     decides (so decode never takes a prefill entry: seqlen_q 1 against 512 is 9 alone).
// Example: N = 3000, batch 3, GQA 48/8 (6:1) has buckets sq 4096, b*h 256, group 8. Between entries measured at
// (N 4096, b4 h32/8), (N 2048, b8 h32/8) and (N 4096, b1 h64/8) it takes the first: 0.90 + 0.17 + 0.58 = 1.65,
// against 2.52 and 2.48 (tests/harness/test_tuner.cpp, Tuner.NearestBucketRule).
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/device.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/tuner.hpp"
#include "flashbench/variant.hpp"

#include <cuda_runtime_api.h>

#include <map>
#include <string>

namespace fb {

struct KernelChoice {
  const Variant *variant = nullptr;
  Config config;
  std::string source; // "table <path> ..." or "heuristic: ..."
};

// A config named in part (a spec's config map, a C API config string) completed for one problem: the axes it leaves
// out take the problem's default (the variant's rule applied with the named axes in: default_config(seed, p,
// dev); with none named, default_config(p, dev)), as `default` and the C API do. Where that combination
// is invalid or unsupported (a default that depends on the default tile, such as fa2_bwd's dq_layout at d64,
// next to a tile the map names) and the variant's base default (`flashbench list`) gives a valid, supported one,
// that one; `source` says which. Throws UserError for an unknown axis or value.
Config complete_config(const Variant &v, const std::map<std::string, std::string> &given,
                       const AttentionProblem &p, const DeviceInfo &dev,
                       std::string *source = nullptr);

// Throws UserError when nothing in the catalog supports the problem (or the named variant does not exist or
// supports it with no config). `table` null: no table (heuristic only).
KernelChoice choose_kernel(const AttentionProblem &p, const DeviceInfo &dev,
                           const std::string &variant, const TuningTable *table);
// The same with the current GPU's table (tuning_table_for(dev)).
KernelChoice choose_kernel(const AttentionProblem &p, const DeviceInfo &dev,
                           const std::string &variant = "auto");

// Enqueues the forward pass on `stream` for the current device (cudaGetDevice). q, k, v, o in p.dtype and
// p.layout; lse fp32 [batch, heads_q, seqlen_q]. Workspace and semaphores, when the chosen kernel needs them, come
// from buffers of this (device, stream) that only grow: growing one waits for the stream's earlier calls, and is
// refused (UserError) while the stream is being captured into a graph, so make one call with the largest problem
// first. Calls on different streams never share them and may run concurrently; host threads are serialised on a
// per-device lock while they enqueue. A destroyed stream's buffers are freed when its handle comes back for a new
// stream, else kept until the process ends.
void attention_forward(const AttentionProblem &p, const void *q, const void *k, const void *v,
                       void *o, float *lse, cudaStream_t stream,
                       const std::string &variant = "auto");

} // namespace fb

// The name the README uses for the library entry point.
namespace flashbench {
using fb::attention_forward;
using fb::choose_kernel;
} // namespace flashbench
