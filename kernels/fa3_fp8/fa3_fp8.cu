// FP8 (e4m3) forward for Hopper (sm_90a), with per-block scaling: Q and K carry one float32 descale
// per (batch, head, 128 tokens), V one per (batch, kv head); O comes out in bf16, LSE in fp32.
//
// What it changes relative to fa3_pipelined (the bf16/fp16 kernel it takes its roles, TMA loads,
// mbarrier ring and WGMMA descriptors from; kernels/common/hopper/), and why:
//  - Both GEMMs are e4m3 x e4m3 -> fp32 WGMMA (k32 per instruction, twice the bf16 rate;
//    wgmma_fp8.cuh).
//  - fp8 WGMMA takes K-major shared-memory operands only, and V arrives [key][head_dim] (head_dim
//    contiguous: the MN-major B of P V). The producer warpgroup, idle in fa3_pipelined but for one
//    thread, transposes each V tile in shared memory into V^T [head_dim][key] (transpose_v) and
//    hands it on through its own ring (vt_full, vt_empty). The TMA brings V into a two-deep raw
//    ring (vraw_full), released by the transposers' named barrier.
//  - P leaves the S accumulators as e4m3 A fragments with no shuffle: the k32 A fragment wants keys
//    4c..4c+3 in one register, the accumulator holds keys 2c, 2c+1, 8+2c, 9+2c. The transposer
//    writes V^T's keys in that same order (transpose_v), so the product pairs each P with its own V
//    row. (FA3 permutes the same way.)
//  - Descales: block_m = 128, one Q descale per work item and one K descale per 128 keys (per K/V
//    tile at block_n 128, two a tile at 192: softmax), folded into the one multiply per score the
//    softmax already makes (scale_log2 * q_descale * k_descale); V's descale folds into 1/l.
//  - P is rounded to e4m3 for P V, scaled by 2^8 first (kPShift, folded into the exp2 offset, and
//    out again through l, which sums the same scaled fp32 P unrounded): e4m3's normal range starts
//    at 2^-6, so unscaled, every P below 1/64 would keep 0-2 mantissa bits (measured on an H100:
//    elements of O off by 2.5x the 2^-4 rounding bound on rows that spread over many keys); scaled,
//    P down to 2^-14 keeps all 3, and the largest, 256, is under e4m3's 448.
//  - intra_wg_overlap (on by default with q_in_regs): tile j's Q K^T goes out with tile j-1's P V,
//    and tile j's softmax runs while that P V still holds the tensor cores (FA3's two-stage
//    pipelining in a warpgroup). P is 16 registers in e4m3, so this costs no register set beyond S,
//    O and P.
//  - block_m 128, head_dim 128; block_n 128 or 192 (the BN template parameter): a 192-key tile
//    cuts the per-tile work a key by a third (waits, descale loads, row max trees, loop head) at 96 + 24
//    registers of S and P, stages 2 (shared memory), Q K^T from shared memory (registers), and two
//    K descales a tile (softmax).
//  - head_dim 64 (block_n 128): an e4m3 row is 64 bytes, so Q, K and raw V come as one TMA box of
//    64-byte rows under the 64B swizzle, and Q K^T reads them through 64B-mode descriptors in two
//    k-steps; V^T is one [64][128-byte] tile under the 128B swizzle (its rows are 128 keys, as at
//    head_dim 128, so P keeps its fragment order), and P V is m64n64k32 into O's 32 registers.
//  - pingpong (off by default: slower at every N once the instruction count came down): the two
//    consumer warpgroups take turns to issue their GEMMs (named barriers, Turns).
//  - The overlapped softmax is pinned above P V's wait (pin_softmax; ptxas had sunk it below). The
//    row offset moves only when a row's max passes it by more than kRescaleSlack, so most tiles
//    skip O's 64 multiplies, and the row max and sum are 4-chain trees: ncu had shown the kernel
//    bound by the consumer warps' instruction latency (tensor pipe 35% busy, issue slots 47%), not
//    by the tensor cores.
//  - Few instructions: V transposed by ldmatrix.trans + PRMT + stmatrix (~80 instructions a
//    producer warp a tile, against 254 with 8-byte moves and byte permutes), ring slots and phases
//    stepped instead of divided out (the consumer's loop head 79 instructions, from 139), and e4m3
//    packing without a PRMT where ptxas can merge.
//  - q_in_regs: Q K^T as RS wgmma from Q fragments loaded once (load_q_regs); needs
//    intra_wg_overlap (ptxas).
//  - scheduler=persistent: one CTA an SM over work items (tile_of, Cursor), rings carried from item
//    to item, two Q buffers loaded one item ahead (q_full/q_empty), so an item's fill and drain
//    pass under its neighbours.
//  - Descales loaded early (KDescales, ldg_early); o_store=tma: O through shared memory and TMA
//    stores. The variant's history has each change's prediction and outcome.
//
// Roles: warpgroup 0 is the producer (thread 0 issues every TMA load; all 128 threads transpose V),
// warpgroups 1 and 2 are consumers of 64 query rows each of every work item. Tile j below counts
// the K/V tiles of all of the CTA's work items in order. Barriers (count; who arrives):
//   q_full[b]       1 + Q bytes; thread 0's expect_tx. The n-th work item with a K/V tile uses
//   buffer b = n % 2. q_empty[b]      8: lane 0 of every consumer warp once the item's last Q K^T
//   retired. k_full[s]       1 + K tile bytes; K/V tile j uses slot s = j % stages, its n-th use
//   has parity n & 1. k_empty[s]      8: lane 0 of every consumer warp once its Q K^T retired.
//   vraw_full[r]    1 + V tile bytes; tile j's raw V in slot r = j % 2.
//   vt_full[s]      128: every producer thread after its part of V^T (each fences its writes to the
//   async proxy). vt_empty[s]     8: lane 0 of every consumer warp once its P V retired. named
//   barrier 1 (128 producer threads): the raw slot has been read; thread 0 may refill it. named
//   barriers 2, 3 (pingpong turns) and 4, 5 (each consumer warpgroup's O staging buffer,
//   store_tile_tma).
#include "kernels/common/hopper/epilogue.cuh"
#include "kernels/common/hopper/sync.cuh"
#include "kernels/common/hopper/tensor_map.hpp"
#include "kernels/common/hopper/tma.cuh"
#include "kernels/common/hopper/warpgroup.cuh"
#include "kernels/common/hopper/wgmma.cuh"
#include "kernels/common/hopper/wgmma_fp8.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/sm_count.hpp"
#include "kernels/fa3_fp8/launch.hpp"

