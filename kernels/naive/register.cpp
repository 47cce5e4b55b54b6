// The naive variant as a catalog entry: host logic only (support checks, workspace, traffic model).
#include "kernels/catalog.hpp"
#include "kernels/common/support.hpp"
#include "kernels/naive/traits.hpp"

#include <climits>
#include <memory>
#include <string>

namespace fb {
namespace {

class NaiveVariant : public Variant {
public:
  std::string name() const override { return "naive"; }
  std::string description() const override {
    return "unfused baseline: S = scale*Q*K^T (cuBLAS, fp32) and P = softmax(S) round-trip through "
           "HBM, "
           "then O = P*V (cuBLAS)";
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
    // cuBLAS's 32-bit interface: dimensions, leading dimensions and the batch count are ints.
    const int64_t slices = p.batch * p.heads_q;
    if (p.seqlen_q > INT_MAX || p.seqlen_kv > INT_MAX || p.head_dim > INT_MAX || slices > INT_MAX ||
        p.q_strides().seq > INT_MAX || p.kv_strides().seq > INT_MAX)
      return Support::no("a dimension exceeds cuBLAS's 32-bit limit (2147483647)");
    if (auto why = kernels::memory_reason(p, static_cast<double>(naive::workspace_layout(p).total),
                                          "S and P", dev))
      return Support::no(*why);
    return Support::yes();
  }

  size_t workspace_bytes(const AttentionProblem &p, const Config &) const override {
    return naive::workspace_layout(p).total;
  }

  // Each kernel reads its inputs once and writes its outputs once; what the N² terms make of it:
  double model_bytes(const AttentionProblem &p, const Config &) const override {
    const double e = dtype_bytes(p.dtype);
    const double slices = static_cast<double>(p.batch * p.heads_q);
    const double scores =
        slices * static_cast<double>(p.seqlen_q) * static_cast<double>(p.seqlen_kv);
    const double visible = slices * static_cast<double>(unmasked_pairs(p));
    // Q·Kᵀ: Q once; K once per KV head (the query heads of a GQA group run side by side, so the K
    // slice they share is served from L2 after the first read).
    const double read_qk = e * static_cast<double>(p.q_elems() + p.kv_elems());
    const double write_s =
        4.0 * scores; // the GEMM writes all of S in fp32, masked entries included
    const double read_s = 4.0 * visible; // the softmax reads only each row's visible prefix (its
                                         // second pass over the row hits L2)
    const double write_p =
        e * scores; // P in full, zeros past the mask, because P·V reads all of it
    const double read_pv =
        e * scores + e * static_cast<double>(p.kv_elems()); // P, and V once per KV head
    const double write_o = e * static_cast<double>(p.q_elems());
    const double write_lse = 4.0 * static_cast<double>(p.lse_elems());
    // The GEMMs' pointer arrays (6 pointers per slice) are too small to count.
    return read_qk + write_s + read_s + write_p + read_pv + write_o + write_lse;
  }

  std::vector<KernelDesc> kernels(const AttentionProblem &p, const Config &c) const override {
    return naive::kernels(p, static_cast<int>(c.get_or("softmax_threads", 256)));
  }

  void launch(const AttentionProblem &p, const Config &c, const LaunchArgs &args,
              cudaStream_t stream) const override {
    naive::launch(p, static_cast<int>(c.get_or("softmax_threads", 256)), args, stream);
  }

private:
  ConfigSpace space_ = naive::make_space();
};

} // namespace

void register_naive(Registry &r) { r.add(std::make_unique<NaiveVariant>()); }

} // namespace fb
