// Ceilings measured on the device itself: reports divide by these, never by datasheet numbers.
#include "flashbench/buffers.hpp"
#include "flashbench/check.hpp"
#include "flashbench/counters.hpp"
#include "flashbench/nvtx.hpp"
#include "flashbench/probe.hpp"
#include "flashbench/timing.hpp"
#include "read_floor_kernel.cuh"

#include <cublas_v2.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace fb {

namespace {
// A plain 16-byte-per-thread copy: the reference point for the counters (its DRAM bytes are known exactly).
__global__ void copy_probe_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst,
                                  size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}
__global__ void empty_probe_kernel() {}
} // namespace

std::vector<ReadFloor> measure_read_floor(const DeviceInfo &dev, const std::vector<size_t> &sizes) {
  ScopedRange range{"read_floor"};
  std::vector<ReadFloor> out;
  cudaStream_t stream;
  FB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    const size_t max_bytes = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
    DeviceBuffer src(std::max<size_t>(max_bytes, 16)), sink(16);
    // Every byte 0x01: the fold can never produce the sentinel, and the data is not zeros.
    FB_CUDA_CHECK(cudaMemsetAsync(src.get(), 0x01, std::max<size_t>(max_bytes, 16), stream));
    Timer timer(dev, stream);
    TimingPolicy policy;
    policy.min_samples = 20;
    policy.min_time_s = 0.02;
    policy.timeout_s = 0.5;
    policy.max_noise = 0.02;
    for (const size_t bytes : sizes) {
      ReadFloor best;
      best.bytes = bytes;
      auto consider = [&](const TimingStats &t, int per_sm, int u) {
        if (best.median_us == 0 || t.median_us < best.median_us) {
          best.median_us = t.median_us;
          best.sm_clock_mhz = t.sm_clock_mhz;
          best.blocks_per_sm = per_sm;
          best.loads_in_flight = u;
        }
      };
      if (bytes == 0) {
        consider(timer.measure(
                     [&](cudaStream_t s) {
                       empty_probe_kernel<<<1, 32, 0, s>>>();
                       FB_CHECK_LAUNCH();
                     },
                     policy),
                 0, 0);
      } else {
        const size_t n = bytes / sizeof(uint4);
        for (int per_sm : {1, 2, 4, 8}) {
          const int blocks = dev.sm_count * per_sm;
          auto run_u = [&](auto u_tag) {
            constexpr int U = decltype(u_tag)::value;
            consider(timer.measure(
                         [&](cudaStream_t s) {
                           read_floor_kernel<U><<<blocks, 512, 0, s>>>(src.as<const uint4>(), n,
                                                                       sink.as<unsigned>());
                           FB_CHECK_LAUNCH();
                         },
                         policy),
                     per_sm, U);
          };
          run_u(std::integral_constant<int, 2>{});
          run_u(std::integral_constant<int, 4>{});
          run_u(std::integral_constant<int, 8>{});
        }
      }
      best.gbps = bytes / (best.median_us * 1e-6) / 1e9;
      out.push_back(best);
    }
    FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  cudaStreamDestroy(stream);
  return out;
}

void to_json(nlohmann::json &j, const ReadFloor &r) {
  j = nlohmann::json{{"bytes", r.bytes},
                     {"median_us", r.median_us},
                     {"gbps", r.gbps},
                     {"sm_clock_mhz", r.sm_clock_mhz},
                     {"blocks_per_sm", r.blocks_per_sm},
                     {"loads_in_flight", r.loads_in_flight}};
}

CopyProbe run_copy_probe(const DeviceInfo &dev, size_t bytes, bool with_counters) {
  ScopedRange range{"copy_probe"};
  CopyProbe out;
  out.bytes = bytes;
  cudaStream_t stream;
  FB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceBuffer src(bytes), dst(bytes);
    fill_normal(src.get(), DType::f32, static_cast<int64_t>(bytes / 4), 0x5eed0003, 1.0f, stream);
    const size_t n = bytes / sizeof(uint4);
    const int threads = 256;
    const int blocks = dev.sm_count * 8;
    auto launch = [&](cudaStream_t s) {
      copy_probe_kernel<<<blocks, threads, 0, s>>>(src.as<const uint4>(), dst.as<uint4>(), n);
      FB_CHECK_LAUNCH();
    };
    Timer timer(dev, stream);
    TimingPolicy policy;
    policy.min_time_s = 0.2;
    policy.timeout_s = 3;
    const TimingStats t = timer.measure(launch, policy);
    out.median_us = t.median_us;
    out.gbps = 2.0 * bytes / (t.median_us * 1e-6) / 1e9;
    KernelDesc k{"copy_probe_kernel", reinterpret_cast<const void *>(copy_probe_kernel), threads, 0,
                 blocks};
    out.occupancy = theoretical_occupancy(dev, k);
    if (with_counters) {
      CounterSession session(dev, default_metrics());
      out.counters = session.profile(
          "copy_probe", launch, [&] { timer.flush_l2(); }, stream);
    }
    FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  cudaStreamDestroy(stream);
  return out;
}

