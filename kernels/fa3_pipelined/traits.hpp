// FA3 (Hopper: TMA + WGMMA + warp specialization): the config space, the tile geometry that the
// kernel, supports() and the traffic model share, shared-memory budget and which shapes are
// compiled. Host-only code may include this file.
#pragma once

#include "flashbench/config.hpp"
#include "flashbench/problem.hpp"
#include "flashbench/variant.hpp"
#include "kernels/common/fast_div.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/support.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

namespace fb::fa3 {

// Every consumer warpgroup owns 64 query rows: one m64 WGMMA row block for both GEMMs. More rows
// per warpgroup (two m64 blocks) would double the O and S registers (d128: 128 + 128 fp32 per
// thread) past the 240 a consumer gets, so block_m = 64 x consumer warpgroups.
constexpr int kRowsPerWarpgroup = 64;
constexpr int kMaxStages = 4;
constexpr int kSchedOneShot = 0;
constexpr int kSchedPersistent = 1;
// Persistent grid whose CTAs claim work tiles from a global counter (LaunchArgs::semaphores) as
// their producer gets to them, instead of the fixed round robin of kSchedPersistent. Causal work
// tiles differ in length (the last Q tile visits every K/V tile, the first one or two), and a fixed
// assignment leaves some CTAs with more work than others: simulated on the acceptance shapes, round
// robin reaches 0.76-0.95 of the even share at d128 causal, claiming 0.98-0.99.
constexpr int kSchedDynamic = 2;
// Persistent grid (one CTA per resident slot, as persistent) whose full waves of work tiles are
// claimed as with dynamic and whose last, partial wave is shared out by K/V tiles instead
// (stream-K): the R tiles left after the full waves hold R x iters K/V tiles, cut into `ctas`
// chunks, chunk c = K/V tiles [c, c + 1) x R x iters / ctas of them, which cuts a tile into
// segments in neighbouring chunks. The chunks are claimed from the same counter, last chunk first
// (giving CTA c chunk c after a round robin of the full waves spread the CTAs' arrival at the
// tail: no gain at d128 N2048).
// Non-causal only (every tile then has the same iters). Why: the acceptance shapes have 2048 work
// tiles at d128 (16384 tokens x 16 heads / 128 rows), 15.5 waves on 132 SMs, so every persistent or
// dynamic launch ran a 16th wave with 64 SMs idle (predicted 3% of the launch; cuDNN's persistent
// kernel loses the same; measured +1.6-2.4% at N >= 4096 and nothing at d128 N2048).
// A segment that does not start a tile writes its unnormalised O, its row offsets m and sums l to
// the workspace slot of its chunk (at most one such segment a chunk: only the first of its range
// can start mid-tile) and raises a flag; the segment that starts the tile (the last of its chunk,
// whose later parts sit in chunks claimed before it) waits for those flags, folds the partials in
// and writes O and LSE. The waits only point at chunks claimed earlier, by CTAs that are resident
// (persistent_grid), so they cannot deadlock.
constexpr int kSchedStreamK = 3;
// Compiled for head_dim 64 and 128: at 256 the producer's four TMA boxes a tile left no register
// for the segment's start in its 24 (spilled), and no acceptance shape needs it there.
constexpr bool split_compiled(int64_t head_dim) { return head_dim <= 128; }
constexpr int kMaxSplitCtas = 256; // chunks of a tail (workspace slots); 8 bits of WorkTile::part
// Shortest chunk of the tail, in K/V tiles: each segment costs a tile start and end
// (Q K^T of its first tile and P V of its last exposed, the partial's write or fold) besides its
// K/V tiles. Measured: 4 against 2,
// mean over the 1980-MHz pairs 1.009 against 1.004-1.005; at d128 N512 (4 K/V tiles a work tile,
// no split at 4) 0.986 against 0.974-0.979 of dynamic.
constexpr int kSplitMinIters = 4;
// The stream-K tail of a launch: tiles [first, first + tiles) share out tiles x iters K/V tiles
// over chunks 0..ctas-1 (ctas = 0: no split, every tile runs whole).
// 32-bit arithmetic throughout (c x tiles x iters < 2^30: kMaxTailIters): the producer thread that
// walks it has 24 registers, and a 64-bit division is a call. A segment's first K/V tile is below
// kMaxSplitIters (14 bits of WorkTile::part).
constexpr int kMaxSplitIters = 1 << 14;
constexpr int kMaxTailIters = 1 << 22;
struct TailSplit {
  int first = 0, tiles = 0, iters = 0, ctas = 0;
  // First K/V tile (counted over the tail's tiles in order) of chunk c; lo(ctas) is the end.
  FB_HOST_DEVICE int lo(int c) const { return c * (tiles * iters) / (ctas > 0 ? ctas : 1); }
  // The chunk holding the tail's K/V tile g: the largest c with lo(c) <= g (lo(c) <= g exactly
  // when c x tiles x iters < (g + 1) x ctas).
  FB_HOST_DEVICE int chunk_of(int g) const { return ((g + 1) * ctas - 1) / (tiles * iters); }
};
// total_tiles work tiles of `iters` K/V tiles each on a persistent grid of `grid` CTAs. The tail is
// split only where it helps: when more CTAs than tail tiles get a share of at least min_iters.
inline TailSplit tail_split(int64_t total_tiles, int64_t grid, int64_t iters,
                            int64_t min_iters = kSplitMinIters) {
  TailSplit s;
  s.first = static_cast<int>(total_tiles);
  if (grid <= 0 || iters <= 0)
    return s;
  const int64_t full = total_tiles / grid * grid, tail = total_tiles - full;
  const int64_t ctas = std::min<int64_t>(
      {grid, int64_t(kMaxSplitCtas), tail * iters / std::max<int64_t>(1, min_iters)});
  if (tail == 0 || ctas <= tail || iters >= kMaxSplitIters || tail * iters >= kMaxTailIters)
    return s;
  s.first = static_cast<int>(full);
  s.tiles = static_cast<int>(tail);
  s.iters = static_cast<int>(iters);
  s.ctas = static_cast<int>(ctas);
  return s;
}
// One piece of chunk c: K/V tiles [j0, j1) of tail tile `tile` (0-based in the tail). split: 0 =
// the whole tile; -1 = a later part (writes a partial); k > 0 = the tile's first part, which folds
// in the partials of chunks c + 1 .. c + k.
struct Segment {
  int tile, j0, j1, split;
};
// The segment of chunk c that begins at K/V tile g of the tail (lo(c) <= g < lo(c + 1)).
FB_HOST_DEVICE Segment segment_at(const TailSplit &s, int c, int g) {
  const int hi = s.lo(c + 1);
  Segment seg;
  seg.tile = g / s.iters;
  const int begin = seg.tile * s.iters, end = begin + s.iters;
  seg.j0 = g - begin;
  seg.j1 = (hi < end ? hi : end) - begin;
  seg.split = 0;
  if (seg.j0 > 0)
    seg.split = -1;
  else if (seg.j1 < s.iters)
    while (c + seg.split + 1 < s.ctas && s.lo(c + seg.split + 1) < end)
      ++seg.split;
  return seg;
}
// Workspace of the stream-K tail: per chunk and consumer warpgroup, every thread's O
// accumulators (head_dim / 2), m and l of its two rows, fp32, thread-minor (coalesced).
constexpr int64_t split_partial_floats(int64_t head_dim) { return head_dim / 2 + 4; }
constexpr int64_t split_workspace_bytes(int64_t head_dim, int consumers) {
  return int64_t(kMaxSplitCtas) * consumers * 128 * split_partial_floats(head_dim) * 4;
}
// Semaphores: the claim counters of the dynamic scheduler, then one flag per chunk and consumer
// warpgroup (set by the partial's writer, reset by the reader that folds it in).
constexpr size_t split_semaphore_bytes(int consumers) {
  return 2 * sizeof(int) + size_t(kMaxSplitCtas) * size_t(consumers) * sizeof(int);
}
// Bytes of LaunchArgs::semaphores the dynamic scheduler counts on: the claim counter and the count
// of CTAs that have made their last claim (the last one resets both to zero).
constexpr size_t kDynamicSemaphoreBytes = 2 * sizeof(int);
// How O leaves the CTA: `auto` stages it in shared memory and writes it with TMA bulk stores
// (one thread per warpgroup, asynchronous: the warpgroup moves on to its next work tile while the
// copy engine writes) wherever the staging buffer fits next to the ring, else falls back to
// `direct`: 4-byte stores straight from the accumulators (auto is 1-6% faster where it stages).
constexpr int kOStoreDirect = 0;
constexpr int kOStoreAuto = 1;
using kernels::kSmemOptinHopper; // kernels/common/support.hpp
// Register budgets after setmaxnreg (multiples of 8): the producer warpgroup only issues TMA from
// one thread. 3 warpgroups x 128 threads: 24 x 128 + 240 x 256 = 64512 <= 65536. 4 warpgroups
// (3 consumers): 24 x 128 + 160 x 384 = 64512.
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
constexpr int kConsumerRegsWide = 160;
// 3 consumers (160 registers each) hold O (D/2) + S (block_n/2) + P (block_n/4) + ~25 of
// addresses/stats: head_dim 64 with block_n <= 128 only (32 + 64 + 32 = 128).
constexpr bool wide_ok(int64_t head_dim) { return head_dim == 64; }
constexpr int kMaxWideBlockN = 128;
// head_dim 256 compiles block_n 64 only, with 1 or 2 consumers (wide_ok is false). Registers per
// consumer thread: O is 128 fp32 (the whole m64n256 accumulator), S 32 and P 16 at block_n 64:
// 176 pinned while Q K^T(j+1) and P V(j) are both in flight, inside the 240 budget; block_n 128
// would pin 128 + 64 + 32 = 224 before addresses and row stats. Shared memory rules block_n 128
// out anyway: Q + 2 stages x (K + V) = 64 + 2 x 128 KB = 320 KB at block_m 128 (288 KB at 64), over
// the 227 KB opt-in. At block_n 64, 2 stages fit block_m 128 and 3 do not (smem_bytes).
constexpr int kBlockND256 = 64;
// Which (block_n, 3-consumer) kernels a head_dim slice compiles: the one table that pick_launch,
// pick_kernel and supports() read.
constexpr bool tile_compiled(int64_t head_dim, int block_n, bool wide) {
  if (wide)
    return wide_ok(head_dim) && block_n <= kMaxWideBlockN;
  if (head_dim == 256)
    return block_n == kBlockND256;
  return block_n == 64 || block_n == 128 || block_n == 192;
}

// What one kernel instantiation decides at compile time. kModeAny is the all-paths kernel: causal
// masking and stream-K's split tail are run-time branches, so every problem runs the code of all
// three. The others compile only their own problem's paths: non-causal (plain), causal (masking,
// the diagonal, the warpgroups' passes) and non-causal stream_k (the tail's partials and folds).
// Why: a short-N work tile's once-per-tile code missed the instruction cache at every jump over
// another problem's path (17 pieces a tile in the all-paths kernel, 9 in the non-causal one). ncu
// at d128 N512 (bm128 bn128): 257 K instruction-cache misses against 96 K for a non-causal-only
// build, cuDNN's kernel 19 K; the non-causal-only build +2.4-2.6% at d128 N512 and +4-7% at d64
// N512 in the same call.
constexpr int kModeAny = 0, kModePlain = 1, kModeCausal = 2, kModeSplit = 3;
// The tiles that get the per-problem kernels (every tile compiles the all-paths one too, for the
// problems kernel_mode gives it). d128 block_n 192 has the all-paths kernel only: without the
// causal branches ptxas allocated it differently and spilled 84-92 bytes, and zero spills is part
// of the kernel's contract.
constexpr bool modes_compiled(int64_t head_dim, int block_n) {
  return !(head_dim == 128 && block_n == 192);
}
// Whether every row of a problem sees key 0: the non-causal ones, and the causal ones with no more
// queries than keys (bottom-right alignment: row i sees keys 0 .. i + seqlen_kv - seqlen_q). Then a
// warpgroup is settled after its work tile's first K/V tile, which the causal kernel (no stream-K
// split) starts at key 0.
inline bool every_row_sees_key0(const AttentionProblem &p) {
  return !p.causal || p.seqlen_q <= p.seqlen_kv;
}
// The kernel a problem and scheduler run on a compiled tile. The causal kernel's K/V loop
// assumes the settled warp, so a causal problem with rows that see no key runs the all-paths one.
inline int kernel_mode(int64_t head_dim, int block_n, const AttentionProblem &p, int scheduler) {
  if (!modes_compiled(head_dim, block_n) || !every_row_sees_key0(p))
    return kModeAny;
  if (p.causal)
    return kModeCausal;
  return scheduler == kSchedStreamK && split_compiled(head_dim) ? kModeSplit : kModePlain;
}
// Device code: whether a mode's kernel has the split tail's paths (kModeAny: decided by the
// launch's arguments, as causality is; causal_of in the kernel).
constexpr bool mode_has_split(int64_t head_dim, int mode) {
  return split_compiled(head_dim) && (mode == kModeAny || mode == kModeSplit);
}
// Shared-memory bytes besides the tiles: up to 1023 bytes to align the tiles to 1024, the
// mbarriers (256) and one 4-byte scratch slot per consumer thread (the softmax pin, 3 x 128 x 4).
constexpr int64_t kSmemSlack = 1024 + 256 + 1536;

struct Params {
  int block_m = 128;     // query rows per CTA
  int block_n = 128;     // keys per K/V tile
  int stages = 2;        // K/V tiles in flight (TMA ring depth)
  int consumers = 2;     // consumer warpgroups (each owns 64 rows of the Q tile)
  int pingpong = 1;      // consumer warpgroups take turns to issue S = Q K^T (named barriers)
  int intra_overlap = 1; // issue the next tile's Q K^T before this tile's softmax is done
  int scheduler = kSchedDynamic; // the fastest or within noise of it on every acceptance shape
  int o_store = kOStoreAuto;
};

inline std::optional<std::string> config_problem(const Params &c) {
  if (c.block_m != 64 && c.block_m != 128 && c.block_m != 192)
    return "block_m must be 64, 128 or 192";
  if (c.block_n != 64 && c.block_n != 128 && c.block_n != 192)
    return "block_n must be 64, 128 or 192 (the compiled K/V tile widths)";
  if (c.stages < 2 || c.stages > kMaxStages)
    return "stages must be 2, 3 or 4";
  if (c.consumers < 1 || c.consumers > 3)
    return "consumer_wgs must be 1, 2 or 3";
  if (c.block_m != kRowsPerWarpgroup * c.consumers)
    return "each consumer warpgroup owns 64 query rows (one m64 WGMMA block): block_m must be 64 x "
           "consumer_wgs";
  if (c.pingpong && c.consumers < 2)
    return "pingpong needs 2 or 3 consumer warpgroups";
  if (c.consumers == 3 && c.block_n > kMaxWideBlockN)
    return "3 consumer warpgroups get 160 registers each (64K / 512 threads): S + P of block_n 192 "
           "do not fit; block_n <= 128";
  if (c.scheduler != kSchedOneShot && c.scheduler != kSchedPersistent &&
      c.scheduler != kSchedDynamic && c.scheduler != kSchedStreamK)
    return "scheduler must be one_shot (0), persistent (1), dynamic (2) or stream_k (3)";
  if (c.o_store != kOStoreDirect && c.o_store != kOStoreAuto)
    return "o_store must be direct (0) or auto (1)";
  return std::nullopt;
}

inline Params params_of(const Config &c) {
  const Params d;
  return Params{static_cast<int>(c.get_or("block_m", d.block_m)),
                static_cast<int>(c.get_or("block_n", d.block_n)),
                static_cast<int>(c.get_or("stages", d.stages)),
                static_cast<int>(c.get_or("consumer_wgs", d.consumers)),
                static_cast<int>(c.get_or("pingpong", d.pingpong)),
                static_cast<int>(c.get_or("intra_wg_overlap", d.intra_overlap)),
                static_cast<int>(c.get_or("scheduler", d.scheduler)),
                static_cast<int>(c.get_or("o_store", d.o_store))};
}

Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &dev);