#include "flashbench/check.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fb::fa3fp8 {
namespace detail {

using namespace fb::hopper; // mbarriers, TMA, descriptors, setmaxnreg, named barriers, wgmma

struct KernelArgs {
  // e4m3, boxes of 128-byte rows under the 128B swizzle (head_dim 64: 64-byte rows, 64B swizzle)
  CUtensorMap tm_q, tm_k, tm_v;
  CUtensorMap
      tm_o; // bf16 O, 64 x 64-column boxes, 128B swizzle: the TMA store epilogue (o_store=tma)
  __nv_bfloat16 *o;
  float *lse;
  const float *q_descale, *k_descale, *v_descale;
  int64_t o_batch, o_seq, o_head; // O's element strides (Q's)
  int seqlen_q, seqlen_kv, heads_q, group;
  int n_q_tiles, n_k_blocks; // Q descales per (batch, head), K descales per (batch, kv head)
  int total_tiles;  // work items: n_q_tiles x heads_q x batch; CTA c takes c, c + gridDim.x, ...
  float scale_log2; // softmax scale * log2(e)
  int causal, stages;
  int q_bufs;   // Q buffers: 2 on the persistent grid (the next item's Q loads early), else 1
  int o_tma;    // O leaves through shared memory and TMA stores, else 4-byte stores from registers
  int pingpong; // the two consumer warpgroups take turns to issue their GEMMs (Turns)
};

// Registers a thread after setmaxnreg, per tile. setmaxnreg.inc draws from the CTA's own pool, the registers it
// launched with: 384 threads x 168 (__launch_bounds__(384, 1) on 64K), so 128 x producer + 256 x consumer <= 64512
// or the consumers wait forever (32 / 240, 65536, hung on an H100: HISTORY row 15). The transposers hold 16 words
// of V, 8 of V^T and their lane offsets; the consumers O (64, 128 at d256), S, P, Q's fragments with q_in_regs (16)
// and the row state. Only head_dim 256 at block_n 128 needs the consumers' 232 (a 128-key S and P beside O's 128):
// there the producer runs on 40, with thread 0's load cursors in shared memory between its turns. Elsewhere 72 /
// 216, the cursors in registers: 40 / 232 cost block_n 192 1-2% on an H200 and gained d128 nothing (HISTORY row 17).
constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
template <int BN, int HD> constexpr int kProducerRegs = HD == 256 && BN == 128 ? 40 : 72;
template <int BN, int HD>
constexpr int kConsumerRegs = (kThreads * kLaunchRegs - 128 * kProducerRegs<BN, HD>) / 256 / 8 * 8;
// The producer keeps thread 0's load cursors in shared memory (Smem::loads) when its registers are short.
template <int BN, int HD> constexpr bool kCursorsShared = kProducerRegs<BN, HD> < 72;
static_assert(
    kConsumerRegs<128, 128> == 216 && kConsumerRegs<128, 256> == 232,
    "setmaxnreg: 128 x producer + 256 x consumer within the registers the CTA launched with");
constexpr int kBarProducer = 1;
constexpr int kBarTurn0 = 2; // 2, 3: consumer warpgroup 0's and 1's turn to issue (pingpong)
constexpr int kBarEpi0 =
    4; // 4, 5: consumer warpgroup 0's and 1's O staging buffer (store_tile_tma)
constexpr uint32_t kOChunkBytes =
    64 * 128; // one warpgroup's 64 rows x 64 bf16 columns (a 128B-swizzle row)
// Bytes of head_dim in one TMA box row (traits.hpp, box_row_bytes).
template <int HD> constexpr uint32_t kRowBytes = uint32_t(box_row_bytes(HD));
constexpr float kLn2 = 0.69314718055994531f;
constexpr float kPShift = 8.f; // log2 of P's scale before its e4m3 rounding (see the file comment)
// How far (log2 units) a row's max may pass its offset before the offset moves: P stays <= 2^(8 +
// 0.75) = 431, under e4m3's largest finite value 448 (so satfinite never clips a P).
constexpr float kRescaleSlack = 0.75f;

// Shared memory (byte addresses, 1024-aligned tiles: the 128B swizzle pattern repeats every 1024
// bytes).
// BN: keys per K/V tile (128 or 192). A K or raw V tile is BN x 128 bytes; a V^T tile is one (BN 128) or two
// (BN 192: keys 0-127, then 128-191 in the first half of each row) 128 x 128-byte tiles.
// HD 256: Q, K and raw V tiles are two column halves of [rows][128 bytes] each; V^T is two 128-row
// tiles (head_dim 0-127, 128-255). HD 64: Q, K and raw V are [rows][64 bytes] under the 64B swizzle
// (its pattern repeats every 512 bytes), V^T one [64][128-byte] tile.
template <int BN, int HD = kHeadDim> struct Smem {
  static constexpr uint32_t kQ = uint32_t(q_tile_bytes(HD)), kK = uint32_t(k_tile_bytes(BN, HD)),
                            kVt = uint32_t(vt_tile_bytes(BN, HD));
  uint32_t q, k, vraw, vt, o, bars;
  __device__ __forceinline__ Smem(uint32_t base, int stages, int q_bufs, int o_tma) {
    q = base; // persistent grid: two Q buffers, the next work item's Q loads while this one's last
              // tiles run
    k = q + uint32_t(q_bufs) * kQ;
    vraw = k + uint32_t(stages) * kK;
    vt = vraw + 2u * kK;
    o = vt + uint32_t(stages) * kVt; // o_store=tma: 2 warpgroups x 2 chunks (launch sizes it)
    bars = o + (o_tma ? 4u * kOChunkBytes : 0u);
  }
  __device__ __forceinline__ uint32_t k_tile(int s) const { return k + uint32_t(s) * kK; }
  __device__ __forceinline__ uint32_t vraw_tile(int r) const { return vraw + uint32_t(r) * kK; }
  __device__ __forceinline__ uint32_t vt_tile(int s) const { return vt + uint32_t(s) * kVt; }
  __device__ __forceinline__ uint32_t q_tile(int b) const { return q + uint32_t(b) * kQ; }
  __device__ __forceinline__ uint32_t q_full(int b) const { return bars + 8 * b; }
  __device__ __forceinline__ uint32_t q_empty(int b) const { return bars + 8 * (2 + b); }
  __device__ __forceinline__ uint32_t k_full(int s) const { return bars + 8 * (4 + s); }
  __device__ __forceinline__ uint32_t k_empty(int s) const {
    return bars + 8 * (4 + kMaxStages + s);
  }
  __device__ __forceinline__ uint32_t vt_full(int s) const {
    return bars + 8 * (4 + 2 * kMaxStages + s);
  }
  __device__ __forceinline__ uint32_t vt_empty(int s) const {
    return bars + 8 * (4 + 3 * kMaxStages + s);
  }
  __device__ __forceinline__ uint32_t vraw_full(int r) const {
    return bars + 8 * (4 + 4 * kMaxStages + r);
  }
  // One 4-byte slot per consumer thread (threads 128..383), written and never read (pin_softmax,
  // kernels/common/hopper/wgmma.cuh).
  __device__ __forceinline__ uint32_t pin_slot() const {
    return bars + 256 + 4 * (uint32_t(threadIdx.x) - 128);
  }
  // Thread 0's load cursors (Loads, under 128 bytes) after the pin slots, in the barrier region's 2 KB.
  static constexpr uint32_t kLoadsOffset = 256 + 4 * 256;
  __device__ __forceinline__ uint32_t loads() const { return bars + kLoadsOffset; }
};

// V (raw tile: row = key, 128 bytes of head_dim) -> V^T (row = head_dim index, 128 bytes of keys),
// by ldmatrix.trans and stmatrix, 8 of each a thread a tile (moving 8 x 8-byte blocks with
// LDS.64/STS.64 and transposing bytes with 8 PRMT per 4 words took 254 instructions a producer warp
// a tile in the SASS). Position p of V^T's key axis holds key 16 (p / 16) + 8 (b >> 1) + 2c + (b &
// 1), with c = (p % 16) / 4 and b = p % 4: the P fragment's order (see the file comment). That
// order falls out of the 16-bit transpose:
//  - Unit (g, dg) = keys 16g..16g+15 x head_dim bytes 32dg..32dg+31. One ldmatrix.x4.trans loads
//    its four 8x8 16-bit matrices (keys 0-7 / 8-15 of the group x the two 16-byte chunks); lane t
//    gets, per matrix, head_dim pair d2 = t / 4 of keys 2c and 2c + 1 (c = t % 4): bytes [V[2c][2
//    d2], V[2c][2 d2 + 1], V[2c + 1][2 d2], V[2c + 1][2 d2 + 1]].
//  - Two PRMTs of the keys 0-7 and 8-15 words give V^T rows 2 d2 (bytes 0, 2, 4, 6) and 2 d2 + 1
//    (1, 3, 5, 7), positions 4c..4c+3 = keys 2c, 2c + 1, 8 + 2c, 9 + 2c: the order above, with no
//    shuffle.
//  - One stmatrix.x4 stores the four words (32 rows x 16 bytes). Lanes 16-31 swap their two words
//    (the PRMT selectors are per lane), so each stored matrix's rows are 2i (i < 4) and 2i + 1 (i
//    >= 4), eight different rows mod 8: eight different 16-byte chunks under the swizzle,
//    conflict-free; the loads' rows are eight consecutive keys, conflict-free too.
// Warp w takes key groups G w .. G w + G - 1 (G = BN / 64) and all four head_dim groups; key group
// kg lands in V^T tile kg / 8 at 16-byte column kg % 8. The lane offsets do not depend on the tile:
// TransposeLanes computes them once.
// HD 64: raw V's rows are 64 bytes under the 64B swizzle (swizzle_64b), so a key group is 1024 bytes
// and a row holds two head_dim groups; the load offsets follow that swizzle (head_dim group dg is
// chunk bit 1, so its offset is still ld ^ (dg << 5), and 16 keys further the XOR term (row / 2) % 4
// repeats). The stores and V^T are as at HD 128: 64 rows of 128 keys.
template <int BN, int HD = kHeadDim> struct TransposeLanes {
  static constexpr uint32_t G = BN / 64;
  // Head_dim group dg's load offset is ld ^ (dg << 5), key group k's store offset st ^ (k << 4) where G is 1 or
  // 2 (the swizzle XORs the 16-byte column index with the row, and these columns differ from the first only
  // in bits the row's term leaves alone); block_n 192's three key groups straddle V^T tiles, so they keep
  // their own offsets. Fewer words a thread: the producer warpgroup runs on 40 registers.
  static constexpr uint32_t kSt = G == 3 ? 3 : 1;
  uint32_t ld, st[kSt], sel_a, sel_b;
  __device__ __forceinline__ explicit TransposeLanes(int u) {
    const uint32_t w = uint32_t(u) >> 5, t = uint32_t(u) & 31u, m = t >> 3, i = t & 7u;
    if constexpr (HD == 64)
      ld = swizzle_64b(16u * (G * w) + 8u * (m & 1u) + i, 16u * (m >> 1));
    else
      ld = swizzle_128b(16u * (G * w) + 8u * (m & 1u) + i, 16u * (m >> 1));
    const uint32_t row = 16u * (m >> 1) + 2u * i + ((m & 1u) ^ (i >> 2));
#pragma unroll
    for (uint32_t k = 0; k < kSt; ++k) {
      const uint32_t kg = G * w + k; // BN 128: kg < 8, one V^T tile
      st[k] = G < 3 ? swizzle_128b(row, 16u * kg)
                    : (kg / 8u) * uint32_t(kTileBytes) + swizzle_128b(row, 16u * (kg % 8u));
    }
    const bool hi = t >= 16;
    sel_a = hi ? 0x7531u : 0x6420u;
    sel_b = hi ? 0x6420u : 0x7531u;
  }
  __device__ __forceinline__ uint32_t load(uint32_t dg) const { return ld ^ (dg << 5); }
  __device__ __forceinline__ uint32_t store(uint32_t k) const {
    return G < 3 ? st[0] ^ (k << 4) : st[k];
  }
};

template <int BN, int HD = kHeadDim>
__device__ __forceinline__ void transpose_v(uint32_t src, uint32_t dst,
                                            const TransposeLanes<BN, HD> &l) {
  // Key group G w + k: 16 keys = 2048 bytes of V (HD 64: 1024). Head_dim group dg (four a 128-byte row, two at
  // HD 64): 32 rows of V^T = 4096 bytes.
#pragma unroll
  for (uint32_t k = 0; k < TransposeLanes<BN, HD>::G; ++k)
#pragma unroll
    for (uint32_t dg = 0; dg < kRowBytes<HD> / 32; ++dg) {
      uint32_t r[4];
      fb::kernels::ldmatrix_x4_trans(r, src + l.load(dg) + 16u * kRowBytes<HD> * k);
      stmatrix_x4(dst + l.store(k) + 4096u * dg, __byte_perm(r[0], r[1], l.sel_a),
                  __byte_perm(r[0], r[1], l.sel_b), __byte_perm(r[2], r[3], l.sel_a),
                  __byte_perm(r[2], r[3], l.sel_b));
    }
}

// A wgmma accumulator row is held by the four lanes of a quad, as in mma.sync's m16n8 layout.
using fb::kernels::fast_exp2;
using fb::kernels::quad_max;
using fb::kernels::quad_sum;
// Four fp32 -> four e4m3 in one register, x0 in the lowest byte (round to nearest, saturating at
// 448). The two halves joined by mov.b32 {lo, hi}, which ptxas folds into the second F2FP
// (PACK_AB_MERGE_C); joined in C++, they cost a PRMT a register.
__device__ __forceinline__ uint32_t pack_e4m3(float x0, float x1, float x2, float x3) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n" // a -> upper byte, b -> lower
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}"
      : "=r"(r)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return r;
}

