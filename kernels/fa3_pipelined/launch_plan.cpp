// fa3_pipelined's launch geometry (traits.hpp, plan_launch): host logic, tested on the CPU.
#include "kernels/fa3_pipelined/traits.hpp"

#include <algorithm>

namespace fb::fa3 {

LaunchPlan plan_launch(const AttentionProblem &p, const Params &c, int64_t head_dim, int64_t sms,
                       int64_t per_sm, int64_t l2_bytes) {
  LaunchPlan plan;
  plan.total_tiles = total_work_tiles(p, c);
  const int64_t resident = persistent_grid(plan.total_tiles, sms, per_sm);
  plan.order = tile_order(p, c.block_m, head_dim, l2_bytes, section_tile_cap(p, resident));
  plan.grid = persistent_sched(c) ? resident : plan.total_tiles;
  plan.split.first = static_cast<int>(plan.total_tiles);
  if (c.scheduler == kSchedStreamK && !p.causal) {
    // The tail may spread over every resident slot, more CTAs than work tiles included: as many
    // chunks as slots (at most), and the grid holds that many CTAs.
    plan.split = tail_split(plan.total_tiles, sms * std::max<int64_t>(1, per_sm),
                            kv_tiles_for(0, c.block_m, c.block_n, p.seqlen_q, p.seqlen_kv, false));
    plan.grid = std::max<int64_t>(plan.grid, plan.split.ctas);
  }
  return plan;
}

} // namespace fb::fa3