inline ConfigSpace make_space() {
  const Params d;
  return ConfigSpace(
      {Axis{"block_m", {64, 128, 192}, {}, "query rows per CTA (64 per consumer warpgroup)"},
       Axis{"block_n",
            {64, 128, 192},
            {},
            "keys per K/V tile (192: d128 fits 2 stages only; d256: 64 only)"},
       Axis{"stages", {2, 3, 4}, {}, "K/V tiles in flight in the TMA/mbarrier ring"},
       Axis{"consumer_wgs",
            {1, 2, 3},
            {},
            "consumer warpgroups (WGMMA + softmax); plus one producer warpgroup (TMA)"},
       Axis{"pingpong",
            {0, 1},
            {"off", "on"},
            "consumer warpgroups alternate issuing their Q K^T (named barriers)"},
       Axis{"intra_wg_overlap",
            {0, 1},
            {"off", "on"},
            "issue tile j+1's Q K^T and tile j's P V together, softmax j+1 while P V runs"},
       Axis{
           "scheduler",
           {kSchedOneShot, kSchedPersistent, kSchedDynamic, kSchedStreamK},
           {"one_shot", "persistent", "dynamic", "stream_k"},
           "one CTA per work tile; or one per resident slot walking the tiles (longest first) in a "
           "fixed round robin (persistent), claiming each next tile from a counter (dynamic), or "
           "round robin with the last partial wave shared out by K/V tiles (stream_k, "
           "non-causal)"},
       Axis{"o_store",
            {kOStoreDirect, kOStoreAuto},
            {"direct", "auto"},
            "O from registers with 4-byte stores, or (auto) through shared memory and TMA stores "
            "where the staging buffer fits next to the ring"}},
      Config({{"block_m", d.block_m},
              {"block_n", d.block_n},
              {"stages", d.stages},
              {"consumer_wgs", d.consumers},
              {"pingpong", d.pingpong},
              {"intra_wg_overlap", d.intra_overlap},
              {"scheduler", d.scheduler},
              {"o_store", d.o_store}}),
      [](const Config &c) { return config_problem(params_of(c)); }, default_for);
}

