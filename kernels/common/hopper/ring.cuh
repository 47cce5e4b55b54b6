// Position in a ring of `stages` shared-memory slots, stepped once a use: the slot, how many times
// the ring has come round (lap) and that count's parity (the mbarrier phase to wait for). Stepping
// replaces a division by the runtime stage count in a loop head: in fa3_bwd's consumer that was an
// integer division (~30 instructions) between one row block's last WGMMA and the next one's first.
#pragma once

#include <cstdint>

namespace fb::hopper {

struct Ring {
  int slot = 0, lap = 0;
  __device__ __forceinline__ uint32_t phase() const { return uint32_t(lap) & 1u; }
  __device__ __forceinline__ void step(int stages) {
    if (++slot == stages) {
      slot = 0;
      ++lap;
    }
  }
};

} // namespace fb::hopper
