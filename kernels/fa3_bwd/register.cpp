// The FA3-style backward (Hopper sm_90a: TMA, WGMMA, warp specialization) as a variant: support checks, workspace
// and semaphores, traffic model, and the dispatch from a run-time config to the compiled instantiation
// (instances.hpp). Host logic only.
#include "kernels/catalog.hpp"
#include "kernels/common/support.hpp"
#include "kernels/fa3_bwd/instances.hpp"
#include "kernels/fa3_bwd/traffic.hpp"
#include "kernels/fa3_bwd/traits.hpp"

#include <climits>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace fb {
namespace fa3_bwd {
namespace {

Instance find_instance(DType t, int64_t head_dim, const Params &c) {
#define FB_FA3_BWD_CASE(T, DT, D)                                                                  \
  if (t == DType::DT && head_dim == D)                                                             \
    return pick_##T##_d##D(c);
  FB_FA3_BWD_CASE(bf16, bf16, 64)
  FB_FA3_BWD_CASE(bf16, bf16, 128)
  FB_FA3_BWD_CASE(fp16, f16, 64)
  FB_FA3_BWD_CASE(fp16, f16, 128)
#undef FB_FA3_BWD_CASE
  return {};
}

// TMA reads Q, K, V, dO and writes dK, dV through tensor maps whose global address must be 16-byte aligned; the
// preprocess and convert kernels read O and write dQ in 16-byte vectors. The harness's buffers are cudaMalloc'd
// (256-byte aligned); a C API caller's may be views at any offset, which supports() cannot see.
void check_aligned(const LaunchArgs &args) {
  const struct {
    const char *name;
    const void *ptr;
  } tensors[] = {{"q", args.q},       {"k", args.k},   {"v", args.v},   {"o", args.o},
                 {"dout", args.dout}, {"dq", args.dq}, {"dk", args.dk}, {"dv", args.dv}};
  for (const auto &t : tensors)
    if (reinterpret_cast<uintptr_t>(t.ptr) % 16)
      throw std::invalid_argument(std::string("fa3_bwd: ") + t.name +
                                  " is not 16-byte aligned (TMA tensor maps and the 16-byte row "
                                  "loads need it)");
}

} // namespace

void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream) {
  if (auto why = config_problem(c))
    throw std::invalid_argument("fa3_bwd: " + *why);
  const Instance in = find_instance(p.dtype, p.head_dim, c);
  if (!in.launch)
    throw std::invalid_argument(
        "fa3_bwd: no compiled kernel for " + std::string(to_string(p.dtype)) + " head_dim " +
        std::to_string(p.head_dim) + " block_m " + std::to_string(c.block_m));
  check_aligned(args);
  in.launch(p, c, args, stream);
}

std::vector<KernelDesc> kernels(const AttentionProblem &p, const Params &c) {
  if (config_problem(c))
    return {};
  const Instance in = find_instance(p.dtype, p.head_dim, c);
  return in.kernels ? in.kernels(p, c) : std::vector<KernelDesc>{};
}

} // namespace fa3_bwd

namespace {

class Fa3BwdVariant : public Variant {
public:
  std::string name() const override { return "fa3_bwd"; }
  std::string description() const override {
    return "FlashAttention-3 style backward (Hopper sm_90a): one CTA per 128-key column block, "
           "TMA Q/dO ring on mbarriers, WGMMA with P^T and dS^T from registers, producer/consumer "
           "warpgroups with setmaxnreg, dQ reduced in fp32 by bulk reduce-adds or red.global.add "
           "(optionally in a fixed order)";
  }
  Pass pass() const override { return Pass::bwd; }
  const ConfigSpace &space() const override { return space_; }

