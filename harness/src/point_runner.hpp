// Shared by `run` and `check`: owns one problem's inputs, outputs and reference on the device, and runs a
// variant's point against them (poison, launch, wait with a deadline, verify).
#pragma once

#include "flashbench/buffers.hpp"
#include "flashbench/device.hpp"
#include "flashbench/kv_cache.hpp"
#include "flashbench/reference.hpp"
#include "flashbench/results.hpp"
#include "flashbench/variant.hpp"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

namespace fb {

class PointRunner {
public:
  PointRunner(const DeviceInfo &dev, cudaStream_t stream) : dev_(dev), stream_(stream) {}

  // Draws fresh inputs for p (a new seed each call) and computes the reference once. Cheap when p is unchanged.
  // Backward: Q, K, V and dO are drawn; O and LSE come from the forward reference (O rounded to the dtype), so
  // the kernel and the backward reference read identical inputs.
  void prepare(const AttentionProblem &p);
  uint64_t seed() const { return seed_; }
  const std::string &reference_kind() const { return reference_kind_; }

  // Poisons the outputs (forward: O and LSE; backward: dQ, dK and dV, never its inputs O and LSE), launches once,
  // waits (a launch that runs past `deadline_s` throws PointTimeout) and verifies against the reference; a launch
  // that leaves its semaphores non-zero fails too (the next launch would read them), and so does a backward launch
  // that changes any of its inputs. The backward poisons the workspace too: it is not promised zero.
  VerifyResult verify(const Variant &v, const Config &c, double deadline_s);
  // Launch arguments for timing; the workspace is sized for (v, c) by verify().
  LaunchArgs args() const;

private:
  // The reference for inputs q, k, v of problem p (the e4m3 path passes dequantized fp32 copies).
  void compute_reference(const AttentionProblem &p, const void *q, const void *k, const void *v);
  // The backward: O and LSE from the forward reference into o_ and lse_, then the gradients' reference.
  void prepare_backward(const AttentionProblem &p);
  VerifyResult verify_backward_outputs() const;
  // The backward's inputs, in input_bytes_'s order.
  std::vector<std::pair<const char *, const DeviceBuffer *>> backward_inputs() const;
  void ensure_workspace(size_t bytes);
  void ensure_semaphores(size_t bytes);

  DeviceInfo dev_;
  cudaStream_t stream_;
  bool prepared_ = false;
  AttentionProblem problem_;
  uint64_t seed_ = 0;
  DeviceBuffer q_, k_, v_, o_, lse_, workspace_;
  DeviceBuffer dout_, dq_, dk_, dv_; // backward only
  BackwardReference ref_grad_;       // backward only
  // Backward: the bytes of its inputs Q, K, V, O, dO and LSE as prepared, to check that a launch leaves them as it
  // found them (the timed launches reuse them).
  std::vector<std::vector<unsigned char>> input_bytes_;
  DeviceBuffer descales_[3]; // e4m3 problems: Q, K, V descales (LaunchArgs)
  DeviceBuffer
      semaphores_; // zeroed once when allocated; every launch leaves them zero (LaunchArgs)
  KvCacheBuffers
      kv_cache_; // cache_seqlens always; page table and K/V pools (then k_/v_ are freed) when paged
  std::vector<double> ref_o_, ref_lse_;
  std::vector<double> ref_o_abs_; // e4m3: the reference's O over |V| (Tolerance::p_round)
  std::string reference_kind_;
};

// A launch that did not finish before its deadline. The kernel may still be running: the context is unusable.
struct PointTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Waits for all work queued on `stream` so far, up to deadline_s seconds.
void wait_with_deadline(cudaStream_t stream, double deadline_s);

} // namespace fb