constexpr bool head_dim_ok(int64_t d) { return d == 64 || d == 128 || d == 256; }

// The default config of a problem (ConfigSpace::default_config(p, dev)). The base default (Params{})
// is head_dim 128's: 128 x 128, 2 stages, 2 consumer warpgroups with ping-pong and intra-warpgroup
// overlap, the dynamic scheduler. By head_dim:
//  - 256: block_n 64, the one K/V tile compiled there (tile_compiled: at block_n 128 two stages of
//    K and V alone are 262 KB of shared memory); 2 stages at block_m 128 are 194.8 KB.
//  - 64: block_m 192 with 3 consumer warpgroups (compiled for head_dim 64 only, block_n <= 128):
//    the winner at every d64 acceptance shape of an H100's table-prefill tune (HISTORY.md). Where
//    the keys are few (seqlen_kv <= 1024) also 4 stages without ping-pong: with 4-8 K/V tiles a
//    row block, a deeper ring hides the first loads and the warpgroups gain nothing from taking
//    turns (+1% non-causal, +5-6% causal at N 512 and 1024 there; from N 2048 the base ties or wins).
// dtype (bf16, fp16) and causality keep the base: the same kernels serve them; the tuning table
// refines per shape.
constexpr int64_t kShortKeys = 1024;
inline Config default_for(Config base, const AttentionProblem &p, const DeviceInfo &) {
  if (p.head_dim == 256)
    base.set("block_n", kBlockND256);
  if (wide_ok(p.head_dim)) {
    base.set("block_m", 3 * kRowsPerWarpgroup);
    base.set("consumer_wgs", 3);
    base.set("block_n", std::min<int64_t>(base.get("block_n"), kMaxWideBlockN));
    if (p.seqlen_kv <= kShortKeys) {
      base.set("stages", 4);
      base.set("pingpong", 0);
    }
  }
  return base;
}

