// Position in a ring of `stages` shared-memory slots (a K/V ring, a row-block ring), stepped once a use: the slot
// and how many times it was used before; `use & 1` is the mbarrier phase to wait for. The ring runs on across work
// tiles. Stepping replaces a division by the runtime stage count in a loop head (in fa3_bwd's consumer that was an
// integer division, ~30 instructions, between one row block's last WGMMA wait and the next one's first WGMMA).
#pragma once

namespace fb::hopper {

struct RingPos {
  int s = 0, use = 0;
  __device__ __forceinline__ void next(int stages) {
    if (++s == stages)
      s = 0, ++use;
  }
  // The position before this one (stages >= 2).
  __device__ __forceinline__ RingPos prev(int stages) const {
    return s == 0 ? RingPos{stages - 1, use - 1} : RingPos{s - 1, use};
  }
};

} // namespace fb::hopper
