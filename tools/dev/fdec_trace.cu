// Decode timeline probe (diagnostics, not part of the build): runs flash_decoding's split kernel at
// B=1 GQA 32/8 d128 bf16 (block_n 64, 4 warps) with FDEC_TRACE on, each launch after the harness's read
// flush, and writes every CTA's %globaltimer stamps (slots listed in flash_decoding.cuh) plus the event
// time; then the launch latency of trivial kernels on the same grid for reference.
// tools/dev/fdec_trace.py summarises the file. kernels/flash_decoding/HISTORY.md has what it found.
//   nvcc -std=c++20 -O3 -arch=sm_90a -DFDEC_TRACE [-DFDEC_TRACE_NOLOOP] -I. -Iharness/include \
//        tools/dev/fdec_trace.cu -o fdec_trace
//   ./fdec_trace L splits stages runs out.txt     (env: FDEC_WARM=1 runs the kernel once with no keys
//   before each timed launch; FDEC_STAMP_SMEM=1 gives the stamp kernel the split kernel's shared memory)
#include "kernels/flash_decoding/flash_decoding.cuh"
#include "tools/dev/dev_probe.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void fill(__nv_bfloat16 *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = __float2bfloat16(float(h & 0xffff) / 32768.f - 1.f);
  }
}

__global__ void stamp(unsigned long long *t) {
  extern __shared__ int sm[];
  unsigned long long v;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  atomicMax(t, v); // the last block's stamp: when the SMs were free for the next kernel
}

// Entry-latency references: a kernel that only stamps its entry, with no parameters and with the split
// kernel's parameter block.
__device__ unsigned long long probe_entry[2048];
__global__ void entry_plain() {
  unsigned long long v;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  if (threadIdx.x == 0)
    probe_entry[blockIdx.x + gridDim.x * blockIdx.y] = v;
}
__global__ void entry_args(const fb::fdec::KArgs<__nv_bfloat16> a) {
  unsigned long long v;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  if (threadIdx.x == 0)
    probe_entry[blockIdx.x + gridDim.x * blockIdx.y] = v + (a.splits == 12345 ? 1 : 0);
}