// Dynamic shared memory: Q (block_m x D), `stages` K and V tiles (block_n x D each), all 16-bit,
// plus slack. At d256 only block_n 64 with 2 stages fits block_m 128 (194.8 KB; 3 stages 258.8 KB);
// block_m 64 fits 3 stages (226.8 KB of 227).
constexpr int64_t smem_bytes(int64_t head_dim, const Params &c) {
  return 2 * head_dim * (int64_t(c.block_m) + 2 * int64_t(c.stages) * c.block_n) + kSmemSlack;
}

// O staging buffer of the TMA store epilogue: block_m x D, 16-bit.
constexpr int64_t o_stage_bytes(int64_t head_dim, const Params &c) {
  return 2 * head_dim * int64_t(c.block_m);
}
// Whether O goes through shared memory and TMA: auto takes it where it fits.
constexpr bool o_staged(int64_t head_dim, const Params &c, int64_t limit = kSmemOptinHopper) {
  return c.o_store == kOStoreAuto && smem_bytes(head_dim, c) + o_stage_bytes(head_dim, c) <= limit;
}
// Q buffers: a persistent CTA loads the next work tile's Q into a second buffer while the
// current one is in use, so that the next tile's first Q K^T can go out with this tile's last P V;
// where the second buffer does not fit (after the O staging), one (the Q load then waits for the
// last Q K^T of the tile before). A one-shot CTA has one tile: one buffer.
constexpr bool persistent_sched(const Params &c) { return c.scheduler != kSchedOneShot; }
constexpr int q_buffers(int64_t head_dim, const Params &c, int64_t limit = kSmemOptinHopper) {
  if (!persistent_sched(c))
    return 1;
  const int64_t q = 2 * head_dim * int64_t(c.block_m);
  const int64_t used =
      smem_bytes(head_dim, c) + (o_staged(head_dim, c, limit) ? o_stage_bytes(head_dim, c) : 0);
  return used + q <= limit ? 2 : 1;
}
// What the launch asks for: the ring (smem_bytes), the staging buffer when O is staged and the
// second Q buffer when there is one.
constexpr int64_t launch_smem_bytes(int64_t head_dim, const Params &c,
                                    int64_t limit = kSmemOptinHopper) {
  return smem_bytes(head_dim, c) + (o_staged(head_dim, c, limit) ? o_stage_bytes(head_dim, c) : 0) +
         (q_buffers(head_dim, c, limit) - 1) * 2 * head_dim * int64_t(c.block_m);
}

