// Registration functions of the catalog's variants, one per folder; catalog.cpp calls them in
// order.
#pragma once

#include "flashbench/variant.hpp"

namespace fb {

void register_naive(Registry &r);
void register_fa1_kv_outer(Registry &r);
void register_fa2_q_outer(Registry &r);

} // namespace fb
