// The FA2 backward (column-block parallel, tensor cores) as a catalog entry: support checks, workspace and
// semaphores, traffic model, and the dispatch from a run-time config to the compiled instantiation
// (instances.hpp). Host logic only.
#include "kernels/catalog.hpp"
#include "kernels/common/support.hpp"
#include "kernels/fa2_bwd/instances.hpp"
#include "kernels/fa2_bwd/traffic.hpp"
#include "kernels/fa2_bwd/traits.hpp"

#include <climits>
#include <memory>
#include <stdexcept>
#include <string>

namespace fb {
namespace fa2_bwd {
namespace {

Instance find_instance(DType t, int64_t head_dim, const Params &c) {
#define FB_FA2_BWD_CASE(T, DT, D)                                                                  \
  if (t == DType::DT && head_dim == D)                                                             \
    return pick_##T##_d##D(c);
  FB_FA2_BWD_CASE(bf16, bf16, 64)
  FB_FA2_BWD_CASE(bf16, bf16, 128)
  FB_FA2_BWD_CASE(bf16, bf16, 256)
  FB_FA2_BWD_CASE(fp16, f16, 64)
  FB_FA2_BWD_CASE(fp16, f16, 128)
  FB_FA2_BWD_CASE(fp16, f16, 256)
#undef FB_FA2_BWD_CASE
  return {};
}

std::string tile_name(const Params &c) {
  return std::to_string(c.block_m) + "x" + std::to_string(c.block_n) + ", " +
         std::to_string(c.warps) + " warps, warp_layout m" + std::to_string(c.warp_m) +
         (c.frag_prefetch ? ", frag_prefetch on" : "") +
         (dq_row_warps(c) != c.warp_m ? ", dq_layout m" + std::to_string(dq_row_warps(c))
                                      : std::string()) +
         (mode_of(c.deterministic, c.order) == kModePlain
              ? std::string()
              : std::string(c.deterministic                      ? ", deterministic on"
                            : c.order == kernels::bwd::kOrderLpt ? ", order lpt"
                                                                 : ", order sections") +
                    " (compiled for the default tiles)");
}

} // namespace

void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream) {
  if (auto why = config_problem(c))
    throw std::invalid_argument("fa2_bwd: " + *why);
  const Instance in = find_instance(p.dtype, p.head_dim, c);
  if (!in.launch)
    throw std::invalid_argument("fa2_bwd: no compiled kernel for " +
                                std::string(to_string(p.dtype)) + " head_dim " +
                                std::to_string(p.head_dim) + " with tile " + tile_name(c));
  in.launch(p, c, args, stream);
}

std::vector<KernelDesc> kernels(const AttentionProblem &p, const Params &c) {
  const Instance in = find_instance(p.dtype, p.head_dim, c);
  return in.kernels ? in.kernels(p, c) : std::vector<KernelDesc>{};
}

} // namespace fa2_bwd

namespace {

class Fa2BwdVariant : public Variant {
public:
  std::string name() const override { return "fa2_bwd"; }
  std::string description() const override {
    return "FlashAttention-2 backward: one CTA per K/V column block with dK/dV in registers, "
           "dQ reduced in fp32 by red.global.add (optionally in a fixed order), mma.sync tensor "
           "cores, cp.async Q/dO pipeline";
  }
  Pass pass() const override { return Pass::bwd; }
  const ConfigSpace &space() const override { return space_; }

  Support supports(const AttentionProblem &p, const Config &c,
                   const DeviceInfo &dev) const override {
    if (auto why = space_.check(c))
      return Support::no(*why);
    if (auto why = kernels::backward_problem_reason(p, name()))
      return Support::no(*why);
    if (!fa2_bwd::head_dim_ok(p.head_dim))
      return Support::no("head_dim " + std::to_string(p.head_dim) +
                         ": compiled for 64, 128 and 256 only");
    if (dev.present && dev.cc() < 80)
      return Support::no(
          "needs compute capability 8.0 or newer (bf16 mma.sync, cp.async); the device is " +
          std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor));
    const fa2_bwd::Params params = fa2_bwd::params_of(c);
    if (auto why = fa2_bwd::head_dim_problem(p.head_dim, params))
      return Support::no("head_dim " + std::to_string(p.head_dim) + ": " + *why);
    if (!fa2_bwd::tile_compiled(static_cast<int>(p.head_dim), params.block_m, params.block_n,
                                params.warps, params.warp_m, params.frag_prefetch != 0,
                                fa2_bwd::dq_row_warps(params),
                                fa2_bwd::mode_of(params.deterministic, params.order)))
      return Support::no("head_dim " + std::to_string(p.head_dim) + " with tile " +
                         fa2_bwd::tile_name(params) +
                         " is not compiled (it spills registers, or is not among the "
                         "instantiated tiles: kernels/fa2_bwd/traits.hpp, tile_compiled)");
    if (params.rotated)
      if (auto why = fa2_bwd::rotated_problem(p, params, dev))
        return Support::no(*why);
    if (auto why = fa2_bwd::grid_problem(p, params, dev))
      return Support::no(*why);
    const int64_t smem = fa2_bwd::smem_bytes(p.head_dim, params);
    if (dev.smem_per_block_optin > 0 && smem > dev.smem_per_block_optin)
      return Support::no("needs " + kernels::format_kb(double(smem)) +
                         " shared memory per block; the device allows " +
                         kernels::format_kb(double(dev.smem_per_block_optin)) +
                         " (use stages 1 or a smaller tile)");
    if (auto why = kernels::backward_memory_reason(p, double(workspace_bytes(p, c)),
                                                   double(semaphore_bytes(p, c)), dev))
      return Support::no(*why);
    return Support::yes();
  }

  size_t workspace_bytes(const AttentionProblem &p, const Config &c) const override {
    return static_cast<size_t>(fa2_bwd::workspace_layout(p, fa2_bwd::params_of(c)).total);
  }
  size_t semaphore_bytes(const AttentionProblem &p, const Config &c) const override {
    return static_cast<size_t>(4 * fa2_bwd::semaphore_count(p, fa2_bwd::params_of(c)));
  }

  // The no-reuse bound (traffic.hpp).
  double model_bytes(const AttentionProblem &p, const Config &c) const override {
    return fa2_bwd::traffic_bytes(p, fa2_bwd::params_of(c));
  }

  std::vector<KernelDesc> kernels(const AttentionProblem &p, const Config &c) const override {
    return fa2_bwd::kernels(p, fa2_bwd::params_of(c));
  }

  void launch(const AttentionProblem &p, const Config &c, const LaunchArgs &args,
              cudaStream_t stream) const override {
    fa2_bwd::launch(p, fa2_bwd::params_of(c), args, stream);
  }

private:
  ConfigSpace space_ = fa2_bwd::make_space();
};

} // namespace

void register_fa2_bwd(Registry &r) { r.add(std::make_unique<Fa2BwdVariant>()); }

} // namespace fb
