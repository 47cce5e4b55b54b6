// flashbench::attention_forward on the GPU: whatever the dispatcher picks (a tuning table when this GPU has one,
// else the heuristic) must compute attention, on shapes that steer it to different variants.
#include "flashbench/dispatch.hpp"
#include "gpu_test_util.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace fb::test {
namespace {

TEST(Dispatch, AttentionForwardMatchesTheReference) {
  FB_SKIP_WITHOUT_GPU();
  const Shape shapes[] = {
      {"prefill_bf16_causal", 2, 8, 2, 300, 300, 128, true, DType::bf16},
      {"prefill_f16", 1, 4, 4, 200, 257, 64, false, DType::f16},
      {"decode", 4, 8, 2, 1, 1000, 128, false, DType::bf16},
      {"fp32", 1, 2, 2, 77, 131, 64, true, DType::f32},
      // The defaults that follow the problem (ConfigSpace::default_config(p, dev)): fa3_pipelined's block_n 64 at
      // d256 and 3 consumer warpgroups at d64, where the table has no entry.
      {"prefill_d256_causal_gqa", 2, 6, 2, 333, 333, 256, true, DType::bf16},
      {"prefill_d64", 1, 6, 3, 500, 700, 64, false, DType::bf16},
  };
  // A named variant where it runs at all (its default for the problem is supported wherever any config is):
  // fa3_pipelined and fa2_q_outer take no fp32, fa3_pipelined needs sm_90.
  const auto runs = [](const std::string &name, const AttentionProblem &p) {
    if (name == "auto")
      return true;
    const Variant &v = catalog().get(name);
    return v.supports(p, v.space().default_config(p, test_device()), test_device()).ok;
  };
  for (const Shape &s : shapes)
    for (const char *variant : {"auto", "naive", "fa3_pipelined", "fa2_q_outer"}) {
      const AttentionProblem p = s.problem();
      if (!runs(variant, p))
        continue;
      Case c(p);
      const KernelChoice choice = choose_kernel(p, test_device(), variant);
      DeviceBuffer o(size_t(p.q_elems() * dtype_bytes(p.dtype))),
          lse(size_t(p.lse_elems()) * sizeof(float));
      poison(o.get(), o.bytes(), nullptr);
      poison(lse.get(), lse.bytes(), nullptr);
      flashbench::attention_forward(p, c.q(), c.k(), c.v(), o.get(), lse.as<float>(), nullptr,
                                    variant);
      FB_CUDA_CHECK(cudaDeviceSynchronize());
      const VerifyResult r = c.verify_against_reference(
          download_as_float(o.get(), p.dtype, p.q_elems()),
          download_as_float(lse.get(), DType::f32, p.lse_elems()), tolerance_for(p.dtype));
      EXPECT_TRUE(r.pass) << s.name << " via " << choice.variant->name() << " ["
                          << choice.variant->space().to_string(choice.config) << "] ("
                          << choice.source << "): " << r.summary();
    }
}

// Calls on several streams: each stream has its own scratch (partials, semaphores), because launches on two streams
// may run at the same time and a shared buffer would let one launch's combine read another's partials and tickets.
// Small decode problems (one KV group, a few splits each) and fresh inputs per stream; all streams are gated on one
// event so that their launches are queued before any runs, and their windows must overlap. What it does not show:
// on the H200 this was written on, the queued kernels still ran one after another (~1 us per queued operation, the
// windows ~100 us long), so the code before the per-stream scratch passed it too. It guards the results of
// multi-stream use; it did not reproduce the race there.
TEST(Dispatch, ConcurrentStreamsKeepTheirOwnScratch) {
  FB_SKIP_WITHOUT_GPU();
  const Shape s{"decode_small", 1, 4, 1, 1, 2000, 128, false, DType::bf16};
  const AttentionProblem p = s.problem();
  constexpr int kStreams = 8, kRounds = 4;
  const KernelChoice choice = choose_kernel(p, test_device(), "flash_decoding");
  ASSERT_GT(choice.variant->workspace_bytes(p, choice.config), 0u)
      << "the chosen config has no partials to share";
  std::vector<std::unique_ptr<Case>> cases;
  std::vector<DeviceBuffer> o, lse;
  std::vector<cudaStream_t> streams(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    cases.push_back(std::make_unique<Case>(p));
    o.emplace_back(size_t(p.q_elems() * dtype_bytes(p.dtype)));
    lse.emplace_back(size_t(p.lse_elems()) * sizeof(float));
    FB_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
  }
  // Round 0 allocates each stream's scratch (growing it waits for the stream, so not behind the gate).
  for (int i = 0; i < kStreams; ++i)
    flashbench::attention_forward(p, cases[i]->q(), cases[i]->k(), cases[i]->v(), o[i].get(),
                                  lse[i].as<float>(), streams[i], "flash_decoding");
  FB_CUDA_CHECK(cudaDeviceSynchronize());
  // Then every stream waits on one event until all its launches are queued, so that they start together rather
  // than one host call apart. The gate is a host function that spins until the test opens it (also on failure).
  std::atomic<bool> open{false};
  cudaStream_t gate;
  cudaEvent_t gate_open;
  FB_CUDA_CHECK(cudaStreamCreateWithFlags(&gate, cudaStreamNonBlocking));
  FB_CUDA_CHECK(cudaEventCreateWithFlags(&gate_open, cudaEventDisableTiming));
  FB_CUDA_CHECK(cudaLaunchHostFunc(
      gate,
      [](void *f) {
        while (!static_cast<std::atomic<bool> *>(f)->load())
          std::this_thread::yield();
      },
      &open));
  // Each stream's window (first launch to last) is timed: if the windows did not overlap, the test proves nothing.
  std::vector<cudaEvent_t> begin(kStreams), end(kStreams);
  std::string
      failure; // anything thrown while the gate is closed: open it and wait before reporting
  try {
    FB_CUDA_CHECK(cudaEventRecord(gate_open, gate));
    for (int i = 0; i < kStreams; ++i) {
      FB_CUDA_CHECK(cudaEventCreate(&begin[i]));
      FB_CUDA_CHECK(cudaEventCreate(&end[i]));
      FB_CUDA_CHECK(cudaStreamWaitEvent(streams[i], gate_open));
      FB_CUDA_CHECK(cudaEventRecord(begin[i], streams[i]));
    }
    for (int r = 0; r < kRounds; ++r)
      for (int i = 0; i < kStreams; ++i) {
        poison(o[i].get(), o[i].bytes(), streams[i]);
        poison(lse[i].get(), lse[i].bytes(), streams[i]);
        flashbench::attention_forward(p, cases[i]->q(), cases[i]->k(), cases[i]->v(), o[i].get(),
                                      lse[i].as<float>(), streams[i], "flash_decoding");
      }
    for (int i = 0; i < kStreams; ++i)
      FB_CUDA_CHECK(cudaEventRecord(end[i], streams[i]));
  } catch (const std::exception &e) {
    failure = e.what();
  }
  open = true;
  FB_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_TRUE(failure.empty()) << failure;
  float last_begin = 0.f, first_end = 1e30f;
  std::string windows;
  for (int i = 0; i < kStreams; ++i) {
    float b = 0.f, e = 0.f;
    FB_CUDA_CHECK(cudaEventElapsedTime(&b, begin[0], begin[i]));
    FB_CUDA_CHECK(cudaEventElapsedTime(&e, begin[0], end[i]));
    last_begin = std::max(last_begin, b);
    first_end = std::min(first_end, e);
    windows += " [" + std::to_string(int(b * 1e3f)) + ", " + std::to_string(int(e * 1e3f)) + "] us";
  }
  for (int i = 0; i < kStreams;
       ++i) { // after the loop above: every window is timed from stream 0's start
    FB_CUDA_CHECK(cudaEventDestroy(begin[i]));
    FB_CUDA_CHECK(cudaEventDestroy(end[i]));
  }
  FB_CUDA_CHECK(cudaEventDestroy(gate_open));
  FB_CUDA_CHECK(cudaStreamDestroy(gate));
  EXPECT_LT(last_begin, first_end)
      << "the streams' launches did not overlap, so this run tests nothing:" << windows;
  std::printf("stream windows (from stream 0's start):%s; config %s\n", windows.c_str(),
              choice.variant->space().to_string(choice.config).c_str());
  for (int i = 0; i < kStreams; ++i) {
    const VerifyResult r = cases[i]->verify_against_reference(
        download_as_float(o[i].get(), p.dtype, p.q_elems()),
        download_as_float(lse[i].get(), DType::f32, p.lse_elems()), tolerance_for(p.dtype));
    EXPECT_TRUE(r.pass) << "stream " << i << " ["
                        << choice.variant->space().to_string(choice.config) << "] (seed "
                        << cases[i]->seed() << "): " << r.summary();
    FB_CUDA_CHECK(cudaStreamDestroy(streams[i]));
  }
}

} // namespace
} // namespace fb::test
