// The one list of variants. Explicit calls rather than static registrars, so that the order is
// fixed and a static library cannot drop a variant at link time.
#include "kernels/catalog.hpp"

#include "flashbench/options.hpp"
#include "flashbench/traffic.hpp"

namespace fb {

void register_catalog(Registry &r) {
  register_naive(r);
  register_fa1_kv_outer(r);
  register_fa2_q_outer(r);
  register_fa2_bwd(r);
  register_fa3_bwd(r);
  register_flash_decoding(r);
  register_fa3_pipelined(r);
  register_fa3_fp8(r);
  // Variants that fail on purpose, for the sweep engine's fault-isolation tests; never shown to users.
  if (env_options().test_variants)
    register_test_faults(r);
}

const Registry &catalog() {
  static const Registry registry = [] {
    Registry r;
    register_catalog(r);
    install_traffic_models(&catalog_traffic_models);
    return r;
  }();
  return registry;
}

} // namespace fb