// K/V tiles a CTA visits: all, or (causal) up to the last key its last row sees (bottom-right
// alignment).
template <int BN> __device__ __forceinline__ int kv_tiles(const KernelArgs &a, int q0) {
  const int all = (a.seqlen_kv + BN - 1) / BN;
  if (!a.causal)
    return all;
  const int last_key = min(q0 + kBlockM, a.seqlen_q) - 1 + (a.seqlen_kv - a.seqlen_q);
  return last_key < 0 ? 0 : min(all, last_key / BN + 1);
}

struct TileId {
  int qt, q0, h, b, hk;
};
// Work item `lin`: Q tile rank lin / (heads x batch), so that every head's tile of one rank comes
// before the next rank (causal: the longest tiles first), and heads of one GQA group in
// neighbouring items (their K/V shared in L2). One-shot grid: one item a CTA. Persistent grid
// (scheduler=persistent): CTA c takes c, c + G, ... with G = min(items, SMs), and its producer
// loads the next item's Q and first K/V tiles under this item's last ones.
__device__ __forceinline__ TileId tile_of(const KernelArgs &a, int lin) {
  const int hb = a.total_tiles / a.n_q_tiles, rank = lin / hb, x = lin - rank * hb;
  TileId t;
  t.h = x % a.heads_q;
  t.b = x / a.heads_q;
  t.qt = a.causal ? a.n_q_tiles - 1 - rank : rank;
  t.q0 = t.qt * kBlockM;
  t.hk = t.h / a.group;
  return t;
}

// A position in this CTA's stream of K/V tiles: work item `lin`, its tile j of n. Items with no K/V
// tile (causal rows before every key) are stepped over: they need no Q and no loads, and the
// consumers write 0 / -inf for them.
template <int BN> struct Cursor {
  int lin, j, n;
  TileId t;
  __device__ __forceinline__ bool valid(const KernelArgs &a) const { return lin < a.total_tiles; }
  __device__ __forceinline__ void
  seek(const KernelArgs &a) { // from item lin on, the first with a K/V tile
    j = 0;
    for (; lin < a.total_tiles; lin += int(gridDim.x)) {
      t = tile_of(a, lin);
      n = kv_tiles<BN>(a, t.q0);
      if (n > 0)
        return;
    }
  }
  __device__ __forceinline__ void next(const KernelArgs &a) {
    if (++j == n) {
      lin += int(gridDim.x);
      seek(a);
    }
  }
  __device__ __forceinline__ static Cursor first(const KernelArgs &a) {
    Cursor c{int(blockIdx.x), 0, 0, {}};
    c.seek(a);
    return c;
  }
};

// Slot and phase parity of a ring of `stages` slots, stepped once a tile (no division by the
// runtime stage count in the loops; the consumer's loop head had ~60 instructions of it).
struct Ring {
  int slot = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void next(int stages) {
    if (++slot == stages) {
      slot = 0;
      phase ^= 1u;
    }
  }
};

