// Host side of fa3_pipelined: the instantiation a problem runs, the kernel's arguments (tensor
// maps, work order, stream-K tail), its grid and shared memory, and the table of compiled tiles.
#pragma once

#include "kernels/common/hopper/tensor_map.hpp"
#include "kernels/common/sm_count.hpp"
#include "kernels/fa3_pipelined/kernel.cuh"
#include "kernels/fa3_pipelined/trace.cuh"
#include "kernels/fa3_pipelined/traits.hpp"

#include "flashbench/check.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

namespace fb::fa3 {
namespace detail {

// The instantiation of a tile that a problem runs with a scheduler (traits.hpp, kernel_mode); the
// all-paths kernel, which every tile compiles, where the problem's own is not compiled.
using KernelPtr = void (*)(const KernelArgs);
template <class T, int D, int BN, bool OVERLAP, bool WIDE>
KernelPtr kernel_fn(const AttentionProblem &p, int scheduler) {
  if constexpr (modes_compiled(D, BN)) {
    switch (kernel_mode(D, BN, p, scheduler)) {
    case kModePlain:
      return &fa3_kernel<T, D, BN, OVERLAP, WIDE, kModePlain>;
    case kModeCausal:
      return &fa3_kernel<T, D, BN, OVERLAP, WIDE, kModeCausal>;
    case kModeSplit:
      if constexpr (split_compiled(D))
        return &fa3_kernel<T, D, BN, OVERLAP, WIDE, kModeSplit>;
      break;
    default:
      break;
    }
  }
  return &fa3_kernel<T, D, BN, OVERLAP, WIDE, kModeAny>;
}
template <class T, int D, int BN, bool OVERLAP, bool WIDE>
const void *kernel_ptr(const AttentionProblem &p, int scheduler) {
  return reinterpret_cast<const void *>(kernel_fn<T, D, BN, OVERLAP, WIDE>(p, scheduler));
}

// The device's SM count and L2 size (kernels/common/sm_count.hpp, read once per process), and the
// resident CTAs per SM of one instantiation at one shared-memory size, asked once per (kernel,
// size): launch_tile needs both on every launch (the persistent grid, the work order's sections),
// and a timed launch should not pay the driver's occupancy calculator each time.
using fb::kernels::l2_bytes;
using fb::kernels::sm_count;
inline int resident_per_sm(const void *kernel, int threads, int64_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void *, int, int64_t>, int> cache;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, threads, smem);
  if (const auto it = cache.find(key); it != cache.end())
    return it->second;
  int per_sm = 0;
  FB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads,
                                                              static_cast<size_t>(smem)));
  return cache[key] = per_sm;
}

