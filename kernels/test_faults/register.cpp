// test_faults: a variant that exists to break, for testing the sweep engine's fault isolation. fault=none computes
// attention correctly (FA1's default kernel), so it verifies and times like any point; the other configs make an
// illegal access, trap, or spin forever. Registered only when FLASHBENCH_TEST_VARIANTS=1, so users never see it.
#include "kernels/catalog.hpp"
#include "kernels/fa1_kv_outer/traits.hpp"
#include "kernels/test_faults/test_faults.hpp"

#include <memory>
#include <string>

namespace fb {
namespace {

class TestFaultsVariant : public Variant {
public:
  std::string name() const override { return "test_faults"; }
  std::string description() const override {
    return "TEST ONLY: fault=none is FA1's default kernel; illegal_access, trap and spin fail on "
           "purpose";
  }
  const ConfigSpace &space() const override { return space_; }

  Support supports(const AttentionProblem &p, const Config &c,
                   const DeviceInfo &dev) const override {
    if (auto why = space_.check(c))
      return Support::no(*why);
    return catalog().get("fa1_kv_outer").supports(p, fa1_space_.default_config(), dev);
  }
  size_t workspace_bytes(const AttentionProblem &p, const Config &) const override {
    return fa1::workspace_layout(p).total;
  }
  double model_bytes(const AttentionProblem &p, const Config &) const override {
    return min_bytes(p);
  }

  void launch(const AttentionProblem &p, const Config &c, const LaunchArgs &args,
              cudaStream_t stream) const override {
    const auto f = static_cast<test_faults::Fault>(c.get_or("fault", 0));
    if (f == test_faults::Fault::none)
      fa1::launch(p, fa1::Params{}, args, stream);
    else
      test_faults::launch_fault(f, stream);
  }

private:
  ConfigSpace space_{{Axis{"fault",
                           {0, 1, 2, 3},
                           {"none", "illegal_access", "trap", "spin"},
                           "what the kernel does wrong"}},
                     Config({{"fault", 0}})};
  ConfigSpace fa1_space_ = fa1::make_space();
};

} // namespace

void register_test_faults(Registry &r) { r.add(std::make_unique<TestFaultsVariant>()); }

} // namespace fb
