// Registration functions of the catalog's variants, one per folder; catalog.cpp calls them in
// order.
#pragma once

#include "flashbench/traffic.hpp"
#include "flashbench/variant.hpp"

#include <optional>

namespace fb {

void register_naive(Registry &r);
void register_fa1_kv_outer(Registry &r);
void register_fa2_q_outer(Registry &r);
void register_fa2_bwd(Registry &r); // backward (pass: bwd)
void register_flash_decoding(Registry &r);
void register_fa3_pipelined(Registry &r); // sm_90a kernels; other devices: skipped "needs sm_90a"
void register_fa3_fp8(Registry &r);       // e4m3 inputs, sm_90a
void register_test_faults(Registry &r);   // only with FLASHBENCH_TEST_VARIANTS=1
void register_fa3_bwd(Registry &r);       // backward, sm_90a

// The traffic models of the catalog's variants (each variant's traffic.hpp; kernels/traffic.cpp), nullopt for
// others; catalog() installs them for flashbench/traffic.hpp's traffic_model.
std::optional<TrafficModel> catalog_traffic_models(const Variant &v, const AttentionProblem &p,
                                                   const Config &c, const DeviceInfo &dev);

} // namespace fb
