// The FA3 (Hopper) variant as a catalog entry: support checks, traffic model, and the dispatch from
// a run-time config to the compiled instantiation (instances.hpp). Host logic only.
//
// The variant is always in the catalog (the catalog is built without touching a device: run and
// tune never create a CUDA context in the main process); on a device other than compute
// capability 9.0 every point is skipped with "needs sm_90a" by supports(). The kernels are compiled
// for sm_90a only.
#include "kernels/catalog.hpp"
#include "kernels/common/support.hpp"
#include "kernels/fa3_pipelined/instances.hpp"
#include "kernels/fa3_pipelined/traffic.hpp"
#include "kernels/fa3_pipelined/traits.hpp"

#include <climits>
#include <memory>
#include <stdexcept>
#include <string>

namespace fb {
namespace fa3 {
namespace {

LaunchFn find_launch(DType t, int64_t head_dim, const Params &c) {
  if (t == DType::bf16 && head_dim == 64)
    return pick_launch_bf16_d64(c);
  if (t == DType::bf16 && head_dim == 128)
    return pick_launch_bf16_d128(c);
  if (t == DType::bf16 && head_dim == 256)
    return pick_launch_bf16_d256(c);
  if (t == DType::f16 && head_dim == 64)
    return pick_launch_fp16_d64(c);
  if (t == DType::f16 && head_dim == 128)
    return pick_launch_fp16_d128(c);
  if (t == DType::f16 && head_dim == 256)
    return pick_launch_fp16_d256(c);
  return nullptr;
}

KernelFn find_kernel(DType t, int64_t head_dim, const Params &c) {
  if (t == DType::bf16 && head_dim == 64)
    return pick_kernel_bf16_d64(c);
  if (t == DType::bf16 && head_dim == 128)
    return pick_kernel_bf16_d128(c);
  if (t == DType::bf16 && head_dim == 256)
    return pick_kernel_bf16_d256(c);
  if (t == DType::f16 && head_dim == 64)
    return pick_kernel_fp16_d64(c);
  if (t == DType::f16 && head_dim == 128)
    return pick_kernel_fp16_d128(c);
  if (t == DType::f16 && head_dim == 256)
    return pick_kernel_fp16_d256(c);
  return nullptr;
}

} // namespace

void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream) {
  if (auto why = config_problem(c))
    throw std::invalid_argument("fa3_pipelined: " + *why);
  const LaunchFn fn = find_launch(p.dtype, p.head_dim, c);
  if (!fn)
    throw std::invalid_argument(
        "fa3_pipelined: no compiled kernel for " + std::string(to_string(p.dtype)) + " head_dim " +
        std::to_string(p.head_dim) + " block_n " + std::to_string(c.block_n));
  fn(p, c, args, stream);
}

} // namespace fa3

namespace {

class Fa3PipelinedVariant : public Variant {
public:
  std::string name() const override { return "fa3_pipelined"; }
  std::string description() const override {
    return "FlashAttention-3 style (Hopper sm_90a): TMA K/V ring on mbarriers, WGMMA for Q K^T and "
           "P V (P from "
           "registers), producer/consumer warpgroups with setmaxnreg, ping-pong and "
           "intra-warpgroup overlap";
  }
  const ConfigSpace &space() const override { return space_; }