// Thread 0 issues every TMA load, from three cursors that run ahead of the transposers: K `stages`
// tiles ahead, raw V 2 ahead, Q one work item ahead (into the other Q buffer, once that buffer's
// previous item has released it: the consumers do so after the item's last Q K^T, which needs
// nothing the transposers have not already made).
// One box of 128 bytes a row per 128 columns of head_dim (HD 256: two, into the tile's column
// halves, half_bytes apart; HD 64: one of 64-byte rows), all on one mbarrier.
template <int HD> constexpr int kBoxes = HD > 128 ? HD / 128 : 1;
template <int HD>
__device__ __forceinline__ void load_halves(const CUtensorMap *map, uint32_t dst,
                                            uint32_t half_bytes, uint32_t bar, int row, int head,
                                            int batch) {
  mbar_arrive_expect_tx(bar, half_bytes * kBoxes<HD>);
#pragma unroll
  for (int h = 0; h < kBoxes<HD>; ++h)
    tma_load_4d(dst + uint32_t(h) * half_bytes, map, bar, 128 * h, row, head, batch);
}
template <int BN, int HD>
__device__ __forceinline__ void load_k(const KernelArgs &a, const Smem<BN, HD> &sm,
                                       const Cursor<BN> &c, int s) {
  load_halves<HD>(&a.tm_k, sm.k_tile(s), BN * kRowBytes<HD>, sm.k_full(s), c.j * BN, c.t.hk, c.t.b);
}
template <int BN, int HD>
__device__ __forceinline__ void load_v(const KernelArgs &a, const Smem<BN, HD> &sm,
                                       const Cursor<BN> &c, int r) {
  load_halves<HD>(&a.tm_v, sm.vraw_tile(r), BN * kRowBytes<HD>, sm.vraw_full(r), c.j * BN, c.t.hk,
                  c.t.b);
}
template <int BN, int HD>
__device__ __forceinline__ void load_q(const KernelArgs &a, const Smem<BN, HD> &sm,
                                       const Cursor<BN> &c, int b) {
  load_halves<HD>(&a.tm_q, sm.q_tile(b), kBlockM * kRowBytes<HD>, sm.q_full(b), c.t.q0, c.t.h,
                  c.t.b);
}

// Thread 0's load cursors and its count of Q loads, kept in shared memory (Smem::loads) between its turns: in
// registers they were 25 words of every producer thread's budget (a cursor is 8), which the consumers need more.
template <int BN> struct Loads {
  Cursor<BN> k, v, q;
  int qn; // Q loads issued before q's
};

template <int BN, int HD>
__device__ __forceinline__ void producer(const KernelArgs &a, const Smem<BN, HD> &sm,
                                         Loads<BN> *loads) {
  const int u = int(threadIdx.x);
  Cursor<BN> vt = Cursor<BN>::first(a); // the tile being transposed; all 128 threads step it
  if (u == 0) {
    Cursor<BN> kc = vt, vc = vt;
    if (vt.valid(a)) {
      load_q(a, sm, vt, 0);
      for (int i = 0; i < a.stages && kc.valid(a); ++i, kc.next(a))
        load_k(a, sm, kc, i);
      for (int i = 0; i < 2 && vc.valid(a); ++i, vc.next(a))
        load_v(a, sm, vc, i);
    }
    *loads = Loads<BN>{kc, vc, vt, 0};
  }
  const TransposeLanes<BN, HD> lanes(u);
  Ring ring; // global tile g's K and V^T slot
  for (int g = 0; vt.valid(a); ++g, vt.next(a), ring.next(a.stages)) {
    const int s = ring.slot, r = g & 1;
    mbar_wait(sm.vraw_full(r), uint32_t(g >> 1) & 1u);
    if (g >= a.stages)
      mbar_wait(sm.vt_empty(s), ring.phase ^ 1u); // the slot's previous use, released
#pragma unroll
    for (int h = 0; h < kBoxes<HD>; ++h) // HD 256: each column half into its own V^T tile(s)
      transpose_v(sm.vraw_tile(r) + uint32_t(h) * BN * 128,
                  sm.vt_tile(s) + uint32_t(h) * ((BN + 127) / 128) * kTileBytes, lanes);
    fence_proxy_async_smem(); // this thread's V^T writes, visible to the consumers' WGMMA (the
                              // async proxy)
    mbar_arrive(sm.vt_full(s));
    named_sync(kBarProducer, 128); // every transposer has read raw slot r
    if (u == 0) {
      if (Cursor<BN> vc = loads->v; vc.valid(a)) { // global tile g + 2, into the raw slot just read
        load_v(a, sm, vc, r);
        vc.next(a);
        loads->v = vc;
      }
      if (Cursor<BN> kc = loads->k; kc.valid(a)) {
        // global tile g + stages, into K slot s once tile g's Q K^T released it
        mbar_wait(sm.k_empty(s), ring.phase);
        load_k(a, sm, kc, s);
        kc.next(a);
        loads->k = kc;
      }
      if (vt.j == 0) { // the first tile of an item: the next item's Q
        Cursor<BN> qc = loads->q;
        qc.lin += int(gridDim.x);
        qc.seek(a);
        if (qc.valid(a)) {
          const int qn = ++loads->qn;
          if (qn >= 2)
            mbar_wait(sm.q_empty(qn & 1), uint32_t((qn >> 1) - 1) & 1u);
          load_q(a, sm, qc, qn & 1);
        }
        loads->q = qc;
      }
    }
  }
}

// pingpong: the consumer warpgroups issue their GEMMs in turn, so that one's softmax runs while the
// other's GEMMs hold the tensor cores. Named barrier kBarTurn0 + w (256 threads) is warpgroup w's
// turn: w syncs on it before each issue, the other arrives on it after each of its own. Warpgroup 1
// opens warpgroup 0's first turn and skips its arrival after its last issue, so each barrier sees
// as many arrivals as syncs (both issue equally often).
struct Turns {
  bool on;
  int wg;
  __device__ __forceinline__ void open(int n) const {
    if (on && wg == 1 && n > 0)
      named_arrive(kBarTurn0, 256);
  }
  __device__ __forceinline__ void begin() const {
    if (on)
      named_sync(kBarTurn0 + wg, 256);
  }
  __device__ __forceinline__ void end(bool last) const {
    if (on && !(wg == 1 && last))
      named_arrive(kBarTurn0 + (wg ^ 1), 256);
  }
};

// ---- consumer steps (one warpgroup, 64 query rows)
template <int BN, int HD> struct ConsumerCtx {
  const KernelArgs &a;
  const Smem<BN, HD> &sm;
  DescBase dq;            // this warpgroup's 64 rows of Q
  float q_scale;          // scale_log2 * the CTA's Q descale
  const float *k_descale; // this (batch, kv head)'s K descales, one per K/V tile
  int row0, c, first_row; // the thread's half-0 row, its lane % 4, the warpgroup's first row
};
// Warpgroup wg's 64 rows of Q in Q buffer q_tile: 128-byte rows (the first column half at HD 256) under
// the 128B swizzle, or at HD 64 64-byte rows under the 64B swizzle.
template <int HD> __device__ __forceinline__ DescBase q_desc(uint32_t q_tile, int wg) {
  if constexpr (HD == 64)
    return desc_base_64b(q_tile + uint32_t(wg) * 64 * 64);
  else
    return desc_base(q_tile + uint32_t(wg) * 64 * 128, 16);
}

// S = Q K^T for K slot s: 4 k-steps of 32 bytes inside each 128-byte swizzle row (HD 256: the two
// column halves in turn; HD 64: 2 inside the 64-byte row, 64B-mode descriptors; uncommitted).
// QREG: Q's A fragments from registers (load_q_regs), else from shared memory.
template <bool QREG, int BN, int HD>
__device__ __forceinline__ void issue_qk(float (&sacc)[BN / 2], const ConsumerCtx<BN, HD> &x,
                                         const uint32_t (&qa)[4][4], int s) {
  if constexpr (HD == 64) {
    const DescBase dk = desc_base_64b(x.sm.k_tile(s));
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      if constexpr (QREG)
        wgmma_rs(sacc, qa[kk], dk.at(kk * 32), kk > 0 ? 1 : 0, E4m3Tag{}, IntC<BN>{});
      else
        wgmma_ss(sacc, x.dq.at(kk * 32), dk.at(kk * 32), kk > 0 ? 1 : 0, E4m3Tag{}, IntC<BN>{});
    }
    return;
  }
  const DescBase dk = desc_base(x.sm.k_tile(s), 16);
