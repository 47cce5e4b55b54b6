// The FA1 (KV-outer) variant as a catalog entry: host logic only (support checks, workspace,
// traffic model).
#include "kernels/catalog.hpp"
#include "kernels/common/support.hpp"
#include "kernels/fa1_kv_outer/traffic.hpp"
#include "kernels/fa1_kv_outer/traits.hpp"

#include <climits>
#include <memory>
#include <string>

namespace fb {
namespace {

class Fa1KvOuterVariant : public Variant {
public:
  std::string name() const override { return "fa1_kv_outer"; }
  std::string description() const override {
    return "FlashAttention-1 (KV-outer): S and P stay on chip, O/l/m round-trip through HBM at "
           "every K/V step "
           "(fp32 SIMT)";
  }
  const ConfigSpace &space() const override { return space_; }

  Support supports(const AttentionProblem &p, const Config &c,
                   const DeviceInfo &dev) const override {
    if (auto why = space_.check(c))
      return Support::no(*why);
    if (auto why = kernels::needs_decode_variant(p))
      return Support::no(*why);
    if (auto why = kernels::fp8_reason(p))
      return Support::no(*why);
    if (!fa1::head_dim_ok(p.head_dim))
      return Support::no("head_dim " + std::to_string(p.head_dim) +
                         ": needs a multiple of 8 up to " + std::to_string(fa1::kMaxHeadDim));
    const fa1::Params params = fa1::params_of(c);
    const int64_t smem = fa1::smem_bytes(p.head_dim, params);
    if (dev.smem_per_block_optin > 0 && smem > dev.smem_per_block_optin)
      return Support::no("needs " + kernels::format_kb(double(smem)) +
                         " shared memory per block; the device allows " +
                         kernels::format_kb(double(dev.smem_per_block_optin)));
    // Grid: x = Q chunks, y = q heads, z = batch.
    if (p.heads_q > 65535 || p.batch > 65535)
      return Support::no("heads_q and batch must each be at most 65535 (CUDA grid y/z limit)");
    if (fa1::num_q_tiles(p, params) > INT_MAX)
      return Support::no("seqlen_q " + std::to_string(p.seqlen_q) +
                         " gives more than 2^31 Q tiles");
    if (auto why = kernels::memory_reason(p, double(fa1::workspace_layout(p).total),
                                          "the fp32 O/l/m state", dev))
      return Support::no(*why);
    return Support::yes();
  }

  size_t workspace_bytes(const AttentionProblem &p, const Config &) const override {
    return fa1::workspace_layout(p).total;
  }

  // Without a device: every per-step re-read counted as HBM traffic (the upper bound).
  double model_bytes(const AttentionProblem &p, const Config &c) const override {
    return fa1::traffic_bytes(p, fa1::params_of(c));
  }
  double model_bytes(const AttentionProblem &p, const Config &c,
                     const DeviceInfo &dev) const override {
    const fa1::Params params = fa1::params_of(c);
    return fa1::traffic_bytes(p, params, fa1::l2_reuse(p, params, dev));
  }

  std::vector<KernelDesc> kernels(const AttentionProblem &p, const Config &c) const override {
    return fa1::kernels(p, fa1::params_of(c));
  }

  void launch(const AttentionProblem &p, const Config &c, const LaunchArgs &args,
              cudaStream_t stream) const override {
    fa1::launch(p, fa1::params_of(c), args, stream);
  }

private:
  ConfigSpace space_ = fa1::make_space();
};

} // namespace

void register_fa1_kv_outer(Registry &r) { r.add(std::make_unique<Fa1KvOuterVariant>()); }

} // namespace fb
