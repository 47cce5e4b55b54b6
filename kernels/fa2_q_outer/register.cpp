// The FA2 (Q-outer, tensor cores) variant as a catalog entry: support checks, traffic model, and the dispatch from
// a run-time config to the compiled instantiation (instances.hpp). Host logic only.
#include "kernels/catalog.hpp"
#include "kernels/common/support.hpp"
#include "kernels/fa2_q_outer/instances.hpp"
#include "kernels/fa2_q_outer/traffic.hpp"
#include "kernels/fa2_q_outer/traits.hpp"

#include <climits>
#include <memory>
#include <stdexcept>
#include <string>

namespace fb {
namespace fa2 {
namespace {

LaunchFn find_instance(DType t, int64_t head_dim, const Params &c) {
  const bool sq = split_q(c);
#define FB_FA2_CASE(T, DT, D)                                                                      \
  if (t == DType::DT && head_dim == D)                                                             \
    return sq ? pick_##T##_d##D##_split_q(c) : pick_##T##_d##D##_split_k(c);
  FB_FA2_CASE(bf16, bf16, 64)
  FB_FA2_CASE(bf16, bf16, 128)
  FB_FA2_CASE(bf16, bf16, 256)
  FB_FA2_CASE(fp16, f16, 64)
  FB_FA2_CASE(fp16, f16, 128)
  FB_FA2_CASE(fp16, f16, 256)
#undef FB_FA2_CASE
  return nullptr;
}

} // namespace

void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream) {
  if (auto why = config_problem(c))
    throw std::invalid_argument("fa2_q_outer: " + *why);
  const LaunchFn fn = find_instance(p.dtype, p.head_dim, c);
  if (!fn)
    throw std::invalid_argument("fa2_q_outer: no compiled kernel for " +
                                std::string(to_string(p.dtype)) + " head_dim " +
                                std::to_string(p.head_dim) + " with this tile shape");
  fn(p, c, args, stream);
}

} // namespace fa2

namespace {

class Fa2QOuterVariant : public Variant {
public:
  std::string name() const override { return "fa2_q_outer"; }
  std::string description() const override {
    return "FlashAttention-2 (Q-outer): one CTA per Q tile, O/l/m in registers, mma.sync tensor "
           "cores, cp.async "
           "K/V pipeline; warp layout split_q (FA2) or split_k (FA1)";
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
    if (p.dtype == DType::f32)
      return Support::no(
          "fp32 inputs: the tensor-core kernel takes fp16 or bf16 (use naive or fa1_kv_outer)");
    if (!fa2::head_dim_ok(p.head_dim))
      return Support::no("head_dim " + std::to_string(p.head_dim) +
                         ": compiled for 64, 128 and 256 only");
    if (dev.present && dev.cc() < 80)
      return Support::no(
          "needs compute capability 8.0 or newer (bf16 mma.sync, cp.async); the device is " +
          std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor));
    const fa2::Params params = fa2::params_of(c);
    const int d = static_cast<int>(p.head_dim);
    if (!fa2::tile_instantiated(d, params.block_m, params.block_n, params.warps,
                                fa2::split_q(params)))
      return Support::no(
          "head_dim " + std::to_string(d) + " with this tile needs about " +
          std::to_string(fa2::register_estimate(d, params.block_m, params.block_n, params.warps,
                                                fa2::split_q(params))) +
          " registers per thread (limit " + std::to_string(fa2::kRegisterBudget) +
          "): not compiled, it would spill");
    if (dev.present && dev.cc() < 90 &&
        fa2::sm90_only(d, params.block_m, params.block_n, params.warps, fa2::split_q(params)))
      return Support::no(
          "head_dim " + std::to_string(d) +
          " with this tile spills registers on compute capability 8.x: compiled for 9.0 only");
    const int64_t smem = fa2::smem_bytes(p.head_dim, params);
    if (dev.smem_per_block_optin > 0 && smem > dev.smem_per_block_optin)
      return Support::no("needs " + kernels::format_kb(double(smem)) +
                         " shared memory per block; the device allows " +
                         kernels::format_kb(double(dev.smem_per_block_optin)));
    if (p.heads_q > 65535 || p.batch > 65535)
      return Support::no("heads_q and batch must each be at most 65535 (CUDA grid y/z limit)");
    if (fa2::num_q_tiles(p, params) > INT_MAX)
      return Support::no("seqlen_q " + std::to_string(p.seqlen_q) +
                         " gives more than 2^31 Q tiles");
    if (auto why = kernels::memory_reason(p, 0.0, "inputs and outputs", dev))
      return Support::no(*why);
    return Support::yes();
  }

  double model_bytes(const AttentionProblem &p, const Config &c) const override {
    return fa2::traffic_bytes(p, fa2::params_of(c));
  }

  void launch(const AttentionProblem &p, const Config &c, const LaunchArgs &args,
              cudaStream_t stream) const override {
    fa2::launch(p, fa2::params_of(c), args, stream);
  }

private:
  ConfigSpace space_ = fa2::make_space();
};

} // namespace

void register_fa2_q_outer(Registry &r) { r.add(std::make_unique<Fa2QOuterVariant>()); }

} // namespace fb
