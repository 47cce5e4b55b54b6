// The trace build of fa3_pipelined (diagnostics; off unless FA3_TRACE is defined: cmake
// -DFLASHBENCH_FA3_TRACE=ON). Everything here is behind FA3_TRACE_ONLY, which drops its argument
// in ordinary builds: their code is the same as if the stamps were not written at all.
//
// %globaltimer stamps (32 ns) of every work item (a work tile, or a stream-K segment of one) on the
// first thread of each consumer warpgroup and on the producer thread, so that one launch's tile
// starts and ends can be read per CTA (tools/dev/fa3_trace.py). Lanes of a CTA's region: consumer
// warpgroup 0..2, producer 3; record 0 of a lane holds its start, end and item count, records
// 1.. its items in order:
//   consumer: q0 | hb << 32, n_tiles | part << 32, tf (fetch_tile entered: the previous item done),
//             t0 (the item handed over: its Q landed), ts (the first P packed), t1 (the last P V
//             retired), t2 (O or the partial out), the q_full wait passed, the first k_full wait
//             passed, S(0) retired, and O's fence entered and passed (0 with direct O stores);
//   producer: q0 | hb << 32, -, tq (Q load issued), -, tc (the claim of this item returned),
//             tv (the item's last V load issued), after the Q, after K(0), load_q entered, the Q
//             slot taken, the Q's first box issued.
// Plain stores only: a call (printf, a __noinline__ helper) in the kernel makes ptxas serialise
// every WGMMA (C7510), so the host prints them: launch_tile, after launch FA3_TRACE_LAUNCH of the
// process (the check's launches come first, so a timed one), writes "fa3trace ..." lines. Only the
// overlap path stamps. The stamps cost registers: a trace build may spill where the real one
// does not (it only warns), so read its times as a picture, not as results.
#pragma once

#include "flashbench/check.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#ifdef FA3_TRACE
#define FA3_TRACE_ONLY(...) __VA_ARGS__
#else
#define FA3_TRACE_ONLY(...)
#endif

#ifdef FA3_TRACE
#ifndef FA3_TRACE_LAUNCH
#define FA3_TRACE_LAUNCH 12
#endif

namespace fb::fa3::detail {

constexpr int kTraceRecords = 65536, kTraceWords = 12, kTraceLanes = 4;
constexpr int kTraceProducerLane = 3;
static __device__ unsigned long long fa3_trace_rec[kTraceRecords * kTraceWords];
__host__ __device__ constexpr int trace_per_lane(int grid) {
  return kTraceRecords / (grid * kTraceLanes) < 256 ? kTraceRecords / (grid * kTraceLanes) : 256;
}
__device__ __forceinline__ unsigned long long trace_now() {
  unsigned long long v;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  return v;
}
// Record k of this CTA's lane, or null past the lane's room.
__device__ __forceinline__ unsigned long long *trace_slot(int lane, int k) {
  const int per = trace_per_lane(gridDim.x);
  return k < per
             ? fa3_trace_rec + kTraceWords * ((int64_t(blockIdx.x) * kTraceLanes + lane) * per + k)
             : nullptr;
}
__device__ __forceinline__ void trace_put(int lane, int k, int word, unsigned long long v) {
  if (unsigned long long *x = trace_slot(lane, k))
    x[word] = v;
}
// The time now into word `word` of record k of `lane`.
__device__ __forceinline__ void trace_stamp(int lane, int k, int word) {
  trace_put(lane, k, word, trace_now());
}
__device__ __forceinline__ unsigned long long trace_meta(int q0, int hb) {
  return (unsigned long long)unsigned(q0) | (unsigned long long)unsigned(hb) << 32;
}

// Record 0 of a lane: its start, its end and how many items it recorded.
__device__ __forceinline__ void trace_close(int lane, unsigned long long t_begin,
                                            unsigned long long t_end, int items) {
  if (unsigned long long *r = trace_slot(lane, 0))
    r[0] = t_begin, r[1] = t_end, r[2] = unsigned(items);
}

// A consumer warpgroup's lane: its first thread stamps the current item's record (items + 1).
struct ConsumerTrace {
  int wg;
  bool tracer;
  unsigned long long t_begin;
  int items = 0;
  __device__ __forceinline__ explicit ConsumerTrace(int w)
      : wg(w), tracer(threadIdx.x % 128 == 0), t_begin(trace_now()) {
    if (tracer)
      trace_put(wg, 1, 2, t_begin);
  }
  __device__ __forceinline__ void put(int word, unsigned long long v) const {
    if (tracer)
      trace_put(wg, items + 1, word, v);
  }
  __device__ __forceinline__ void stamp(int word) const {
    if (tracer)
      trace_put(wg, items + 1, word, trace_now());
  }
  // The item's end (O or its partial out): the fence stamps of its epilogue and its metadata, then
  // on to the next record.
  template <class Ctx> __device__ __forceinline__ void end_item(const Ctx &c) {
    if (tracer)
      if (unsigned long long *x = trace_slot(wg, items + 1)) {
        x[6] = trace_now();
        x[10] = c.tf[0];
        x[11] = c.tf[1];
        x[0] = trace_meta(c.w.q0, c.w.hb);
        x[1] = (unsigned long long)unsigned(c.w.n_tiles) | (unsigned long long)unsigned(c.w.part)
                                                               << 32;
      }
    ++items;
  }
  __device__ __forceinline__ void finish() const {
    if (tracer)
      trace_close(wg, t_begin, trace_now(), items);
  }
};

// Host: after the launch just queued, the FA3_TRACE_LAUNCH-th of the process, print its records.
static void trace_dump(int grid, cudaStream_t stream) {
  static int launches = 0;
  if (++launches != FA3_TRACE_LAUNCH)
    return;
  const int per = trace_per_lane(grid);
  std::vector<unsigned long long> h(size_t(grid) * kTraceLanes * per * kTraceWords);
  FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  FB_CUDA_CHECK(cudaMemcpyFromSymbol(h.data(), fa3_trace_rec, h.size() * 8));
  std::printf("fa3trace launch %d grid %d per %d\n", launches, grid, per);
  for (int c = 0; c < grid; ++c)
    for (int lane = 0; lane < kTraceLanes; ++lane) {
      const unsigned long long *r = h.data() + (size_t(c) * kTraceLanes + lane) * per * kTraceWords;
      const int n = std::min(int(r[2]), per - 1);
      if (r[0] == 0 && n == 0)
        continue;
      std::printf("fa3trace lane %d %d %llu %llu %d\n", c, lane, r[0], r[1], n);
      for (int k = 1; k <= n; ++k) {
        const unsigned long long *x = r + k * kTraceWords;
        std::printf("fa3trace rec %d %d", c, lane);
        for (int w = 0; w < kTraceWords; ++w)
          std::printf(" %llu", x[w]);
        std::printf("\n");
      }
    }
  std::fflush(stdout);
}

} // namespace fb::fa3::detail
#endif