inline int64_t num_q_tiles(const AttentionProblem &p, const Params &c) {
  return (p.seqlen_q + c.block_m - 1) / c.block_m;
}

// Work tiles: one per (Q tile, head, batch).
inline int64_t total_work_tiles(const AttentionProblem &p, const Params &c) {
  return num_q_tiles(p, c) * p.heads_q * p.batch;
}

// The work order. A work tile is one (Q tile, head, batch). The
// (b, h) pairs are cut into L2 sections of whole GQA groups, as many groups as keep their K/V
// within half the L2, so the CTAs in flight share K/V through L2 instead of streaming every head's
// K/V from DRAM at once. Inside a section the Q tiles go heaviest first (causal: the last Q tiles
// see the most keys), the heads of the section interleaved. The groups are spread evenly over the
// sections (sizes differ by at most one group): filling every section but the last left its few
// heads to start their heaviest tiles at the very end of the launch (simulated: 4-8% of a causal
// launch). A section also holds no more than section_tile_cap() work tiles (below), so that a
// head's K/V is read from DRAM once (measured: Q + K + V once, where the half-L2 rule alone read up
// to 2.5x).
struct TileOrder {
  int num_q_tiles = 1; // Q tiles per (b, h)
  int groups = 1;      // (b, KV head) pairs: batch x heads_kv
  int group = 1;       // query heads per KV head
  int sections = 1;    // L2 sections, 1..groups
  int64_t tiles() const { return int64_t(num_q_tiles) * groups * group; }
};
// max_section_tiles (> 0): a section also holds no more groups than fit in that many work
// tiles (at least one group), so that every tile of a head is claimed within about that span.
inline TileOrder tile_order(const AttentionProblem &p, int64_t block_m, int64_t head_dim,
                            int64_t l2_bytes, int64_t max_section_tiles = 0) {
  TileOrder o;
  o.num_q_tiles = static_cast<int>((p.seqlen_q + block_m - 1) / block_m);
  o.group = static_cast<int>(p.group_size());
  o.groups = static_cast<int>(p.batch * p.heads_kv);
  const int64_t kv_per_group = 2 * p.seqlen_kv * head_dim * dtype_bytes(p.dtype);
  int64_t per_section = std::max<int64_t>(1, (l2_bytes / 2) / std::max<int64_t>(1, kv_per_group));
  if (max_section_tiles > 0)
    per_section = std::min(
        per_section, std::max<int64_t>(1, max_section_tiles / (int64_t(o.num_q_tiles) * o.group)));
  o.sections = static_cast<int>((o.groups + per_section - 1) / per_section);
  return o;
}
// The cap on a section's work tiles (tile_order's max_section_tiles) for a launch whose
// resident CTAs number `resident`. Causal: two waves of tiles, heaviest first inside them, so the
// launch still ends on light tiles (LPT) while every head's tiles are claimed within about two
// waves (its K/V read from DRAM once). Non-causal tiles all cost the same, so nothing is gained by
// sorting: one group per section, whose Q tiles then run side by side on neighbouring CTAs and read
// its K/V together. Measured on the H200 against the half-L2 rule alone: d128 N512 +4%, causal
// +4.5%; DRAM reads fall to Q + K + V once (201 MB at the acceptance shapes, from 250-500).
inline int64_t section_tile_cap(const AttentionProblem &p, int64_t resident) {
  return p.causal ? 2 * resident : 1;
}

