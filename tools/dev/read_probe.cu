// Read-rate probe (diagnostics, not part of the build): how fast can a cold read of the decode shapes' K+V go,
// by which kind of load? flashbench's read floor (harness/src/probe.cu) uses 16-byte ld.global.cs only; the
// decode kernel streams with cp.async. This compares, under the harness's timing (read flush of 2x L2, then
// events around one launch), for the bytes of GQA 32/8 d128 bf16 K+V at a given L:
//   ldcs   G blocks of 512 threads, U 16-byte loads in flight per thread (the read floor's kernel itself);
//   bulk   one thread per CTA streams a contiguous range through cp.async.bulk (1D TMA) into a shared ring;
//   tma    the decode layout: CTA (split, kv head) reads its keys' K and V rows (256 B, 2 KB apart in bshd)
//          as 3D TMA boxes of box_n tokens into a shared ring;
// and prints the median of `runs` launches of each.
//   nvcc -std=c++20 -O3 -arch=sm_90a -I. tools/dev/read_probe.cu -o read_probe -lcuda
//   ./read_probe L runs          (env PROBE_ONLY=prefix: only the modes whose names start with it)
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "harness/src/read_floor_kernel.cuh"
#include "tools/dev/dev_probe.cuh"

__device__ __forceinline__ unsigned smem_addr(const void *p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint64_t *b) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(b)));
}
__device__ __forceinline__ void bar_expect(uint64_t *b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t *b, unsigned parity) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p "
               "bra W;\n}" ::"r"(smem_addr(b)),
               "r"(parity)
               : "memory");
}

// One thread's ring of `stages` slots, one mbarrier each (one arrival: the issuing thread's expect_tx).
__device__ __forceinline__ void init_ring(uint64_t *bar, int stages) {
  for (int s = 0; s < stages; ++s)
    bar_init(&bar[s]);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Waits for the last min(n, stages) copies of a ring that issued n (the earlier ones were waited on before reuse).
__device__ __forceinline__ void drain_ring(uint64_t *bar, long n, int stages) {
  for (long i = (n > stages ? n - stages : 0); i < n; ++i)
    bar_wait(&bar[i % stages], unsigned((i / stages) & 1));
}

// One thread issues; the ring's slot s is reused once its previous copy has landed (nothing reads the data:
// the copies complete into shared memory whether or not anyone looks).
__global__ void bulk_kernel(const char *src, size_t bytes_per_cta, int chunk, int stages) {
  extern __shared__ __align__(1024) char ring[];
  __shared__ uint64_t bar[8];
  if (threadIdx.x != 0)
    return;
  init_ring(bar, stages);
  const char *base = src + blockIdx.x * bytes_per_cta;
  const long n = long(bytes_per_cta / chunk);
  for (long i = 0; i < n; ++i) {
    const int s = int(i % stages);
    const long use = i / stages;
    if (use > 0)
      bar_wait(&bar[s], unsigned((use - 1) & 1));
    bar_expect(&bar[s], chunk);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(smem_addr(ring + size_t(s) * chunk)),
        "l"(base + i * chunk), "r"(chunk), "r"(smem_addr(&bar[s]))
        : "memory");
  }
  drain_ring(bar, n, stages);
}

// bhsd = 0: map dims (d, head, token), box (128, hc, box_n), CTA (split, head block of hc);
// bhsd = 1: map dims (d, token, head), box (128, box_n, 1), CTA (split, head): each CTA's rows are contiguous.
__global__ void tma_kernel(const __grid_constant__ CUtensorMap mk,
                           const __grid_constant__ CUtensorMap mv, int tokens_per_split, int box_n,
                           int stages, int hc, int bhsd) {
  extern __shared__ __align__(1024) char ring[];
  __shared__ uint64_t bar[8];
  if (threadIdx.x != 0)
    return;
  init_ring(bar, stages);
  const int head = blockIdx.y * hc, t0 = blockIdx.x * tokens_per_split;
  const int n = tokens_per_split / box_n;
  const unsigned box_bytes = unsigned(box_n) * 256 * hc;
  for (int i = 0; i < n; ++i) {
    const int s = i % stages, use = i / stages;
    if (use > 0)
      bar_wait(&bar[s], unsigned((use - 1) & 1));
    bar_expect(&bar[s], 2 * box_bytes);
    const unsigned dk = smem_addr(ring + size_t(s) * 2 * box_bytes), dv = dk + box_bytes;
    const int t = t0 + i * box_n;
    const int c1 = bhsd ? t : head, c2 = bhsd ? head : t;
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, "
                 "%3, %4}], [%5];" ::"r"(dk),
                 "l"(&mk), "r"(0), "r"(c1), "r"(c2), "r"(smem_addr(&bar[s]))
                 : "memory");
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, "
                 "%3, %4}], [%5];" ::"r"(dv),
                 "l"(&mv), "r"(0), "r"(c1), "r"(c2), "r"(smem_addr(&bar[s]))
                 : "memory");
  }
  drain_ring(bar, n, stages);
}