template <class T, int D, int BN, bool OVERLAP, bool WIDE>
void launch_tile(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
                 cudaStream_t stream) {
  KernelArgs a{};
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  a.tm_q = make_tile_map(args.q, p.dtype, D, p.seqlen_q, p.heads_q, p.batch, qs, c.block_m);
  a.tm_k = make_tile_map(args.k, p.dtype, D, p.seqlen_kv, p.heads_kv, p.batch, ks, BN);
  a.tm_v = make_tile_map(args.v, p.dtype, D, p.seqlen_kv, p.heads_kv, p.batch, ks, BN);
  a.o_tma = o_staged(D, c) ? 1 : 0;
  a.q_bufs = q_buffers(D, c);
  a.rescale_slack = kRescaleSlack;
  a.wg_pass = 1;
  a.half_diag = 1;
  if (a.o_tma)
    a.tm_o =
        make_tile_map(args.o, p.dtype, D, p.seqlen_q, p.heads_q, p.batch, qs, kRowsPerWarpgroup);
  a.o = args.o;
  a.lse = args.lse;
  a.o_batch = qs.batch, a.o_seq = qs.seq, a.o_head = qs.head;
  a.q = args.q;
  a.k = args.k;
  a.k_batch = ks.batch, a.k_seq = ks.seq, a.k_head = ks.head;
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.seqlen_kv = static_cast<int>(p.seqlen_kv);
  a.heads_q = static_cast<int>(p.heads_q);
  a.group = static_cast<int>(p.group_size());
  a.scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
  const KernelPtr kernel = kernel_fn<T, D, BN, OVERLAP, WIDE>(p, c.scheduler);
  const int64_t smem = launch_smem_bytes(D, c);
  FB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  const int threads = 128 * (1 + c.consumers);
  const LaunchPlan plan = plan_launch(
      p, c, D, sm_count(), resident_per_sm(reinterpret_cast<const void *>(kernel), threads, smem),
      l2_bytes());
  a.total_tiles = static_cast<int>(plan.total_tiles);
  a.order = TileDecoder(plan.order);
  a.split = plan.split;
  a.heads_q_div = fb::kernels::FastDiv(uint32_t(p.heads_q));
  a.stages_div = fb::kernels::FastDiv(uint32_t(c.stages));
  a.claims = nullptr;
  if (c.scheduler == kSchedDynamic || c.scheduler == kSchedStreamK) {
    if (args.semaphores == nullptr || args.semaphore_bytes < kDynamicSemaphoreBytes)
      throw std::invalid_argument("fa3_pipelined: scheduler dynamic needs " +
                                  std::to_string(kDynamicSemaphoreBytes) +
                                  " bytes of zeroed semaphores (LaunchArgs::semaphores)");
    a.claims = static_cast<int *>(args.semaphores);
  }
  a.stages = c.stages;
  a.consumers = c.consumers;
  a.pingpong = c.pingpong;
  a.causal = p.causal ? 1 : 0;

  a.partials = nullptr;
  a.split_flags = nullptr;
  if (c.scheduler == kSchedStreamK) {
    if (p.causal)
      throw std::invalid_argument("fa3_pipelined: scheduler stream_k is for non-causal problems "
                                  "(equal work tiles); use dynamic for causal");
    const int64_t ws = split_workspace_bytes(D, c.consumers);
    const size_t sem = split_semaphore_bytes(c.consumers);
    if (args.workspace == nullptr || int64_t(args.workspace_bytes) < ws ||
        args.semaphores == nullptr || args.semaphore_bytes < sem)
      throw std::invalid_argument("fa3_pipelined: scheduler stream_k needs " + std::to_string(ws) +
                                  " bytes of workspace and " + std::to_string(sem) +
                                  " bytes of zeroed semaphores");
    a.partials = static_cast<float *>(args.workspace);
    a.split_flags = static_cast<int *>(args.semaphores) + 2; // after the claim counters
  }
  const int grid = static_cast<int>(plan.grid);
  kernel<<<grid, threads, static_cast<size_t>(smem), stream>>>(a);
  FB_CHECK_LAUNCH();
  FA3_TRACE_ONLY(trace_dump(grid, stream);)
}

} // namespace detail

// The compiled instantiations of one (T, D) slice: block_n x intra_wg_overlap x (3 consumers or
// not), as tile_compiled() (traits.hpp) allows; block_m, stages, consumers 1-2, pingpong and the
// scheduler are run-time parameters. visit_tile calls f(Tile<BN, OV, W>{}) for the instantiation a
// config needs and returns its result, or R{} when none is compiled.
template <int BN, bool OV, bool W> struct Tile {
  static constexpr int block_n = BN;
  static constexpr bool overlap = OV, wide = W;
};
template <int D, class R, class F> R visit_tile(const Params &c, F &&f) {
  const bool ov = c.intra_overlap != 0, w = c.consumers == 3;
  R r{};
  auto try_one = [&](auto tile) {
    using X = decltype(tile);
    if constexpr (tile_compiled(D, X::block_n, X::wide))
      if (c.block_n == X::block_n && ov == X::overlap && w == X::wide)
        r = f(tile);
  };
  try_one(Tile<64, false, false>{});
  try_one(Tile<64, true, false>{});
  try_one(Tile<128, false, false>{});
  try_one(Tile<128, true, false>{});
  try_one(Tile<192, false, false>{});
  try_one(Tile<192, true, false>{});
  try_one(Tile<64, false, true>{});
  try_one(Tile<64, true, true>{});
  try_one(Tile<128, false, true>{});
  try_one(Tile<128, true, true>{});
  return r;
}
template <class T, int D> LaunchFn pick_launch(const Params &c) {
  return visit_tile<D, LaunchFn>(c, [](auto tile) -> LaunchFn {
    using X = decltype(tile);
    return &detail::launch_tile<T, D, X::block_n, X::overlap, X::wide>;
  });
}
template <class T, int D> KernelFn pick_kernel(const Params &c) {
  return visit_tile<D, KernelFn>(c, [](auto tile) -> KernelFn {
    using X = decltype(tile);
    return &detail::kernel_ptr<T, D, X::block_n, X::overlap, X::wide>;
  });
}

} // namespace fb::fa3