  Support supports(const AttentionProblem &p, const Config &c,
                   const DeviceInfo &dev) const override {
    if (auto why = space_.check(c))
      return Support::no(*why);
    if (dev.present && dev.cc() != 90)
      return Support::no(
          "needs sm_90a (Hopper, compute capability 9.0: wgmma, TMA, setmaxnreg); the device is " +
          std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor));
    if (auto why = kernels::needs_decode_variant(p))
      return Support::no(*why);
    if (auto why = kernels::fp8_reason(p))
      return Support::no(*why);
    if (p.causal && fa3::params_of(c).scheduler == fa3::kSchedStreamK)
      return Support::no("scheduler stream_k shares out the last wave of equal work tiles by K/V "
                         "tiles: non-causal only (causal tiles differ in length; dynamic "
                         "balances them)");
    if (!fa3::split_compiled(p.head_dim) && fa3::params_of(c).scheduler == fa3::kSchedStreamK)
      return Support::no("scheduler stream_k is compiled for head_dim 64 and 128 only (at 256 the "
                         "producer has no register left for a segment's start); use dynamic");
    if (p.dtype == DType::f32)
      return Support::no("fp32 inputs: WGMMA takes fp16 or bf16 here (use naive or fa1_kv_outer)");
    if (!fa3::head_dim_ok(p.head_dim))
      return Support::no("head_dim " + std::to_string(p.head_dim) +
                         ": compiled for 64, 128 and 256 only (one slice per head_dim: the K/V "
                         "tiles are 64-column TMA boxes and O is an m64 x head_dim accumulator)");
    const fa3::Params params = fa3::params_of(c);
    if (params.consumers == 3 && !fa3::wide_ok(p.head_dim))
      return Support::no("3 consumer warpgroups (block_m 192) get 160 registers each (64K / 512 "
                         "threads): compiled for head_dim 64 only (at 128, O + S + P alone are "
                         "160; at 256, O alone is 128)");
    // The same table the slices instantiate from (traits.hpp): at head_dim 256 block_n 64 only.
    if (!fa3::tile_compiled(p.head_dim, params.block_n, params.consumers == 3))
      return Support::no(
          "block_n " + std::to_string(params.block_n) + " is not compiled for head_dim " +
          std::to_string(p.head_dim) +
          (p.head_dim == 256
               ? ": head_dim 256 has block_n 64 only (O alone is 128 fp32 registers per consumer "
                 "thread, and at block_n 128 two stages of K and V alone are 262.1 KB of shared "
                 "memory, over an H100's 232.4 KB); use block_n 64 with stages 2"
               : ""));
    // Without a device, plan against an H100's 227 KB.
    const int64_t limit =
        dev.smem_per_block_optin > 0 ? dev.smem_per_block_optin : fa3::kSmemOptinHopper;
    const int64_t smem = fa3::smem_bytes(p.head_dim, params);
    if (smem > limit) {
      // Say what does fit: the deepest ring at this block_m x block_n, else a smaller tile.
      int fits = 0;
      for (int st = 2; st < params.stages; ++st) {
        fa3::Params q = params;
        q.stages = st;
        if (fa3::smem_bytes(p.head_dim, q) <= limit)
          fits = st;
      }
      return Support::no(
          "needs " + kernels::format_kb(double(smem)) +
          " shared memory per block; the device allows " + kernels::format_kb(double(limit)) +
          (fits ? " (stages " + std::to_string(fits) + (fits > 2 ? " or fewer" : "") +
                      " fits at block_m " + std::to_string(params.block_m) + ", block_n " +
                      std::to_string(params.block_n) + ")"
                : " (no ring depth fits at block_m " + std::to_string(params.block_m) +
                      ", block_n " + std::to_string(params.block_n) +
                      ": a smaller block_n or block_m)"));
    }
    if (p.heads_q > 65535 || p.batch > 65535)
      return Support::no("heads_q and batch must each be at most 65535 (CUDA grid y/z limit)");
    if (p.seqlen_q >= INT_MAX / 2 || p.seqlen_kv >= INT_MAX / 2)
      return Support::no(
          "sequence lengths must be below 2^30 (TMA coordinates and row indices are 32-bit)");
    if (auto why = kernels::memory_reason(p, 0.0, "inputs and outputs", dev))
      return Support::no(*why);
    return Support::yes();
  }

  double model_bytes(const AttentionProblem &p, const Config &c) const override {
    return fa3::traffic_bytes(p, fa3::params_of(c));
  }

  std::vector<KernelDesc> kernels(const AttentionProblem &p, const Config &c) const override {
    const fa3::Params params = fa3::params_of(c);
    if (fa3::config_problem(params) || !fa3::head_dim_ok(p.head_dim))
      return {};
    const fa3::KernelFn k = fa3::find_kernel(p.dtype, p.head_dim, params);
    if (!k)
      return {};
    return {KernelDesc{"fa3_pipelined", k(p, params.scheduler), 128 * (1 + params.consumers),
                       static_cast<size_t>(fa3::launch_smem_bytes(p.head_dim, params)),
                       fa3::num_q_tiles(p, params) * p.heads_q * p.batch}};
  }

  // The dynamic scheduler's claim counter and done count (zero on entry, reset by the last CTA);
  // stream_k's partial flags (each reset by its reader).
  size_t semaphore_bytes(const AttentionProblem &, const Config &c) const override {
    const fa3::Params q = fa3::params_of(c);
    if (q.scheduler == fa3::kSchedDynamic)
      return fa3::kDynamicSemaphoreBytes;
    return q.scheduler == fa3::kSchedStreamK ? fa3::split_semaphore_bytes(q.consumers) : 0;
  }
  // stream_k: the partial O, m and l of the tail's segments, one slot per CTA.
  size_t workspace_bytes(const AttentionProblem &p, const Config &c) const override {
    const fa3::Params q = fa3::params_of(c);
    return q.scheduler == fa3::kSchedStreamK && !p.causal
               ? static_cast<size_t>(fa3::split_workspace_bytes(p.head_dim, q.consumers))
               : 0;
  }

  void launch(const AttentionProblem &p, const Config &c, const LaunchArgs &args,
              cudaStream_t stream) const override {
    fa3::launch(p, fa3::params_of(c), args, stream);
  }

private:
  ConfigSpace space_ = fa3::make_space();
};

} // namespace

void register_fa3_pipelined(Registry &r) { r.add(std::make_unique<Fa3PipelinedVariant>()); }

} // namespace fb
