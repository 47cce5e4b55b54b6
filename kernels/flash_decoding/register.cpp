// The flash-decoding variant as a catalog entry: host logic only (support checks, the split plan,
// workspace, traffic model).
#include "kernels/catalog.hpp"
#include "kernels/common/support.hpp"
#include "kernels/flash_decoding/traffic.hpp"
#include "kernels/flash_decoding/traits.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <climits>
#include <memory>
#include <stdexcept>
#include <string>

namespace fb {
namespace {

// The split plan depends on the SM count and shared memory per SM, but workspace_bytes() and
// launch() get no DeviceInfo: read them from the current device (cheap attribute queries), or use
// the nominal H100's without one, so that the plan is the same in both calls.
fdec::DeviceFacts current_device_facts() {
  fdec::DeviceFacts f;
  int dev = 0, sms = 0, smem = 0, optin = 0;
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) ==
          cudaSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
      sms > 0) {
    f.sm_count = sms;
    f.smem_per_sm = smem;
    f.smem_per_block_optin = optin;
  } else {
    cudaGetLastError(); // no device: clear the error, keep the nominal facts
  }
  return f;
}

class FlashDecodingVariant : public Variant {
public:
  std::string name() const override { return "flash_decoding"; }
  std::string description() const override {
    return "flash-decoding: split-KV partials (fp32 O + LSE) and a log-sum-exp combine, GQA heads "
           "packed per K/V load, variable KV lengths and paged caches (mma.sync, a cp.async ring "
           "per warp)";
  }
  const ConfigSpace &space() const override { return space_; }

  Support supports(const AttentionProblem &p, const Config &c,
                   const DeviceInfo &dev) const override {
    if (auto why = space_.check(c))
      return Support::no(*why);
    if (auto why = kernels::fp8_reason(p))
      return Support::no(*why);
    if (p.dtype == DType::f32)
      return Support::no("fp32 inputs: the tensor-core kernel takes fp16 or bf16");
    if (!fdec::head_dim_ok(p.head_dim))
      return Support::no("head_dim " + std::to_string(p.head_dim) + ": needs 64, 128 or 256");
    const fdec::Params params = fdec::params_of(c);
    if (auto why = fdec::head_dim_problem(p.head_dim, params))
      return Support::no(*why);
    fdec::DeviceFacts facts;
    if (dev.sm_count > 0)
      facts = fdec::DeviceFacts{dev.sm_count, dev.smem_per_sm, dev.smem_per_block_optin};
    if (fdec::fitting_stages(p, params, facts) < 2) {
      fdec::Params two = params;
      two.stages = 2;
      return Support::no("needs " + kernels::format_kb(double(fdec::smem_bytes(p.head_dim, two))) +
                         " shared memory per block for two stages; the device allows " +
                         kernels::format_kb(double(facts.smem_per_block_optin)));
    }
    if (p.batch > 65535 || p.heads_kv * fdec::row_blocks(p) > 65535)
      return Support::no("batch and heads_kv * row blocks must each be at most 65535 (grid limit)");
    if (p.seqlen_kv > INT_MAX / 2 || p.heads_q * p.seqlen_q > INT_MAX / 2)
      return Support::no("seqlen_kv and heads_q * seqlen_q must stay below 2^30 (32-bit indices)");
    const fdec::SplitPlan plan = fdec::split_plan(p, params, facts);
    if (auto why = kernels::memory_reason(p, double(fdec::workspace_layout(p, plan).total),
                                          "the split partials", dev))
      return Support::no(*why);
    return Support::yes();
  }

  size_t workspace_bytes(const AttentionProblem &p, const Config &c) const override {
    return fdec::workspace_layout(p, plan(p, c)).total;
  }

  size_t semaphore_bytes(const AttentionProblem &p, const Config &c) const override {
    return fdec::semaphore_bytes(p, fdec::params_of(c), plan(p, c));
  }

  double model_bytes(const AttentionProblem &p, const Config &c) const override {
    return fdec::traffic_bytes(p, fdec::params_of(c), plan(p, c));
  }

  std::vector<KernelDesc> kernels(const AttentionProblem &p, const Config &c) const override {
    if (!fdec::head_dim_ok(p.head_dim) || (p.dtype != DType::bf16 && p.dtype != DType::f16))
      return {};
    return fdec::kernel_descs(p, fdec::params_of(c), plan(p, c));
  }

  void launch(const AttentionProblem &p, const Config &c, const LaunchArgs &args,
              cudaStream_t stream) const override {
    if (!fdec::head_dim_ok(p.head_dim) || (p.dtype != DType::bf16 && p.dtype != DType::f16))
      throw std::invalid_argument("flash_decoding: unsupported problem " + key(p));
    if (p.paged() && args.page_table == nullptr)
      throw std::invalid_argument("flash_decoding: paged problem without a page table");
    if (!p.kv_lens.empty() && args.cache_seqlens == nullptr)
      throw std::invalid_argument("flash_decoding: kv_lens without cache_seqlens");
    const fdec::Params params = fdec::params_of(c);
    if (auto why = fdec::head_dim_problem(p.head_dim, params))
      throw std::invalid_argument("flash_decoding: " + *why);
    const fdec::SplitPlan sp = plan(p, c);
    if (args.workspace_bytes < fdec::workspace_layout(p, sp).total)
      throw std::invalid_argument("flash_decoding: workspace smaller than workspace_bytes()");
    if (args.semaphore_bytes < fdec::semaphore_bytes(p, params, sp))
      throw std::invalid_argument("flash_decoding: semaphores smaller than semaphore_bytes()");
    if (sp.stages < 2)
      throw std::invalid_argument("flash_decoding: the K/V tiles do not fit shared memory");
    if (p.dtype == DType::bf16)
      fdec::launch_bf16(p, params, sp, args, stream);
    else
      fdec::launch_fp16(p, params, sp, args, stream);
  }

private:
  fdec::SplitPlan plan(const AttentionProblem &p, const Config &c) const {
    return fdec::split_plan(p, fdec::params_of(c), current_device_facts());
  }

  ConfigSpace space_ = fdec::make_space();
};

} // namespace

void register_flash_decoding(Registry &r) { r.add(std::make_unique<FlashDecodingVariant>()); }

} // namespace fb