#pragma unroll
  for (int kk = 0; kk < HD / 32; ++kk) {
    const uint32_t qh = uint32_t(kk / 4) * kTileBytes, kh = uint32_t(kk / 4) * BN * 128;
    if constexpr (QREG)
      wgmma_rs(sacc, qa[kk], dk.at(kk * 32), kk > 0 ? 1 : 0, E4m3Tag{}, IntC<BN>{});
    else
      wgmma_ss(sacc, x.dq.at(qh + (kk % 4) * 32), dk.at(kh + (kk % 4) * 32), kk > 0 ? 1 : 0,
               E4m3Tag{}, IntC<BN>{});
  }
}

// q_in_regs: this warp's 16 rows of Q as the k32 A fragments of the 4 k-steps, once a CTA. Q K^T
// then reads only K from shared memory: at the e4m3 rate an SS m64n128k32 reads 6 KB in ~64 cycles,
// ~96 of shared memory's 128 bytes a cycle, before the TMA writes and the V transposes. ldmatrix
// (16-bit view, no transpose) gives lane (g, c) the bytes 4c..4c+3 of row g of each 8 x 16-byte
// matrix: matrices (rows 0-7 / 8-15) x (bytes 0-15 / 16-31) of k-step kk are a0..a3. HD 64: 2 k-steps
// from 64-byte rows under the 64B swizzle (qa[2], qa[3] unused).
template <int HD = kHeadDim>
__device__ __forceinline__ void load_q_regs(uint32_t (&qa)[4][4], uint32_t q_tile, int wg, int warp,
                                            int lane) {
  const uint32_t m = uint32_t(lane) >> 3, row = 64u * uint32_t(wg) + 16u * uint32_t(warp) +
                                                8u * (m & 1u) + (uint32_t(lane) & 7u);
#pragma unroll
  for (int kk = 0; kk < int(kRowBytes<HD>) / 32; ++kk) {
    if constexpr (HD == 64)
      fb::kernels::ldmatrix_x4(qa[kk], q_tile + swizzle_64b(row, 32u * kk + 16u * (m >> 1)));
    else
      fb::kernels::ldmatrix_x4(qa[kk], q_tile + swizzle_128b(row, 32u * kk + 16u * (m >> 1)));
  }
}

// O += P V^T for V^T slot s: BN / 32 k-steps of 32 keys, four to a 128 x 128-byte V^T tile
// (uncommitted). HD 256: O's two 128-column halves, each from its own V^T tile. HD 64: m64n64k32
// from the one [64][128-byte] V^T tile.
template <int BN, int HD>
__device__ __forceinline__ void issue_pv(float (&o)[HD / 2], const uint32_t (&pa)[BN / 32][4],
                                         const ConsumerCtx<BN, HD> &x, int s) {
  if constexpr (HD == 64) {
    static_assert(BN == 128, "HD 64 takes 128-key tiles");
    const DescBase dv = desc_base(x.sm.vt_tile(s), 16);
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
      wgmma_rs(o, pa[kt], dv.at(kt * 32), 1, E4m3Tag{}, IntC<64>{});
  } else if constexpr (HD == 128) {
    const DescBase dv = desc_base(x.sm.vt_tile(s), 16);
#pragma unroll
    for (int kt = 0; kt < (BN < 128 ? BN / 32 : 4); ++kt)
      wgmma_rs(o, pa[kt], dv.at(kt * 32), 1, E4m3Tag{}, IntC<128>{});
    if constexpr (BN == 192) { // keys 128-191: the second V^T tile
      const DescBase dv2 = desc_base(x.sm.vt_tile(s) + kTileBytes, 16);
#pragma unroll
      for (int kt = 4; kt < 6; ++kt)
        wgmma_rs(o, pa[kt], dv2.at((kt - 4) * 32), 1, E4m3Tag{}, IntC<128>{});
    }
  } else {
    static_assert(BN <= 128, "HD 256 takes one V^T tile a head_dim half");
#pragma unroll
    for (int hh = 0; hh < HD / 128; ++hh) {
      float(&oh)[64] = *reinterpret_cast<float(*)[64]>(o + 64 * hh);
      const DescBase dv = desc_base(x.sm.vt_tile(s) + uint32_t(hh) * kTileBytes, 16);
#pragma unroll
      for (int kt = 0; kt < BN / 32; ++kt)
        wgmma_rs(oh, pa[kt], dv.at(kt * 32), 1, E4m3Tag{}, IntC<128>{});
    }
  }
}