// Work tile t: its Q tile qt and its (b, h) pair bh = b x heads_q + h. The first groups % sections
// sections hold one group more than the others.
struct TileCoord {
  int qt, bh;
};
// The order's divisors, fixed for a launch, as FastDivs: the producer decodes every tile it
// claims, and with `/` that decode's conversions and reciprocals queued behind the consumers' exp2s
// on the same pipe (~1.4 us a tile at d128 N512: the next tile's Q went out that much later).
struct TileDecoder {
  int nq = 1, group = 1, big_tiles = 0, big_first = 0, small = 1;
  fb::kernels::FastDiv big_span, big_heads, small_span, small_heads;
  TileDecoder() = default;
  explicit TileDecoder(const TileOrder &o)
      : nq(o.num_q_tiles), group(o.group), small(o.groups / o.sections) {
    const int big = o.groups % o.sections;
    big_tiles = big * (small + 1) * o.group * nq;
    big_first = big * (small + 1);
    big_heads = fb::kernels::FastDiv(uint32_t((small + 1) * o.group));
    big_span = fb::kernels::FastDiv(uint32_t((small + 1) * o.group * nq));
    small_heads = fb::kernels::FastDiv(uint32_t(small * o.group));
    small_span = fb::kernels::FastDiv(uint32_t(small * o.group * nq));
  }
};
FB_HOST_DEVICE TileCoord tile_coord(const TileDecoder &o, int t) {
  const bool in_big = t < o.big_tiles;
  // Copies, not references: in the kernel `o` lives in the parameter space, and a selected
  // reference into it would need its address.
  const fb::kernels::FastDiv span = in_big ? o.big_span : o.small_span;
  const fb::kernels::FastDiv heads = in_big ? o.big_heads : o.small_heads;
  const int u = in_big ? t : t - o.big_tiles;
  const int s = int(span.div(uint32_t(u)));
  const int first_group = in_big ? s * (o.small + 1) : o.big_first + s * o.small;
  const int r = u - s * int(span.d);
  const int hr = int(heads.div(uint32_t(r)));
  return TileCoord{o.nq - 1 - hr, first_group * o.group + (r - hr * int(heads.d))};
}