Ceilings measure_ceilings(const DeviceInfo &dev) {
  ScopedRange range{"probe"};
  Ceilings c;
  cudaStream_t stream;
  FB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Timer timer(dev, stream);
  TimingPolicy policy;
  policy.min_samples = 10;
  policy.min_time_s = 0.2;
  policy.timeout_s = 3.0;
  policy.max_noise = 0.01;

  // bf16 GEMM, 8192^3 on random data (zeros run faster and would flatter the ceiling).
  {
    const int n = 8192;
    c.gemm_mnk = n;
    DeviceBuffer a(size_t(n) * n * 2), b(size_t(n) * n * 2), out(size_t(n) * n * 2);
    fill_normal(a.get(), DType::bf16, int64_t(n) * n, 0x5eed0001, 1.0f, stream);
    fill_normal(b.get(), DType::bf16, int64_t(n) * n, 0x5eed0002, 1.0f, stream);
    cublasHandle_t h;
    FB_CUBLAS_CHECK(cublasCreate(&h));
    FB_CUBLAS_CHECK(cublasSetStream(h, stream));
    const float alpha = 1.f, beta = 0.f;
    auto gemm = [&](cudaStream_t) {
      FB_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(),
                                   CUDA_R_16BF, n, b.get(), CUDA_R_16BF, n, &beta, out.get(),
                                   CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    // Burst first (the GPU is cool), then sustained: under a power cap the SM clock falls over a long run of
    // products, and both numbers are facts about the device.
    for (int i = 0; i < 3; ++i)
      gemm(stream);
    cudaEvent_t e[11];
    for (auto &ev : e)
      FB_CUDA_CHECK(cudaEventCreate(&ev));
    FB_CUDA_CHECK(cudaEventRecord(e[0], stream));
    for (int i = 0; i < 10; ++i) {
      gemm(stream);
      FB_CUDA_CHECK(cudaEventRecord(e[i + 1], stream));
    }
    FB_CUDA_CHECK(cudaEventSynchronize(e[10]));
    std::vector<double> burst;
    for (int i = 0; i < 10; ++i) {
      float ms = 0;
      FB_CUDA_CHECK(cudaEventElapsedTime(&ms, e[i], e[i + 1]));
      burst.push_back(ms * 1e3);
    }
    for (auto &ev : e)
      cudaEventDestroy(ev);
    c.gemm_bf16_tflops_burst = 2.0 * n * double(n) * n / (summarize(burst).median_us * 1e-6) / 1e12;
    TimingStats t = timer.measure(gemm, policy);
    cublasDestroy(h);
    c.gemm_bf16_tflops = 2.0 * n * double(n) * n / (t.median_us * 1e-6) / 1e12;
    c.sm_clock_mhz = t.sm_clock_mhz;
  }
  // Device-to-device copy; bytes counted read + written.
  {
    const size_t bytes =
        std::min<size_t>(size_t(2) << 30, static_cast<size_t>(dev.total_mem_bytes / 8));
    DeviceBuffer src(bytes), dst(bytes);
    FB_CUDA_CHECK(cudaMemsetAsync(src.get(), 0x3c, bytes, stream));
    auto copy = [&](cudaStream_t s) {
      FB_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, s));
    };
    TimingStats t = timer.measure(copy, policy);
    c.copy_bytes = 2.0 * bytes;
    c.copy_gbps = c.copy_bytes / (t.median_us * 1e-6) / 1e9;
  }
  FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  return c;
}

void to_json(nlohmann::json &j, const Ceilings &c) {
  j = nlohmann::json{{"gemm_bf16_tflops", c.gemm_bf16_tflops},
                     {"gemm_bf16_tflops_burst", c.gemm_bf16_tflops_burst},
                     {"gemm_mnk", c.gemm_mnk},
                     {"copy_gbps", c.copy_gbps},
                     {"copy_bytes", c.copy_bytes},
                     {"sm_clock_mhz", c.sm_clock_mhz}};
}

} // namespace fb
