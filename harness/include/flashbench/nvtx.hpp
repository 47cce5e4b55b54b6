// NVTX ranges in the "flashbench" domain: one range per point, one per phase (verify, warmup, time, profile).
// `ncu --nvtx --nvtx-include "flashbench@<point name>/"` selects one point's launches.
#pragma once

#include <nvtx3/nvtx3.hpp>

namespace fb {

struct flashbench_domain {
  static constexpr char const *name{"flashbench"};
};

using ScopedRange = nvtx3::scoped_range_in<flashbench_domain>;

} // namespace fb