// CTAs of a persistent launch: every resident slot of the device, never more than the tiles.
inline int64_t persistent_grid(int64_t total_tiles, int64_t sms, int64_t ctas_per_sm) {
  return std::max<int64_t>(1,
                           std::min<int64_t>(total_tiles, sms * std::max<int64_t>(1, ctas_per_sm)));
}

// What a launch is, given the device: its grid, its work order and its stream-K tail. `sms` and
// `per_sm` (the CTAs of the instantiation resident on an SM at once) size the persistent grid,
// whose resident CTAs cap the L2 sections (section_tile_cap); l2_bytes sizes the sections.
struct LaunchPlan {
  int64_t total_tiles = 0;
  int64_t grid = 0;
  TileOrder order;
  TailSplit split; // ctas 0: every tile runs whole
};
LaunchPlan plan_launch(const AttentionProblem &p, const Params &c, int64_t head_dim, int64_t sms,
                       int64_t per_sm, int64_t l2_bytes);

// K/V tiles that rows up to last_row visit: up to its last visible key (0 when it sees none).
FB_HOST_DEVICE int kv_tiles_to_row(int last_row, int block_n, int seqlen_q, int seqlen_kv,
                                   bool causal) {
  return int((fb::kernels::visible_keys(last_row, seqlen_q, seqlen_kv, causal) + block_n - 1) /
             block_n);
}
// K/V tiles that Q tile i visits: up to its last row's last visible key (0 when no row sees a key).
FB_HOST_DEVICE int64_t kv_tiles_for(int64_t i, int64_t block_m, int64_t block_n, int64_t seqlen_q,
                                    int64_t seqlen_kv, bool causal) {
  int64_t last_row = (i + 1) * block_m - 1;
  if (last_row > seqlen_q - 1)
    last_row = seqlen_q - 1;
  return kv_tiles_to_row(int(last_row), int(block_n), int(seqlen_q), int(seqlen_kv), causal);
}

using LaunchFn = void (*)(const AttentionProblem &, const Params &, const LaunchArgs &,
                          cudaStream_t);
// The __global__ function of the compiled instantiation that a problem runs with a scheduler (for
// the occupancy report), or nullptr.
using KernelFn = const void *(*)(const AttentionProblem &p, int scheduler);

// Enqueues the kernel (register.cpp picks the compiled instantiation). Throws std::invalid_argument
// for a shape that is not compiled.
void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream);

} // namespace fb::fa3