  Support supports(const AttentionProblem &p, const Config &c,
                   const DeviceInfo &dev) const override {
    if (auto why = space_.check(c))
      return Support::no(*why);
    if (auto why = kernels::backward_problem_reason(p, name()))
      return Support::no(*why);
    if (dev.present && dev.cc() != 90)
      return Support::no(
          "needs sm_90a (Hopper, compute capability 9.0: wgmma, setmaxnreg, TMA); the device is " +
          std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor));
    if (!fa3_bwd::head_dim_ok(p.head_dim))
      return Support::no(
          "head_dim " + std::to_string(p.head_dim) + ": compiled for 64 and 128 only" +
          (p.head_dim == 256 ? " (each consumer warpgroup holds dK and dV of its 64 keys in "
                               "registers: 2 x 64 x 256 fp32 over 128 threads is 256 registers a "
                               "thread, over the 240 a consumer gets; use fa2_bwd)"
                             : ""));
    const fa3_bwd::Params params = fa3_bwd::params_of(c);
    if (!fa3_bwd::block_m_compiled(p.head_dim, params.block_m))
      return Support::no("block_m " + std::to_string(params.block_m) +
                         " is not compiled for head_dim " + std::to_string(p.head_dim) +
                         " (head_dim 64: block_m 64 or 128; head_dim 128: 64 or 80)");
    const int64_t limit =
        dev.smem_per_block_optin > 0 ? dev.smem_per_block_optin : kernels::kSmemOptinHopper;
    const int64_t smem = fa3_bwd::smem_bytes(p.head_dim, params);
    if (smem > limit) {
      fa3_bwd::Params one = params;
      one.stages = 1;
      const bool fits = params.stages > 1 && fa3_bwd::smem_bytes(p.head_dim, one) <= limit;
      return Support::no("needs " + kernels::format_kb(double(smem)) +
                         " shared memory per block; the device allows " +
                         kernels::format_kb(double(limit)) + (fits ? " (use stages 1)" : ""));
    }
    // TMA: row strides (and every other global stride) a multiple of 16 bytes. Always so for a dense bshd problem
    // at head_dim 64 or 128; said here so that a layout that breaks it is refused rather than failing in
    // cuTensorMapEncodeTiled.
    const int64_t e = dtype_bytes(p.dtype);
    for (const Strides &s : {p.q_strides(), p.kv_strides()})
      if ((s.seq * e) % 16 || (s.head * e) % 16 || (s.batch * e) % 16)
        return Support::no("TMA needs every Q/K/V/O/dO stride to be a multiple of 16 bytes; this "
                           "layout's are not");
    // The launch has at most kMaxSplitTiles x (kMaxPieces - 1) CTAs more than the column blocks (tail_split).
    const int64_t grid =
        fa3_bwd::grid_tiles(p) + int64_t(fa3_bwd::kMaxSplitTiles) * (fa3_bwd::kMaxPieces - 1);
    if (grid > INT_MAX)
      return Support::no("the main kernel's 1-D grid (column blocks x kv heads x batch = " +
                         std::to_string(fa3_bwd::grid_tiles(p)) +
                         " CTAs, plus the split tail's pieces) must be at most 2^31 - 1");
    if (auto why = kernels::backward_memory_reason(p, double(workspace_bytes(p, c)),
                                                   double(semaphore_bytes(p, c)), dev))
      return Support::no(*why);
    return Support::yes();
  }

  size_t workspace_bytes(const AttentionProblem &p, const Config &c) const override {
    return static_cast<size_t>(fa3_bwd::workspace_layout(p, fa3_bwd::params_of(c)).total);
  }
  size_t semaphore_bytes(const AttentionProblem &p, const Config &c) const override {
    return static_cast<size_t>(4 * fa3_bwd::semaphore_count(p, fa3_bwd::params_of(c)));
  }

  // The no-reuse bound (traffic.hpp).
  double model_bytes(const AttentionProblem &p, const Config &c) const override {
    return fa3_bwd::traffic_bytes(p, fa3_bwd::params_of(c));
  }

  std::vector<KernelDesc> kernels(const AttentionProblem &p, const Config &c) const override {
    return fa3_bwd::kernels(p, fa3_bwd::params_of(c));
  }

  void launch(const AttentionProblem &p, const Config &c, const LaunchArgs &args,
              cudaStream_t stream) const override {
    fa3_bwd::launch(p, fa3_bwd::params_of(c), args, stream);
  }

private:
  ConfigSpace space_ = fa3_bwd::make_space();
};

} // namespace

void register_fa3_bwd(Registry &r) { r.add(std::make_unique<Fa3BwdVariant>()); }

} // namespace fb