int main(int argc, char **argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s L splits stages runs out.txt\n", argv[0]);
    return 2;
  }
  const int L = std::atoi(argv[1]), splits = std::atoi(argv[2]), stages = std::atoi(argv[3]),
            runs = std::atoi(argv[4]);
  constexpr int D = 128, HQ = 32, HKV = 8, W = 4, KW = 16, BN = W * KW;
  using T = __nv_bfloat16;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t kv = size_t(L) * HKV * D;
  T *q, *k, *v, *o;
  float *lse, *opart, *lpart;
  unsigned *cnt, *sink;
  CK(cudaMalloc(&q, HQ * D * sizeof(T)));
  CK(cudaMalloc(&k, kv * sizeof(T)));
  CK(cudaMalloc(&v, kv * sizeof(T)));
  CK(cudaMalloc(&o, HQ * D * sizeof(T)));
  CK(cudaMalloc(&lse, HQ * sizeof(float)));
  CK(cudaMalloc(&opart, size_t(HKV) * splits * 16 * D * sizeof(float)));
  CK(cudaMalloc(&lpart, size_t(HKV) * splits * 16 * sizeof(float)));
  CK(cudaMalloc(&cnt, 4096));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(cnt, 0, 4096));
  fill<<<1024, 256>>>(q, HQ * D, 1u);
  fill<<<1024, 256>>>(k, kv, 2u);
  fill<<<1024, 256>>>(v, kv, 3u);
  const size_t fl = 2 * size_t(prop.l2CacheSize);
  uint4 *flush;
  CK(cudaMalloc(&flush, fl));
  CK(cudaMemset(flush, 1, fl));

  fb::fdec::KArgs<T> a{};
  a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.o_part = opart, a.lse_part = lpart,
  a.counters = cnt;
  a.q_batch = HQ * D, a.q_seq = HQ * D, a.q_head = D;
  a.k_batch = int64_t(L) * HKV * D, a.k_seq = HKV * D, a.k_head = D;
  a.seqlen_q = 1, a.seqlen_kv = L, a.heads_q = HQ, a.heads_kv = HKV, a.group = HQ / HKV,
  a.rows = HQ / HKV;
  a.m_blocks = 1, a.splits = splits;
  a.keys_per_split = ((L + splits - 1) / splits + BN - 1) / BN * BN;
  a.stages = stages;
  a.scale_log2 = float(1.0 / std::sqrt(double(D)) * 1.4426950408889634);
  a.fused = true;
  const int smem = stages * BN * D * 2 * 2;
  auto kern = fb::fdec::split_kernel<T, D, KW, W>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(splits, HKV, 1);
  const int ctas = splits * HKV;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<unsigned long long> tr(size_t(ctas) * 32);
  FILE *f = std::fopen(argv[5], "w");
  std::fprintf(f, "# L %d splits %d stages %d ctas %d kv_bytes %zu sms %d\n", L, splits, stages,
               ctas, 2 * kv * sizeof(T), prop.multiProcessorCount);
  unsigned long long *stamp_d;
  CK(cudaMalloc(&stamp_d, 8));
  // FDEC_STAMP_SMEM: the stamp kernel asks for the split kernel's shared memory, so the SM's L1/shared
  // split is already set when the split kernel starts (does the switch cost launch time?).
  const char *ss = std::getenv("FDEC_STAMP_SMEM");
  const int stamp_smem = ss && std::atoi(ss) ? smem : 0;
  CK(cudaFuncSetAttribute(stamp, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const char *wv = std::getenv("FDEC_WARM");
  const bool warm = wv && std::atoi(wv);
  std::vector<float> ms_all;
  for (int r = 0; r < runs; ++r) {
    std::vector<unsigned long long> zero(size_t(ctas) * 32, 0ull);
    CK(cudaMemcpyToSymbol(fb::fdec::fdec_trace, zero.data(), zero.size() * 8));
    read_flush<<<prop.multiProcessorCount * 4, 512>>>(flush, fl / 16, sink);
    if (warm) { // the split kernel once with no keys: its code and constants are in L2 again
      fb::fdec::KArgs<T> z = a;
      z.seqlen_kv = 0;
      kern<<<grid, W * 32, smem>>>(z);
    }
    stamp<<<prop.multiProcessorCount, 32, stamp_smem>>>(stamp_d);
    CK(cudaEventRecord(e0));
    kern<<<grid, W * 32, smem>>>(a);
    CK(cudaEventRecord(e1));
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ms_all.push_back(ms);
    CK(cudaMemcpyFromSymbol(tr.data(), fb::fdec::fdec_trace, tr.size() * 8));
    unsigned long long st;
    CK(cudaMemcpy(&st, stamp_d, 8, cudaMemcpyDeviceToHost));
    std::fprintf(f, "run %d us %.3f stamp %llu\n", r, ms * 1e3, st);
    for (int c = 0; c < ctas; ++c) {
      std::fprintf(f, "cta %d", c);
      for (int s = 0; s < 32; ++s)
        std::fprintf(f, " %llu", tr[size_t(c) * 32 + s]);
      std::fprintf(f, "\n");
    }
  }
  std::fclose(f);
  // Launch latency references: flush, stamp, event, a probe kernel (same grid) stamping its entry.
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<double> gaps, evs;
    for (int r = 0; r < runs; ++r) {
      read_flush<<<prop.multiProcessorCount * 4, 512>>>(flush, fl / 16, sink);
      stamp<<<prop.multiProcessorCount, 32, stamp_smem>>>(stamp_d);
      CK(cudaEventRecord(e0));
      if (kind == 0)
        entry_plain<<<grid, W * 32>>>();
      else if (kind == 1)
        entry_args<<<grid, W * 32>>>(a);
      else
        entry_args<<<grid, W * 32, smem>>>(a);
      CK(cudaEventRecord(e1));
      CK(cudaDeviceSynchronize());
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      std::vector<unsigned long long> pe(ctas);
      CK(cudaMemcpyFromSymbol(pe.data(), probe_entry, ctas * 8));
      unsigned long long st;
      CK(cudaMemcpy(&st, stamp_d, 8, cudaMemcpyDeviceToHost));
      gaps.push_back((*std::min_element(pe.begin(), pe.end()) - st) / 1e3);
      evs.push_back(ms * 1e3);
    }
    std::sort(gaps.begin(), gaps.end());
    std::sort(evs.begin(), evs.end());
    std::printf("entry probe %s: stamp -> first entry median %.2f us, event %.2f us\n",
                kind == 0   ? "no args"
                : kind == 1 ? "KArgs"
                            : "KArgs + split smem",
                gaps[gaps.size() / 2], evs[evs.size() / 2]);
  }
  std::sort(ms_all.begin(), ms_all.end());
  std::printf("L %d splits %d stages %d: median %.2f us (min %.2f, max %.2f) over %d runs\n", L,
              splits, stages, ms_all[ms_all.size() / 2] * 1e3, ms_all.front() * 1e3,
              ms_all.back() * 1e3, runs);
  return 0;
}