// A global load issued where it stands: asm volatile keeps it above the mbarrier waits (asm
// volatile too), so that its L2 latency passes under them instead of in front of its first use (a
// profile at N = 512 had the V descale's load exposed in every work item's epilogue, ~8% of the
// samples, and the Q descale's at its start).
__device__ __forceinline__ float ldg_early(const float *p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// Tile j's K descale, loaded a tile ahead: issued where it is used, the load came right after Q
// K^T's wait, so its L2 latency (the first tile of every work item misses L1) stood in front of the
// softmax's first use of it.
// BN 128: one descale a tile (a); BN 192: the tile's two descale blocks, a = (3j) / 2 and b = a + 1
// (clamped to the last block: keys past it are masked).
struct KD {
  float a, b;
};
// BN 128 as the kernel had it before BN 192 (its SASS then matches to the opcode).
template <int BN> struct KDescales;
template <> struct KDescales<128> {
  const float *p;
  int n;
  float next;
  __device__ __forceinline__ KDescales(const float *ptr, int tiles, const int &)
      : p(ptr), n(tiles), next(ldg_early(ptr)) {}
  __device__ __forceinline__ KD take(int j, const int &) { // tile j's, and tile j + 1's on its way
    const float cur = next;
    if (j + 1 < n)
      next = ldg_early(p + j + 1);
    return KD{cur, 0.f};
  }
};
// BN 64 (HD 256): two tiles a descale block, tile j's is block j / 2.
template <> struct KDescales<64> {
  const float *p;
  int n;
  float next;
  __device__ __forceinline__ KDescales(const float *ptr, int tiles, const int &)
      : p(ptr), n(tiles), next(ldg_early(ptr)) {}
  __device__ __forceinline__ KD take(int j, const int &) {
    const float cur = next;
    if (j + 1 < n)
      next = ldg_early(p + ((j + 1) >> 1));
    return KD{cur, 0.f};
  }
};
template <int BN> struct KDescales { // BN 192
  const float *p;
  int n; // tiles of the item
  KD next;
  // blocks: descale blocks of the (batch, kv head), read from the kernel's parameters where needed
  // (a register held for the clamp spilled at BN 192).
  __device__ __forceinline__ KDescales(const float *ptr, int tiles, const int &blocks)
      : p(ptr), n(tiles), next(load(0, blocks)) {}
  __device__ __forceinline__ KD load(int j, const int &blocks) const {
    return KD{ldg_early(p + descale_block_192(j, 0)),
              ldg_early(p + min(descale_block_192(j, 16), blocks - 1))};
  }
  __device__ __forceinline__ KD take(int j, const int &blocks) { // tile j's, and j + 1's on its way
    const KD cur = next;
    if (j + 1 < n)
      next = load(j + 1, blocks);
    return cur;
  }
};

// A row half's offset after a tile whose (scaled) max is row_max: moved only past kRescaleSlack;
// corr is what O must be scaled by; returns the exp2 offset (P = 2^8 exp2(s - m) <= 2^(8 + slack)).
__device__ __forceinline__ float move_offset(float row_max, float &m, float &corr) {
  const bool move =
      row_max > m + kRescaleSlack; // false for a row that has seen no key (-inf > -inf)
  const float m_new = move ? row_max : m;
  corr = move ? fast_exp2(m - m_new) : 1.f; // exp2(-inf) = 0 on the first tile a row sees
  m = m_new;
  return m_new == -INFINITY ? 0.f : m_new - kPShift;
}

// Scores -> 2^8 P in place, group i scaled by f(i) (log2 units per raw score), and l moved on; the
// sums in 4 chains a row half.
template <int kG, class F>
__device__ __forceinline__ void exp_and_sum(float (&sacc)[4 * kG], F f, const float (&off)[2],
                                            float (&l)[2], const float (&corr)[2]) {
  float rs[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
  for (int i = 0; i < kG; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = fast_exp2(fmaf(sacc[4 * i + e], f(i), -off[e >> 1]));
      sacc[4 * i + e] = p;
      rs[e >> 1][i % 4] += p;
    }
#pragma unroll
  for (int h = 0; h < 2; ++h)
    l[h] = l[h] * corr[h] + ((rs[h][0] + rs[h][1]) + (rs[h][2] + rs[h][3]));
}

// K/V tile j's scores (sacc, retired) -> 2^8 P in place; m and l move on, corr is what O must be
// scaled by. kd: the tile's K descales (KDescales). BN 192: the scores of 8-key groups 0-7 take
// descale a, of groups 16-23 descale b, of groups 8-15 a on even tiles (the block boundary at key
// 128) and b on odd ones (at key 64); the row max is taken per group of one factor, then scaled.
template <int BN, int HD>
__device__ __forceinline__ void softmax(float (&sacc)[BN / 2], const ConsumerCtx<BN, HD> &x, int j,
                                        KD kd, float (&m)[2], float (&l)[2], float (&corr)[2]) {
  if constexpr (BN == 128) {
    const KernelArgs &a = x.a;
    const float f = x.q_scale * kd.a;                // log2 units per raw score
    const int causal_off = a.seqlen_kv - a.seqlen_q; // row i sees keys <= i + causal_off
    // Mask keys past the end and (causal) right of the diagonal, only on tiles that reach them.
    const int key0 = j * BN;
    if (key0 + BN > a.seqlen_kv || (a.causal && key0 + BN - 1 > x.first_row + causal_off)) {
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + 8 * i + 2 * x.c + (e & 1), row = x.row0 + 8 * (e >> 1);
          if (key >= a.seqlen_kv || (a.causal && key > row + causal_off))
            sacc[4 * i + e] = -INFINITY;
        }
    }
    // Online softmax in log2 units; a row that has seen no key keeps m = -inf and subtracts 0. m is
    // the offset in use, moved only when the row's max passes it by more than kRescaleSlack, so that
    // most tiles leave O alone (rescale_and_pack skips the 64 multiplies when no row of the warp
    // moved). The max and the sums are trees of 4 chains a row half (one chain was 32 dependent
    // instructions).
    float mx[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        mx[h][k] = fmaxf(sacc[4 * k + 2 * h], sacc[4 * k + 2 * h + 1]);
#pragma unroll
    for (int i = 4; i < 16; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        mx[e >> 1][i % 4] = fmaxf(mx[e >> 1][i % 4], sacc[4 * i + e]);
    float off[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      off[h] = move_offset(
          quad_max(fmaxf(fmaxf(mx[h][0], mx[h][1]), fmaxf(mx[h][2], mx[h][3]))) * f, m[h], corr[h]);
    exp_and_sum<16>(
        sacc, [&](int) { return f; }, off, l, corr);
    return;
  }
  constexpr int kG = BN / 8;              // 8-key groups of the tile
  constexpr int kSeg = BN == 192 ? 3 : 1; // runs of groups with one descale factor
  constexpr int kSegG = kG / kSeg;        // groups a run
  const KernelArgs &a = x.a;
  float f[kSeg]; // log2 units per raw score, per run
  f[0] = x.q_scale * kd.a;
  if constexpr (kSeg == 3) {
    const float fb = x.q_scale * kd.b;
    f[1] = descale_block_192(j, 8) == descale_block_192(j, 0) ? f[0] : fb;
    f[2] = fb;
  }
  const int causal_off = a.seqlen_kv - a.seqlen_q; // row i sees keys <= i + causal_off
  // Mask keys past the end and (causal) right of the diagonal, only on tiles that reach them.
  const int key0 = j * BN;
  if (key0 + BN > a.seqlen_kv || (a.causal && key0 + BN - 1 > x.first_row + causal_off)) {
#pragma unroll
    for (int i = 0; i < kG; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + 8 * i + 2 * x.c + (e & 1), row = x.row0 + 8 * (e >> 1);
        if (key >= a.seqlen_kv || (a.causal && key > row + causal_off))
          sacc[4 * i + e] = -INFINITY;
      }
  }
  // Online softmax in log2 units; a row that has seen no key keeps m = -inf and subtracts 0. m is
  // the offset in use, moved only when the row's max passes it by more than kRescaleSlack, so that
  // most tiles leave O alone (rescale_and_pack skips the 64 multiplies when no row of the warp
  // moved). The max and the sums are trees of 4 chains a row half (one chain was 32 dependent
  // instructions).
  // One run at a time (BN 192), each reduced and scaled before the next, so that no more than one
  // run's 8 partial maxima are live next to S, O and the P in flight.
  float rmax[2];
#pragma unroll
  for (int sg = 0; sg < kSeg; ++sg) {
    float mx[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        mx[h][k] =
            fmaxf(sacc[4 * (sg * kSegG + k) + 2 * h], sacc[4 * (sg * kSegG + k) + 2 * h + 1]);
#pragma unroll
    for (int i = 4; i < kSegG; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        mx[e >> 1][i % 4] = fmaxf(mx[e >> 1][i % 4], sacc[4 * (sg * kSegG + i) + e]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float r = fmaxf(fmaxf(mx[h][0], mx[h][1]), fmaxf(mx[h][2], mx[h][3]));
      if constexpr (kSeg == 1)
        rmax[h] = r;
      else
        rmax[h] = sg == 0 ? r * f[0] : fmaxf(rmax[h], r * f[sg]);
    }
  }
  float off[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) // kSeg 1: the max of raw scores times the one factor (f > 0)
    off[h] = move_offset(kSeg == 1 ? quad_max(rmax[h]) * f[0] : quad_max(rmax[h]), m[h], corr[h]);
  exp_and_sum<kG>(
      sacc, [&](int i) { return f[i / kSegG]; }, off, l, corr);
}

// O *= corr (O retired; skipped when no row of the warp moved its offset), then P as e4m3 A
// fragments, in the accumulator's own key order (transpose_v).
template <int BN, int HD>
__device__ __forceinline__ void rescale_and_pack(float (&o)[HD / 2], const float (&corr)[2],
                                                 const float (&sacc)[BN / 2],
                                                 uint32_t (&pa)[BN / 32][4]) {
  if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int i = 0; i < HD / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o[4 * i + e] *= corr[e >> 1];
  }
#pragma unroll
  for (int kt = 0; kt < BN / 32; ++kt) {
    const float *s0 = sacc + 16 * kt; // groups 4kt .. 4kt + 3
    pa[kt][0] = pack_e4m3(s0[0], s0[1], s0[4], s0[5]);
    pa[kt][1] = pack_e4m3(s0[2], s0[3], s0[6], s0[7]);
    pa[kt][2] = pack_e4m3(s0[8], s0[9], s0[12], s0[13]);
    pa[kt][3] = pack_e4m3(s0[10], s0[11], s0[14], s0[15]);
  }
}

// OVERLAP (intra_wg_overlap on): tile j's Q K^T and tile j-1's P V are issued together, and tile
// j's softmax runs while P V still occupies the tensor cores; O's rescale and P's packing wait for
// P V. Off: each tile's two GEMMs and its softmax in series. One work item; kr and vr carry the K
// and V^T rings from item to item, and Q sits in buffer qb (its qn-th item with a K/V tile: full
// phase (qn >> 1) & 1).
template <bool OVERLAP, bool QREG, int BN, int HD>
__device__ __forceinline__ void consumer_item(const KernelArgs &a, const Smem<BN, HD> &sm,
                                              const TileId &t, int n, int wg, Ring &kr, Ring &vr,
                                              int qn) {
  const int tid = int(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32, g = lane / 4,
            c = lane % 4;
  const int row0 = t.q0 + 64 * wg + 16 * warp + g; // this thread's half-0 row; half 1 is row0 + 8
  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i)
    o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float v_ds =
      ldg_early(a.v_descale + int64_t(t.b) * (a.heads_q / a.group) + t.hk); // for the epilogue
  if (n > 0) {
    const int qb = qn & 1;
    const float q_ds =
        ldg_early(a.q_descale + (int64_t(t.b) * a.heads_q + t.h) * a.n_q_tiles + t.qt);
    const ConsumerCtx<BN, HD> x{a,
                                sm,
                                q_desc<HD>(sm.q_tile(qb), wg),
                                a.scale_log2 * q_ds,
                                a.k_descale +
                                    (int64_t(t.b) * (a.heads_q / a.group) + t.hk) * a.n_k_blocks,
                                row0,
                                c,
                                t.q0 + 64 * wg};
    KDescales<BN> kds(x.k_descale, n, a.n_k_blocks);
    mbar_wait(sm.q_full(qb), uint32_t(qn >> 1) & 1u);
    uint32_t qa[4][4];
    if (QREG)
      load_q_regs<HD>(qa, sm.q_tile(qb), wg, warp, lane);
    float sacc[BN / 2], corr[2];
    uint32_t pa[BN / 32][4];
    const Turns turn{a.pingpong != 0, wg};
    turn.open(n);
    if (OVERLAP) { // issues: Q K^T(0), then (Q K^T(j), P V(j-1)) for j = 1..n-1, then P V(n-1)
      mbar_wait(sm.k_full(kr.slot), kr.phase);
      turn.begin();
      wgmma_fence();
      issue_qk<QREG, BN, HD>(sacc, x, qa, kr.slot);
      wgmma_commit();
      turn.end(false);
      wgmma_wait<0>();
      fence_operands(sacc);
      if (lane == 0) {
        mbar_arrive(sm.k_empty(kr.slot));
        if (n == 1)
          mbar_arrive(sm.q_empty(qb)); // the item's last Q K^T has retired
      }
      softmax(sacc, x, 0, kds.take(0, a.n_k_blocks), m, l, corr);
      rescale_and_pack<BN, HD>(o, corr, sacc, pa);
      kr.next(a.stages); // kr: tile j's K slot; vr: tile j-1's V^T slot
      for (int j = 1; j < n; ++j, kr.next(a.stages), vr.next(a.stages)) {
        const int s = kr.slot, sp = vr.slot;
        const KD kd = kds.take(j, a.n_k_blocks);
        // Both waits first: a wait between the two issues made ptxas fence the second (C7519).
        mbar_wait2(sm.k_full(s), kr.phase, sm.vt_full(sp), vr.phase);
        turn.begin();
        wgmma_fence();
        issue_qk<QREG, BN, HD>(sacc, x, qa, s);
        wgmma_commit();
        issue_pv(o, pa, x, sp);
        wgmma_commit();
        turn.end(false);
        wgmma_wait<1>(); // Q K^T of tile j retired (groups retire in order); P V of tile j-1 may
                         // still run
        fence_operands(sacc);
        if (lane == 0) {
          mbar_arrive(sm.k_empty(s));
          if (j == n - 1)
            mbar_arrive(sm.q_empty(qb));
        }
        softmax(sacc, x, j, kd, m, l, corr);
        // Without it ptxas put the whole softmax below the next wait (every MUFU.EX2 after the
        // DEPBAR).
        pin_softmax(sm.pin_slot(), l, corr);
        wgmma_wait<0>();
        fence_operands(o);
        fence_operands(pa);
        if (lane == 0)
          mbar_arrive(sm.vt_empty(sp));
        rescale_and_pack<BN, HD>(o, corr, sacc, pa);
      }
      const int sl = vr.slot;
      mbar_wait(sm.vt_full(sl), vr.phase);
      turn.begin();
      wgmma_fence();
      issue_pv(o, pa, x, sl);
      wgmma_commit();
      turn.end(true);
      wgmma_wait<0>();
      fence_operands(o);
      fence_operands(pa);
      if (lane == 0)
        mbar_arrive(sm.vt_empty(sl));
      vr.next(a.stages);
    } else { // issues: Q K^T(j) and P V(j) for each j; one ring (kr) for both
      for (int j = 0; j < n; ++j, kr.next(a.stages)) {
        const int s = kr.slot;
        const KD kd = kds.take(j, a.n_k_blocks);
        const uint32_t ph = kr.phase;
        mbar_wait(sm.k_full(s), ph);
        turn.begin();
        wgmma_fence();
        issue_qk<QREG, BN, HD>(sacc, x, qa, s);
        wgmma_commit();
        turn.end(false);
        wgmma_wait<0>();
        fence_operands(sacc);
        if (lane == 0) {
          mbar_arrive(sm.k_empty(s));
          if (j == n - 1)
            mbar_arrive(sm.q_empty(qb));
        }
        softmax(sacc, x, j, kd, m, l, corr);
        rescale_and_pack<BN, HD>(o, corr, sacc, pa);
        mbar_wait(sm.vt_full(s), ph);
        turn.begin();
        wgmma_fence();
        issue_pv(o, pa, x, s);
        wgmma_commit();
        turn.end(j == n - 1);
        wgmma_wait<0>();
        fence_operands(o);
        fence_operands(pa);
        if (lane == 0)
          mbar_arrive(sm.vt_empty(s));
      }
    }
  }
  // O = acc * v_descale / l in bf16 (both carry P's 2^8); LSE = (m + log2 l - 8) ln 2, -inf for a
  // row that saw no key.
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    const float lsum = quad_sum(l[h]);
    const bool seen = m[h] != -INFINITY;          // the row saw a key
    inv[h] = seen ? __fdividef(v_ds, lsum) : 0.f; // lsum in [2^8, 2^40]: no IEEE division path
    if (c == 0 && row < a.seqlen_q)
      a.lse[(int64_t(t.b) * a.heads_q + t.h) * a.seqlen_q + row] =
          seen ? (m[h] + __log2f(lsum) - kPShift) * kLn2 : -INFINITY;
  }
  if (HD <= 128 && a.o_tma) { // HD 256 stores from registers (supports() refuses o_store tma)
    // o_store=tma: as fa3_pipelined's epilogue (kernels/common/hopper/epilogue.cuh), each
    // warpgroup with its own staging buffer of two 64-column chunks. The 4-byte stores from
    // registers below queue 32 STG a thread behind the LSU (a profile at N = 512: `lg` stalls in
    // every epilogue).
    // tid: the consumer's own thread index (see store_tile_tma's kGivenThread). BN 192: read
    // afresh here, so that ptxas does not keep the staging addresses it derives from it live
    // across the K/V loop (it spilled two of them next to the larger S and P).
    int etid = tid;
    if constexpr (BN == 192) {
      asm volatile("mov.u32 %0, %%tid.x;" : "=r"(etid));
      etid %= 128;
    }
    // HD 64: O is one 64-column chunk of the warpgroup's staging buffer.
    if constexpr (HD <= 128)
      store_tile_tma<__nv_bfloat16, HD, NoHook, true>(
          &a.tm_o, sm.o + uint32_t(wg) * 2u * kOChunkBytes, kOChunkBytes, kBarEpi0 + wg,
          t.q0 + 64 * wg, t.h, t.b, o, inv, 0, NoHook{}, etid);
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    if (row >= a.seqlen_q)
      continue;
    __nv_bfloat16 *dst =
        a.o + int64_t(t.b) * a.o_batch + int64_t(row) * a.o_seq + int64_t(t.h) * a.o_head + 2 * c;
#pragma unroll
    for (int i = 0; i < HD / 8; ++i)
      *reinterpret_cast<__nv_bfloat162 *>(dst + 8 * i) =
          __floats2bfloat162_rn(o[4 * i + 2 * h] * inv[h], o[4 * i + 2 * h + 1] * inv[h]);
  }
}

template <bool OVERLAP, bool QREG, int BN, int HD>
__device__ __forceinline__ void consumer(const KernelArgs &a, const Smem<BN, HD> &sm, int wg) {
  Ring kr, vr;
  int qn = 0; // items with a K/V tile so far: Q buffer qn & 1
  for (int lin = int(blockIdx.x); lin < a.total_tiles; lin += int(gridDim.x)) {
    const TileId t = tile_of(a, lin);
    const int n = kv_tiles<BN>(a, t.q0);
    consumer_item<OVERLAP, QREG, BN, HD>(a, sm, t, n, wg, kr, vr, qn);
    if (n > 0)
      ++qn;
  }
  if (a.o_tma && threadIdx.x % 128 == 0)
    bulk_wait_all(); // the last O store has left shared memory
}

template <bool OVERLAP, bool QREG, int BN, int HD>
__global__ void __launch_bounds__(kThreads, 1)
    fa3_fp8_kernel(const __grid_constant__ KernelArgs a) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const Smem<BN, HD> sm(base, a.stages, a.q_bufs, a.o_tma);
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(sm.q_full(b), 1);
      mbar_init(sm.q_empty(b), 8);
    }
    for (int s = 0; s < a.stages; ++s) {
      mbar_init(sm.k_full(s), 1);
      mbar_init(sm.k_empty(s), 8);
      mbar_init(sm.vt_full(s), 128);
      mbar_init(sm.vt_empty(s), 8);
    }
    for (int r = 0; r < 2; ++r)
      mbar_init(sm.vraw_full(r), 1);
    mbar_fence_init();
  }
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (wg == 0) {
    regs_dealloc<kProducerRegs<BN, HD>>();
    static_assert(sizeof(Loads<BN>) <= 2048 - Smem<BN, HD>::kLoadsOffset,
                  "the barrier region's 2 KB");
    if constexpr (kCursorsShared<BN, HD>) {
      producer(a, sm, reinterpret_cast<Loads<BN> *>(smem_raw + (sm.loads() - smem_addr(smem_raw))));
    } else {
      Loads<BN> local; // a local object behind a pointer the compiler sees: kept in registers
      producer(a, sm, &local);
    }
    return;
  }
  regs_alloc<kConsumerRegs<BN, HD>>();
  consumer<OVERLAP, QREG, BN, HD>(a, sm, wg - 1);
}

} // namespace detail

