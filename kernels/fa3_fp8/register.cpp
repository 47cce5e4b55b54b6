// fa3_fp8 as a catalog entry: support checks, traffic model and the launch. Host logic only; the kernel is built
// for sm_90a alone (CMakeLists.txt), and on any other device every point is skipped with "needs sm_90a".
#include "kernels/catalog.hpp"
#include "kernels/common/support.hpp"
#include "kernels/fa3_fp8/launch.hpp"
#include "kernels/fa3_fp8/traffic.hpp"
#include "kernels/fa3_fp8/traits.hpp"

#include <climits>
#include <memory>
#include <string>

namespace fb {
namespace {

class Fa3Fp8Variant : public Variant {
public:
  std::string name() const override { return "fa3_fp8"; }
  std::string description() const override {
    return "FP8 (e4m3) FlashAttention-3 style forward for Hopper (sm_90a) with per-block descales: "
           "TMA rings on "
           "mbarriers, e4m3 WGMMA for Q K^T and P V (P from registers), V transposed in shared "
           "memory by the "
           "producer warpgroup; O in bf16";
  }
  const ConfigSpace &space() const override { return space_; }

  Support supports(const AttentionProblem &p, const Config &c,
                   const DeviceInfo &dev) const override {
    if (auto why = space_.check(c))
      return Support::no(*why);
    if (p.dtype != DType::e4m3)
      return Support::no(std::string(to_string(p.dtype)) +
                         " inputs: fa3_fp8 takes e4m3 (use fa3_pipelined)");
    if (dev.present && dev.cc() != 90)
      return Support::no(
          "needs sm_90a (Hopper, compute capability 9.0: e4m3 wgmma, TMA, setmaxnreg); the device "
          "is " +
          std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor));
    if (auto why = kernels::needs_decode_variant(p))
      return Support::no(*why);
    const fa3fp8::Params prm = fa3fp8::params_of(c);
    if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
      return Support::no(
          "head_dim " + std::to_string(p.head_dim) +
          ": compiled for 64, 128 and 256 (an e4m3 row is one 64-byte TMA box or "
          "whole 128-byte ones, the swizzle spans); pad head_dim to one of those, or "
          "use fa3_pipelined with bf16 inputs");
    if (auto why = fa3fp8::tile_problem(int(p.head_dim), prm.block_n))
      return Support::no(*why);
    if (p.head_dim == 256 && prm.q_in_regs)
      return Support::no(
          "q_in_regs at head_dim 256: Q's 32 fragment registers do not fit beside O's "
          "128 (use q_in_regs off)");
    if (prm.overlap && !fa3fp8::overlap_compiled(prm.block_n, int(p.head_dim)))
      return Support::no("intra_wg_overlap at head_dim 256 and block_n 128 spills registers "
                         "(use intra_wg_overlap off, or block_n 64)");
    if (p.head_dim == 256 && prm.o_tma)
      return Support::no(
          "o_store tma at head_dim 256 would need 64 KB of staging (use o_store regs)");
    const int64_t limit =
        dev.smem_per_block_optin > 0 ? dev.smem_per_block_optin : fa3fp8::kSmemOptinHopper;
    const int64_t smem = fa3fp8::smem_bytes(prm, int(p.head_dim));
    if (smem > limit)
      return Support::no("needs " + kernels::format_kb(double(smem)) +
                         " shared memory per block; the device "
                         "allows " +
                         kernels::format_kb(double(limit)) + " (use fewer stages)");
    if (fa3fp8::num_work_items(p) > INT_MAX)
      return Support::no(
          "over 2^31 work items (Q tiles x heads x batch): the grid and the item index are 32-bit");
    if (p.heads_q * p.batch > INT_MAX || p.seqlen_q >= INT_MAX / 2 || p.seqlen_kv >= INT_MAX / 2)
      return Support::no(
          "heads_q x batch and the sequence lengths must fit 32-bit TMA coordinates");
    if (auto why = kernels::memory_reason(p, 0.0, "inputs and outputs", dev))
      return Support::no(*why);
    return Support::yes();
  }

  double model_bytes(const AttentionProblem &p, const Config &c) const override {
    return fa3fp8::traffic_bytes(p, fa3fp8::params_of(c));
  }

  std::vector<KernelDesc> kernels(const AttentionProblem &p, const Config &c) const override {
    return {KernelDesc{
        "fa3_fp8", fa3fp8::kernel_ptr(fa3fp8::params_of(c), int(p.head_dim)), fa3fp8::kThreads,
        static_cast<size_t>(fa3fp8::smem_bytes(fa3fp8::params_of(c), int(p.head_dim))),
        fa3fp8::num_work_items(p)}};
  }

  void launch(const AttentionProblem &p, const Config &c, const LaunchArgs &args,
              cudaStream_t stream) const override {
    fa3fp8::launch(p, fa3fp8::params_of(c), args, stream);
  }

private:
  ConfigSpace space_ = fa3fp8::make_space();
};

} // namespace

void register_fa3_fp8(Registry &r) { r.add(std::make_unique<Fa3Fp8Variant>()); }

} // namespace fb
