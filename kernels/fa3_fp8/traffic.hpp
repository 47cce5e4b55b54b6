// fa3_fp8's traffic model: the HBM bytes one call should move, for the report's bytes_model and model_check.
// Host arithmetic only: it moves no byte and changes no timing, so the tuning tables' source hash leaves this
// file out (harness/source_hashes.cmake) and a better model does not make a tuned entry stale.
#pragma once

#include "kernels/fa3_fp8/traits.hpp"

namespace fb::fa3fp8 {

// HBM bytes: Q, K and V once (e4m3), O once (bf16), LSE once. A CTA re-reads its head's K and V for every Q tile;
// the model counts those reads as L2 hits, as for the other variants' one-shot grids at these sizes.
inline double traffic_bytes(const AttentionProblem &p) { return min_bytes(p); }

} // namespace fb::fa3fp8