namespace {
using KernelFn = void (*)(detail::KernelArgs);
// The instantiation for a config: intra_wg_overlap x q_in_regs (q_in_regs needs intra_wg_overlap,
// traits.hpp).
template <int BN, int HD> KernelFn pick_bn(const Params &c) {
  if (!c.overlap)
    return detail::fa3_fp8_kernel<false, false, BN, HD>;
  if constexpr (!overlap_compiled(BN, HD)) {
    return nullptr; // refused (register.cpp)
  } else {
    if constexpr (BN == 128 && HD <= 128)
      if (c.q_in_regs)
        return detail::fa3_fp8_kernel<true, true, BN, HD>;
    return detail::fa3_fp8_kernel<true, false, BN, HD>; // q_in_regs elsewhere: refused (traits.hpp,
                                                        // register.cpp)
  }
}
// Null for a (head_dim, block_n) that is not compiled (tile_compiled).
KernelFn pick(const Params &c, int head_dim) {
  if (!tile_compiled(head_dim, c.block_n))
    return nullptr;
  if (head_dim == 256)
    return c.block_n == 128 ? pick_bn<128, 256>(c) : pick_bn<64, 256>(c);
  if (head_dim == 64)
    return pick_bn<128, 64>(c);
  return c.block_n == 192 ? pick_bn<192, 128>(c) : pick_bn<128, 128>(c);
}
} // namespace

