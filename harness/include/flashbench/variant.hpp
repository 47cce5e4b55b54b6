// Variant: one kernel family of the catalog. A variant knows its config space, which (problem, config, device)
// combinations it supports (and why not), how much workspace it needs, how many HBM bytes it should move (its
// traffic model), and how to launch itself on a stream. Everything except launch() is host logic, testable without
// a GPU.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/device.hpp"
#include "flashbench/problem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fb {

// ok, or not with a reason that a person can act on ("needs 137 GB of device memory, the GPU has 80 GB").
struct Support {
  bool ok = true;
  std::string reason;
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

// Device pointers of one call. Q/K/V are in problem.dtype, O in out_dtype(problem.dtype), all with problem.layout;
// lse is fp32 [batch, heads_q, seqlen_q] (natural log, -inf for rows that see no key); workspace has
// workspace_bytes() bytes, 256-byte aligned.
//
// Forward (problem.pass == fwd): q, k, v are inputs; o and lse are outputs; dout, dq, dk, dv are null.
// Backward (problem.pass == bwd; dense bshd problems of bf16, fp16 or fp32, validate()): q, k, v, o, lse and dout
// are INPUTS, and the launch must not write them: o is the forward's O in the problem's dtype, lse the forward's
// LSE as above (-inf rows see no key: their gradients are zero). The outputs, all in the problem's dtype and bshd:
//   dq [batch, seqlen_q, heads_q, head_dim] (like Q),
//   dk, dv [batch, seqlen_kv, heads_kv, head_dim] (like K and V; under GQA each sums over its group's query heads).
// The harness fills dq, dk and dv with NaN before a verified launch, so each element must be written. The
// workspace is NOT zeroed between launches (the timer reuses it, and the harness fills it with all-ones bytes
// before a verified backward launch): a variant that accumulates in fp32 (dQ by atomics, D = rowsum(dO * O))
// zeroes what it needs inside its own launch. A launch that changes any of its inputs fails verification.
struct LaunchArgs {
  const void *q = nullptr;
  const void *k = nullptr;
  const void *v = nullptr;
  void *o = nullptr;    // fwd: output; bwd: input (the forward's O)
  float *lse = nullptr; // fwd: output; bwd: input (the forward's LSE)
  // Backward only (null in a forward launch): dO (an input, shaped like O) and the gradients (outputs).
  const void *dout = nullptr;
  void *dq = nullptr; // like Q
  void *dk = nullptr; // like K: [batch, seqlen_kv, heads_kv, head_dim]
  void *dv = nullptr; // like V
  void *workspace = nullptr;
  size_t workspace_bytes = 0;
  // semaphore_bytes() bytes that are all zero when a launch starts and that the launch leaves all zero once it
  // completes (arrival counters reset by their last user, as FlashAttention's tile semaphore and cuBLAS's split-K
  // workspace do). The caller zeroes them once, when it allocates them, and does not share them between streams;
  // it saves the variant a memset node in front of every launch. Null when semaphore_bytes() is 0.
  void *semaphores = nullptr;
  size_t semaphore_bytes = 0;
  // int32 [batch]: each entry's KV length (problem.kv_len(b)); set by the harness for every problem (variants
  // may ignore it when problem.kv_lens is empty).
  const int32_t *cache_seqlens = nullptr;
  // Paged problems only (problem.page_size > 0): k and v are the page pools [num_pages, page_size, heads_kv,
  // head_dim] and page_table is int32 [batch, pages_per_seq] of pool page indices.
  const int32_t *page_table = nullptr;
  int64_t pages_per_seq = 0;
  // e4m3 problems only (problem.dtype == e4m3; O is then bf16): float32 descales, value = code * descale.
  // Q [batch, heads_q, ceil(seqlen_q / 128)], K [batch, heads_kv, ceil(seqlen_kv / 128)], V [batch, heads_kv].
  const float *q_descale = nullptr;
  const float *k_descale = nullptr;
  const float *v_descale = nullptr;
};

// One kernel a variant launches, for the occupancy report. Library kernels (cuBLAS) are not listed.
struct KernelDesc {
  std::string name;
  const void *func = nullptr; // the __global__ function
  int block_threads = 0;
  size_t dynamic_smem = 0;
  int64_t grid_blocks = 0;
};

class Variant {
public:
  virtual ~Variant() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  virtual const ConfigSpace &space() const = 0;
  // The pass this variant computes. It is offered only problems of that pass: support_for() refuses the others
  // before supports() is asked, so supports() need not check it.
  virtual Pass pass() const { return Pass::fwd; }

  virtual Support supports(const AttentionProblem &p, const Config &c,
                           const DeviceInfo &dev) const = 0;
  virtual size_t workspace_bytes(const AttentionProblem &, const Config &) const { return 0; }
  // Zero-on-entry, zero-on-exit counters (LaunchArgs::semaphores).
  virtual size_t semaphore_bytes(const AttentionProblem &, const Config &) const { return 0; }
  // Expected HBM bytes moved (read + write) for one call; the report sets it beside min_bytes() and the measured
  // DRAM bytes.
  virtual double model_bytes(const AttentionProblem &p, const Config &c) const = 0;
  // The same on a given device, for variants whose traffic depends on it (what stays in L2); the plan uses this.
  virtual double model_bytes(const AttentionProblem &p, const Config &c, const DeviceInfo &) const {
    return model_bytes(p, c);
  }
  // The kernels launch() queues (for theoretical occupancy). Empty when unknown.
  virtual std::vector<KernelDesc> kernels(const AttentionProblem &, const Config &) const {
    return {};
  }

  // Enqueues the whole pass (pass()) on `stream`. Must be asynchronous: no allocation, no synchronisation, no
  // host<->device copies (the timer holds the stream while launches are queued). Throws CudaError on a bad launch.
  virtual void launch(const AttentionProblem &p, const Config &c, const LaunchArgs &args,
                      cudaStream_t stream) const = 0;
};

// Whether v runs (p, c) on dev: the one place the harness decides it (plan, tuner, dispatcher, check, C API).
// A problem of the other pass is refused here with a reason; otherwise v.supports() decides. The config's own
// validity (ConfigSpace::check) is the caller's, as before.
Support support_for(const Variant &v, const AttentionProblem &p, const Config &c,
                    const DeviceInfo &dev);

class Registry {
public:
  void add(std::unique_ptr<Variant> v); // aborts on a duplicate name (a programming error)
  const Variant *find(const std::string &name) const;
  const Variant &get(const std::string &name) const; // throws UserError listing the known names
  const std::vector<std::unique_ptr<Variant>> &all() const { return variants_; }
  std::vector<std::string> names() const;

private:
  std::vector<std::unique_ptr<Variant>> variants_;
};

// kernels/catalog.cpp: the one list of variants.
void register_catalog(Registry &registry);
// The catalog, built once.
const Registry &catalog();

} // namespace fb