// The decode kernel's loads without its math: 128 threads copy a tile of bn tokens x hc heads of K and of V
// (256 B per token and head, 16 B per cp.async) into a ring of `stages` tiles, wait for the oldest, issue the next.
__global__ void cpasync_kernel(const char *k, const char *v, int tokens_per_split, long tok_stride,
                               long head_stride, int hc, int bn, int stages) {
  extern __shared__ __align__(1024) char ring[];
  const int head = blockIdx.y * hc;
  const long t0 = long(blockIdx.x) * tokens_per_split;
  const int n = tokens_per_split / bn, chunks = bn * hc * 16; // 16-byte chunks per tensor per tile
  const int tile_bytes = chunks * 16;
  auto issue = [&](int i) {
    char *dst = ring + size_t(i % stages) * 2 * tile_bytes;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      const int tok = c / (hc * 16), hh = (c / 16) % hc, part = c % 16;
      const long off =
          (t0 + long(i) * bn + tok) * tok_stride + long(head + hh) * head_stride + part * 16;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst + c * 16)),
                   "l"(k + off));
      asm volatile(
          "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst + tile_bytes + c * 16)),
          "l"(v + off));
    }
    asm volatile("cp.async.commit_group;");
  };
  for (int i = 0; i < stages - 1 && i < n; ++i)
    issue(i);
  for (int i = 0; i < n; ++i) {
    // tile i has landed once at most stages - 2 newer groups are pending (wait_group takes an immediate)
    if (stages == 3)
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    else if (stages == 4)
      asm volatile("cp.async.wait_group 2;" ::: "memory");
    else
      asm volatile("cp.async.wait_group 4;" ::: "memory");
    __syncthreads();
    if (i + stages - 1 < n)
      issue(i + stages - 1);
    else
      asm volatile("cp.async.commit_group;");
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// The decode kernel's per-warp rings with one cp.async.bulk per K or V row (row_bytes, tok_stride apart):
// W warps; warp w's sub-tile t is keys t0 + t * W * kw + w * kw, + kw; lane l copies rows l, l + 32, ... of
// the 2 * kw rows (K then V); the stage's mbarrier takes the bytes; the warp waits, then refills.
__global__ void bulkrows_kernel(const char *k, const char *v, int tokens_per_split, long tok_stride,
                                long head_stride, int row_bytes, int kw, int stages, int pad) {
  extern __shared__ __align__(1024) char ring[];
  __shared__ uint64_t bar[16][8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, W = blockDim.x / 32;
  const long t0 = long(blockIdx.x) * tokens_per_split;
  const char *kb = k + long(blockIdx.y) * head_stride, *vb = v + long(blockIdx.y) * head_stride;
  const int rs = row_bytes + pad, sub = 2 * kw * rs;
  char *wring = ring + size_t(warp) * stages * sub;
  const int n = tokens_per_split / (W * kw);
  if (lane == 0)
    init_ring(bar[warp], stages);
  __syncwarp();
  auto issue = [&](int t) {
    const int s = t % stages;
    if (lane == 0)
      bar_expect(&bar[warp][s], 2 * kw * row_bytes);
    __syncwarp();
    for (int e = lane; e < 2 * kw; e += 32) {
      const int r = e % kw;
      const long j = t0 + long(t) * W * kw + warp * kw + r;
      const char *src = (e < kw ? kb : vb) + j * tok_stride;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                   "%2, [%3];" ::"r"(smem_addr(wring + s * sub + e * rs)),
                   "l"(src), "r"(row_bytes), "r"(smem_addr(&bar[warp][s]))
                   : "memory");
    }
  };
  for (int t = 0; t < stages - 1 && t < n; ++t)
    issue(t);
  for (int t = 0; t < n; ++t) {
    bar_wait(&bar[warp][t % stages], unsigned((t / stages) & 1));
    __syncwarp();
    if (t + stages - 1 < n)
      issue(t + stages - 1);
  }
}

static CUtensorMap make_map(void *p, int L, int box_n, int hc, bool bhsd) {
  CUtensorMap m;
  const cuuint64_t dims_s[3] = {128, 8, cuuint64_t(L)}, dims_h[3] = {128, cuuint64_t(L), 8};
  const cuuint64_t strides_s[2] = {256, 2048},
                   strides_h[2] = {256, cuuint64_t(L) * 256}; // bytes, dims 1 and 2
  const cuuint32_t box_s[3] = {128, cuuint32_t(hc), cuuint32_t(box_n)},
                   box_h[3] = {128, cuuint32_t(box_n), 1};
  const cuuint64_t *dims = bhsd ? dims_h : dims_s, *strides = bhsd ? strides_h : strides_s;
  const cuuint32_t *box = bhsd ? box_h : box_s;
  const cuuint32_t es[3] = {1, 1, 1};
  const CUresult r =
      cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, p, dims, strides, box, es,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d) for box_n %d\n", int(r), box_n);
    std::exit(1);
  }
  return m;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s L runs\n", argv[0]);
    return 2;
  }
  const int L = std::atoi(argv[1]), runs = std::atoi(argv[2]);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const size_t half = size_t(L) * 8 * 128 * 2,
               bytes = 2 * half; // K, then V, each L x 8 heads x 128 bf16
  char *kv;
  unsigned *sink;
  CK(cudaMalloc(&kv, bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(kv, 0x01, bytes));
  const size_t fl = 2 * size_t(prop.l2CacheSize);
  uint4 *flush;
  CK(cudaMalloc(&flush, fl));
  CK(cudaMemset(flush, 1, fl));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  CK(cudaFuncSetAttribute(tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  CK(cudaFuncSetAttribute(bulkrows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          200 * 1024));
  CK(cudaFuncSetAttribute(cpasync_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));

  const char *only = std::getenv("PROBE_ONLY"); // run only the modes whose names start with this
  auto time = [&](const char *name, const std::function<void()> &launch) {
    if (only && std::strncmp(name, only, std::strlen(only)) != 0)
      return;
    std::vector<float> v;
    for (int r = 0; r < runs; ++r) {
      read_flush<<<sms * 4, 512>>>(flush, fl / 16, sink);
      CK(cudaEventRecord(e0));
      launch();
      CK(cudaEventRecord(e1));
      CK(cudaDeviceSynchronize());
      CK(cudaGetLastError());
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      v.push_back(ms * 1e3f);
    }
    std::sort(v.begin(), v.end());
    const float med = v[v.size() / 2];
    std::printf("%-40s median %8.2f us  min %8.2f  %7.0f GB/s\n", name, med, v.front(),
                bytes / (med * 1e-6) / 1e9);
    std::fflush(stdout);
  };
  char name[128];
  for (int pass = 0; pass < 2; ++pass) { // twice: the second pass shows the drift inside this call
    std::printf("# pass %d, L %d, %zu bytes, %d SMs\n", pass, L, bytes, sms);
    for (int g : {128, sms, sms * 4, sms * 8})
      for (int u : {4, 8}) {
        std::snprintf(name, sizeof name, "ldcs G%d U%d", g, u);
        time(name, [&] {
          if (u == 4)
            fb::read_floor_kernel<4>
                <<<g, 512>>>(reinterpret_cast<const uint4 *>(kv), bytes / 16, sink);
          else
            fb::read_floor_kernel<8>
                <<<g, 512>>>(reinterpret_cast<const uint4 *>(kv), bytes / 16, sink);
        });
      }
    for (int g : {128, 256, 512})
      for (int chunk : {16384, 32768, 65536})
        for (int stages : {2, 4, 6}) {
          if (size_t(chunk) * stages > 200 * 1024 || bytes % (size_t(g) * chunk))
            continue;
          std::snprintf(name, sizeof name, "bulk G%d chunk %dK stages %d", g, chunk / 1024, stages);
          const size_t per = bytes / g;
          time(name,
               [&] { bulk_kernel<<<g, 32, size_t(chunk) * stages>>>(kv, per, chunk, stages); });
        }
    // TMA, bshd, hc heads per CTA (hc * 256 contiguous bytes per token), and bhsd (contiguous per CTA).
    for (int hc : {1, 2, 8})
      for (int box_n : {8, 16, 32, 64, 128, 256})
        for (int stages : {3, 4}) {
          const size_t stage_bytes = size_t(box_n) * 512 * hc;
          if (stage_bytes * stages > 200 * 1024 || stage_bytes < 32768)
            continue;
          const CUtensorMap mk = make_map(kv, L, box_n, hc, false),
                            mv = make_map(kv + half, L, box_n, hc, false);
          const int splits = 16 * hc, per = L / splits;
          if (per % box_n)
            continue;
          std::snprintf(name, sizeof name, "tma bshd hc %d box_n %d stages %d", hc, box_n, stages);
          time(name, [&] {
            tma_kernel<<<dim3(splits, 8 / hc), 32, stage_bytes * stages>>>(mk, mv, per, box_n,
                                                                           stages, hc, 0);
          });
        }
    for (int box_n : {64, 128, 256})
      for (int stages : {2, 3, 4}) {
        const size_t stage_bytes = size_t(box_n) * 512;
        if (stage_bytes * stages > 200 * 1024)
          continue;
        const CUtensorMap mk = make_map(kv, L, box_n, 1, true),
                          mv = make_map(kv + half, L, box_n, 1, true);
        const int per = L / 16;
        std::snprintf(name, sizeof name, "tma bhsd box_n %d stages %d", box_n, stages);
        time(name, [&] {
          tma_kernel<<<dim3(16, 8), 32, stage_bytes * stages>>>(mk, mv, per, box_n, stages, 1, 1);
        });
      }
    // cp.async.bulk per row, the decode kernel's per-warp rings (bshd: 256 B rows 2 KB apart; bhsd contiguous).
    for (int layout = 0; layout < 2; ++layout)
      for (int w : {4, 8})
        for (int kw : {16, 32})
          for (int stages : {3, 4, 6}) {
            const size_t bytes_smem = size_t(w) * stages * 2 * kw * 272;
            if (bytes_smem > 200 * 1024)
              continue;
            const int per = L / 16;
            const long tok = layout ? 256 : 2048, hs = layout ? long(L) * 256 : 256;
            std::snprintf(name, sizeof name, "bulkrows %s W%d kw %d stages %d",
                          layout ? "bhsd" : "bshd", w, kw, stages);
            time(name, [&] {
              bulkrows_kernel<<<dim3(16, 8), 32 * w, bytes_smem>>>(kv, kv + half, per, tok, hs, 256,
                                                                   kw, stages, 16);
            });
          }
    // cp.async (the decode kernel's loads), bshd with hc heads per CTA and bhsd.
    for (int layout = 0; layout < 2; ++layout)
      for (int hc : {1, 2, 8}) {
        if (layout == 1 && hc != 1)
          continue;
        for (int bn : {8, 16, 32, 64, 128})
          for (int stages : {3, 4, 6}) {
            const size_t stage_bytes = size_t(bn) * 512 * hc; // K + V
            if (stage_bytes * stages > 200 * 1024 || stage_bytes < 16384 ||
                stage_bytes * stages < 65536)
              continue;
            const int splits = 16 * hc, per = L / splits;
            const long tok = layout ? 256 : 2048, hs = layout ? long(L) * 256 : 256;
            std::snprintf(name, sizeof name, "cp.async %s hc %d bn %d stages %d",
                          layout ? "bhsd" : "bshd", hc, bn, stages);
            time(name, [&] {
              cpasync_kernel<<<dim3(splits, 8 / hc), 128, stage_bytes * stages>>>(
                  kv, kv + half, per, tok, hs, hc, bn, stages);
            });
          }
      }
  }
  return 0;
}