const void *kernel_ptr(const Params &c, int head_dim) {
  return reinterpret_cast<const void *>(pick(c, head_dim));
}

void launch(const AttentionProblem &p, const Params &c, const LaunchArgs &args,
            cudaStream_t stream) {
  const int hd = int(p.head_dim);
  if (p.dtype != DType::e4m3 || !tile_compiled(hd, c.block_n) || p.paged() || !p.kv_lens.empty())
    throw std::invalid_argument("fa3_fp8: unsupported problem " + key(p) + " at block_n " +
                                std::to_string(c.block_n));
  if (hd == 256 && (c.o_tma || c.q_in_regs))
    throw std::invalid_argument("fa3_fp8: head_dim 256 takes o_store regs and q_in_regs off");
  if (!args.q_descale || !args.k_descale || !args.v_descale)
    throw std::invalid_argument(
        "fa3_fp8: e4m3 inputs need their descales (LaunchArgs::q_descale, ...)");
  if (auto why = config_problem(c))
    throw std::invalid_argument("fa3_fp8: " + *why);
  detail::KernelArgs a{};
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  // Boxes of 128 bytes a row (one swizzle atom): head_dim 256 loads two a tile (load_q, load_k). Head_dim 64:
  // one box of 64-byte rows under the 64B swizzle (the kernel's swizzle_64b and desc_base_64b).
  const int box_cols = box_row_bytes(hd);
  const CUtensorMapSwizzle sw = hd == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
  a.tm_q = hopper::make_map(args.q, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, hd, p.seqlen_q, p.heads_q,
                            p.batch, qs, box_cols, kBlockM, sw);
  a.tm_k = hopper::make_map(args.k, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, hd, p.seqlen_kv, p.heads_kv,
                            p.batch, ks, box_cols, c.block_n, sw);
  a.tm_v = hopper::make_map(args.v, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, hd, p.seqlen_kv, p.heads_kv,
                            p.batch, ks, box_cols, c.block_n, sw);
  a.o = static_cast<__nv_bfloat16 *>(args.o);
  a.lse = args.lse;
  a.q_descale = args.q_descale;
  a.k_descale = args.k_descale;
  a.v_descale = args.v_descale;
  a.o_batch = qs.batch;
  a.o_seq = qs.seq;
  a.o_head = qs.head;
  a.seqlen_q = int(p.seqlen_q);
  a.seqlen_kv = int(p.seqlen_kv);
  a.heads_q = int(p.heads_q);
  a.group = int(p.group_size());
  a.n_q_tiles = int(num_q_tiles(p));
  a.n_k_blocks = int((p.seqlen_kv + kFp8ScaleBlock - 1) / kFp8ScaleBlock);
  a.scale_log2 = float(p.softmax_scale() * 1.4426950408889634);
  a.causal = p.causal ? 1 : 0;
  a.stages = c.stages;
  a.pingpong = c.pingpong ? 1 : 0;
  a.q_bufs = q_buffers(c);
  a.o_tma = c.o_tma ? 1 : 0;
  if (c.o_tma)
    a.tm_o = hopper::make_tile_map(args.o, DType::bf16, hd, p.seqlen_q, p.heads_q, p.batch, qs, 64);
  const int64_t items = num_work_items(p);
  if (items > INT_MAX)
    throw std::invalid_argument("fa3_fp8: over 2^31 work items (Q tiles x heads x batch)");
  a.total_tiles = int(items);
  const int64_t smem = smem_bytes(c, hd);
  const KernelFn kernel = pick(c, hd);
  if (!kernel)
    throw std::invalid_argument(
        "fa3_fp8: intra_wg_overlap is not compiled at head_dim 256 and block_n 128");
  FB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  int64_t grid = items;
  // Persistent: one CTA an SM (the shared memory and registers allow no second), each over several
  // items.
  if (c.persistent)
    grid = std::min<int64_t>(items, kernels::sm_count());
  kernel<<<static_cast<unsigned>(grid), kThreads, static_cast<size_t>(smem), stream>>>(a);
  FB_CHECK_LAUNCH();
}

} // namespace fb::fa3fp8
