#include "flashbench/dispatch.hpp"

#include "flashbench/buffers.hpp"
#include "flashbench/check.hpp"
#include "flashbench/errors.hpp"

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace fb {

namespace {

// Variants "auto" never picks: they exist to test the harness.
bool test_only(const std::string &name) { return name.rfind("test_", 0) == 0; }

// The variant's default config for p when it supports p, else its first valid config that does (the defaults are
// tested to support every problem that any config supports: tests/kernels/test_default_configs.cpp).
std::optional<Config> supported_config(const Variant &v, const AttentionProblem &p,
                                       const DeviceInfo &dev) {
  const Config d = v.space().default_config(p, dev);
  if (!v.space().check(d) && support_for(v, p, d, dev))
    return d;
  for (const auto &e : v.space().expand())
    if (!e.invalid_reason && support_for(v, p, e.config, dev))
      return e.config;
  return std::nullopt;
}

} // namespace

Config complete_config(const Variant &v, const std::map<std::string, std::string> &given,
                       const AttentionProblem &p, const DeviceInfo &dev, std::string *source) {
  const ConfigSpace &space = v.space();
  // The rule sees the named axes (a deterministic run may want another order), and they win over what it sets.
  Config c = space.make(given, space.default_config(space.make(given), p, dev));
  if (source)
    *source = "unnamed axes from the default for the problem";
  if (!space.check(c) && support_for(v, p, c, dev))
    return c;
  Config base = space.make(given);
  if (base != c && !space.check(base) && support_for(v, p, base, dev)) {
    if (source)
      *source = "unnamed axes from the variant's base default (the problem's default does "
                "not combine with the named axes)";
    return base;
  }
  return c;
}

namespace {

std::vector<std::string> preference(const AttentionProblem &p) {
  std::vector<std::string> order;
  // The backward's variants; names the catalog lacks are passed over, and support_for() keeps every
  // forward variant out of a backward problem and the reverse.
  if (p.pass == Pass::bwd)
    return {"fa3_bwd", "fa2_bwd", "fa1_bwd"};
  if (p.dtype == DType::e4m3)
    order.push_back("fa3_fp8"); // the one variant that takes e4m3 (sm_90)
  if (p.seqlen_q <= 16)
    order.push_back("flash_decoding");
  // fa3_pipelined first: on Hopper it passes every GPU test and check and runs 1.4-1.9x fa2_q_outer on every
  // acceptance shape (kernels/fa3_pipelined/DESIGN.md); elsewhere its supports() says "needs sm_90a" and
  // fa2_q_outer is next.
  for (const char *n : {"fa3_pipelined", "fa2_q_outer", "fa1_kv_outer", "naive"})
    order.push_back(n);
  return order;
}

} // namespace

KernelChoice choose_kernel(const AttentionProblem &p, const DeviceInfo &dev,
                           const std::string &variant, const TuningTable *table) {
  const Registry &reg = catalog();
  std::vector<const Variant *> candidates;
  if (variant == "auto") {
    for (const auto &v : reg.all())
      if (!test_only(v->name()))
        candidates.push_back(v.get());
  } else {
    candidates.push_back(&reg.get(variant)); // UserError for an unknown name
    const Variant &v = *candidates.front();
    if (v.pass() != p.pass)
      throw UserError(
          support_for(v, p, v.space().default_config(), dev).reason +
          "; name a variant of that pass (flashbench list shows each one's) or \"auto\"");
  }

  // 1. The tuning table: the best measured entry among the candidates.
  if (table) {
    const TuningEntry *best = nullptr;
    const Variant *best_v = nullptr;
    bool best_exact = false;
    double best_d = 0;
    for (const Variant *v : candidates) {
      bool exact = false;
      double d = 0;
      const TuningEntry *e = table->lookup(v->name(), p, &exact, &d);
      if (!e || v->space().check(e->config) || !support_for(*v, p, e->config, dev))
        continue;
      // The nearer entry (exact: distance 0); at equal distance the higher measured TFLOPs.
      if (!best || d < best_d - 1e-9 ||
          (std::abs(d - best_d) <= 1e-9 && e->tflops > best->tflops)) {
        best = e;
        best_v = v;
        best_exact = exact;
        best_d = d;
      }
    }
    if (best)
      return {best_v, best->config,
              std::string("table ") + table->gpu.value("slug", "") + ": " +
                  (best_exact ? "" : "nearest ") + describe_bucket(*best) + ", " +
                  std::to_string(static_cast<int>(best->tflops)) + " TFLOP/s measured"};
  }

  // 2. The documented heuristic.
  const std::string why = table ? "no fitting table entry" : "no tuning table for " + dev.slug();
  if (variant != "auto") {
    if (auto c = supported_config(*candidates.front(), p, dev))
      return {candidates.front(), *c, "heuristic (" + why + "): default config"};
    throw UserError(variant + " supports " + key(p) + " with none of its configs on " + dev.name);
  }
  for (const auto &name : preference(p)) {
    const Variant *v = reg.find(name);
    if (!v)
      continue;
    if (auto c = supported_config(*v, p, dev))
      return {v, *c, "heuristic (" + why + "): preference order"};
  }
  throw UserError("no variant in the catalog supports " + key(p) + " on " + dev.name);
}

KernelChoice choose_kernel(const AttentionProblem &p, const DeviceInfo &dev,
                           const std::string &variant) {
  return choose_kernel(p, dev, variant, tuning_table_for(dev));
}

namespace {

// Scratch of one stream: the partials a split kernel writes and the semaphores it counts on. Calls on one stream
// run in order, so they can share it; calls on two streams may run at the same time on the GPU, so each stream has
// its own (a shared buffer let one launch's combine read another's partials and tickets).
struct StreamScratch {
  DeviceBuffer workspace;
  DeviceBuffer semaphores; // zeroed when allocated; every launch leaves them zero
};

struct DeviceState {
  std::mutex mu;
  DeviceInfo info;
  // Keyed by handle and stream id: the handles 0 (under --default-stream per-thread) and cudaStreamPerThread name a
  // different stream in each host thread, and a destroyed stream's handle can come back for a new stream.
  std::map<std::pair<cudaStream_t, unsigned long long>, StreamScratch> scratch; // guarded by mu
};

bool shared_handle(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

// This stream's scratch. A handle seen before with another id belonged to a stream that has been destroyed: its
// buffers go (freeing waits for the device, so work still queued on the old stream finishes first).
StreamScratch &scratch_for(DeviceState &s, cudaStream_t stream) {
  unsigned long long id = 0;
  FB_CUDA_CHECK(cudaStreamGetId(stream, &id));
  const auto key = std::make_pair(stream, id);
  auto it = s.scratch.find(key);
  if (it != s.scratch.end())
    return it->second;
  if (!shared_handle(stream))
    for (auto e = s.scratch.begin(); e != s.scratch.end();)
      e = e->first.first == stream ? s.scratch.erase(e) : std::next(e);
  return s.scratch[key];
}

DeviceState &device_state(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<DeviceState>> states;
  std::lock_guard<std::mutex> lock(mu);
  auto &s = states[device];
  if (!s) {
    s = std::make_unique<DeviceState>();
    s->info = query_device(device);
  }
  return *s;
}

// Replaces `buf` by one of `need` bytes (zeroed if `zero`) once the stream's earlier calls, which may still use it,
// are done. Not while the stream is being captured into a graph: the synchronisation is not allowed there, and a
// graph would keep the old address.
void grow(DeviceBuffer &buf, size_t need, bool zero, cudaStream_t stream, const char *what) {
  if (need <= buf.bytes())
    return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FB_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone)
    throw UserError(std::string("attention_forward: this stream's ") + what + " must grow to " +
                    std::to_string(need) +
                    " bytes while the stream is being captured into a CUDA graph; make one "
                    "call with the largest problem on this stream before the capture");
  FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  buf = DeviceBuffer();
  buf = DeviceBuffer(need);
  if (zero)
    FB_CUDA_CHECK(cudaMemset(buf.get(), 0, need));
}

} // namespace

void attention_forward(const AttentionProblem &p, const void *q, const void *k, const void *v,
                       void *o, float *lse, cudaStream_t stream, const std::string &variant) {
  validate(p);
  if (p.pass != Pass::fwd)
    throw UserError("attention_forward computes the forward pass; " + key(p) +
                    " is a backward problem (pass: bwd): set pass = fwd");
  if (!p.kv_lens.empty() || p.paged())
    throw UserError(
        "attention_forward takes dense problems; for per-sequence KV lengths or a paged cache call "
        "the variant's launch() with LaunchArgs (cache_seqlens, page_table)");
  int device = 0;
  FB_CUDA_CHECK(cudaGetDevice(&device));
  DeviceState &s = device_state(device);
  const KernelChoice choice = choose_kernel(p, s.info, variant);
  std::lock_guard<std::mutex> lock(s.mu);
  StreamScratch &scratch = scratch_for(s, stream);
  grow(scratch.workspace, choice.variant->workspace_bytes(p, choice.config), false, stream,
       "workspace");
  grow(scratch.semaphores, choice.variant->semaphore_bytes(p, choice.config), true, stream,
       "semaphores");
  LaunchArgs args;
  args.q = q;
  args.k = k;
  args.v = v;
  args.o = o;
  args.lse = lse;
  args.workspace = scratch.workspace.get();
  args.workspace_bytes = scratch.workspace.bytes();
  args.semaphores = scratch.semaphores.get();
  args.semaphore_bytes = scratch.semaphores.bytes();
  choice.variant->launch(p, choice.config, args, stream);
}

} // namespace fb
