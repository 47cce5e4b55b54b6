// Division by a divisor fixed for a launch, as a multiply-high, an add and a shift (Granlund and
// Montgomery, "Division by invariant integers using multiplication", 1994). A plain `/` by a
// run-time int is ~20 instructions on the GPU, three of them (I2F, MUFU.RCP, F2I) on the pipe that
// also runs the softmax's exp2s; in the FA3 producer warp those queued behind the consumers' exp2
// stream and its tile decode took ~1.4 us per work tile (d128 N512).
#pragma once

#include <cstdint>

#include "kernels/common/host_device.hpp"

namespace fb::kernels {

struct FastDiv {
  uint32_t d = 1, mul = 1, shift = 0;
  FastDiv() = default;
  // d >= 1 and < 2^31 (host only: the constants go into kernel arguments).
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t(1) << shift) < d)
      ++shift; // ceil(log2 d)
    mul = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  // n / d for 0 <= n < 2^31 (the sum below then stays within 32 bits).
  FB_HOST_DEVICE uint32_t div(uint32_t n) const {
    return (uint32_t((uint64_t(n) * mul) >> 32) + n) >> shift;
  }
  FB_HOST_DEVICE uint32_t mod(uint32_t n) const { return n - div(n) * d; }
};

} // namespace fb::kernels
