// The causal visibility rule, shared by every variant so that they all agree with
// AttentionProblem::last_key(): masks are aligned bottom-right, query i sees key j iff j <= i +
// (seqlen_kv - seqlen_q).
#pragma once

#include <cstdint>

#include "kernels/common/host_device.hpp"

namespace fb::kernels {

// Number of keys query row i sees (keys 0 .. n-1); 0 when the row sees none (causal with seqlen_q >
// seqlen_kv).
FB_HOST_DEVICE int64_t visible_keys(int64_t i, int64_t seqlen_q, int64_t seqlen_kv, bool causal) {
  if (!causal)
    return seqlen_kv;
  const int64_t n = i + (seqlen_kv - seqlen_q) + 1;
  return n < 0 ? 0 : (n > seqlen_kv ? seqlen_kv : n);
}

} // namespace fb::kernels
