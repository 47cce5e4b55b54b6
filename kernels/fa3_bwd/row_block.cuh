// The body of one row block of a consumer warpgroup (fa3_bwd.cuh), included twice: as the body of the loop over
// whole row blocks (consumer) and as partial_block, a partial last block over R < block_m rows (row_tail).
// Not a function that the loop calls: at 80-row blocks ptxas 13.0 spills 56 bytes of the exponent loop's values when
// the loop calls it (inlined or not), and none with the body in the loop (HISTORY.md, "The partial last row block").
// In scope where it is included: a, sm, w, wg, hq, mb, it (the CTA's row block count), s and ph (the ring slot and
// its parity), t0, off, dk, dv, and the constants R (rows the products cover), DQN, kDqT and kDvEarly.
const uint32_t slot = sm.slot(s);
mbar_wait(sm.full(s), ph);
// 80-row blocks read the lane coordinates afresh each row block (kernels::bwd::fresh_tid): hoisted, their
// derived addresses spill beside the accumulators. The others keep them (1-2% faster at head_dim 64).
const int t = kDqT ? int(kernels::bwd::fresh_tid() % 128) : t0, warp = t / 32, lane = t % 32;

float sacc[R / 2], dpacc[R / 2];
wgmma_fence();
issue_scores<T, D, BM, R>(sacc, sm.k, wg, slot + sm.q_off);
wgmma_commit();
issue_scores<T, D, BM, R>(dpacc, sm.v, wg, slot + sm.dout_off);
wgmma_commit();
wgmma_wait<1>();
fence_operands(sacc);

// Pᵀ, masked where a key is past the sequence end or (causal) right of a query's diagonal.
const int key_lo = w.col * kBlockN + wg * kKeysPerWarpgroup + 16 * warp + lane / 4;
const int q_lo = mb * BM + 2 * (lane % 4);
const bool need_mask = (w.col + 1) * kBlockN > a.seqlen_kv ||
                       (a.causal && w.col * kBlockN + kBlockN - 1 > mb * BM + off);
// This thread's query rows (columns 8i + 2(lane%4) and the next of the accumulators). The barrier is met
// after Sᵀ's wait: before it, while Sᵀ and dPᵀ run, was 1% slower at head_dim 128 (HISTORY.md).
const int r = it % kRowsBuffers;
rows_sync(r); // this row block's LSE₂ and D are in buffer r
const uint32_t lse_row = sm.lse2(r) + uint32_t(4 * (lane % 4)) * 4; // rows_pos
// One loop for tiles with a mask and one without: with the test inside, ptxas kept a branch on need_mask
// every two elements (64 a row block), and their waits were ~5% of the consumers' stall samples (d64
// profile, HISTORY.md).
const auto exp_tile = [&](auto masked) {
#pragma unroll
  for (int kt = 0; kt < R / 16; ++kt) {
    const float4 l = ld_shared_f4(lse_row + uint32_t(16 * kt) * 4);
#pragma unroll
    for (int i = 2 * kt; i < 2 * kt + 2; ++i) {
      const float l0 = i % 2 ? l.z : l.x, l1 = i % 2 ? l.w : l.y;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = fb::kernels::fast_exp2(fmaf(sacc[4 * i + e], a.scale_log2, e % 2 ? -l1 : -l0));
        if constexpr (decltype(masked)::value) {
          const int key = key_lo + 8 * (e / 2), q = q_lo + 8 * i + e % 2;
          if (key >= a.seqlen_kv || (a.causal && key > q + off))
            p = 0.f;
        }
        sacc[4 * i + e] = p;
      }
    }
  }
};
if (need_mask)
  exp_tile(std::true_type{});
else
  exp_tile(std::false_type{});
uint32_t pa[R / 16][4];
if constexpr (kDvEarly) {
  pack_a<T, R>(pa, sacc);
  wgmma_fence();
  issue_grad<T, D, BM, R>(dv, pa, slot + sm.dout_off);
  wgmma_commit();
  wgmma_wait<1>(); // dPᵀ
} else {
  wgmma_wait<0>(); // dPᵀ
}
fence_operands(dpacc);

// dSᵀ a k-step at a time, each step packed (with Pᵀ where dV is issued late) as soon as it is computed, so
// that the fp32 Sᵀ and dPᵀ of a step die before the next is computed.
const uint32_t delta_row = sm.delta(r) + uint32_t(4 * (lane % 4)) * 4; // rows_pos
uint32_t dsa[R / 16][4];
#pragma unroll
for (int kt = 0; kt < R / 16; ++kt) {
  const float4 dd = ld_shared_f4(delta_row + uint32_t(16 * kt) * 4);
#pragma unroll
  for (int i = 2 * kt; i < 2 * kt + 2; ++i) {
    const float d0 = i % 2 ? dd.z : dd.x, d1 = i % 2 ? dd.w : dd.y;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dpacc[4 * i + e] = sacc[4 * i + e] * (dpacc[4 * i + e] - (e % 2 ? d1 : d0));
  }
  pack_step<T, R>(dsa[kt], dpacc, kt);
  if constexpr (!kDvEarly)
    pack_step<T, R>(pa[kt], sacc, kt);
}
if constexpr (!kDvEarly) {
  wgmma_fence();
  issue_grad<T, D, BM, R>(dv, pa, slot + sm.dout_off);
  wgmma_commit();
}
const uint32_t ds_buf = sm.ds_buf(it & 1);
store_ds<BM, R>(ds_buf, dsa, wg, warp, lane);
fence_proxy_async_smem(); // the stmatrix writes, visible to WGMMA (the async proxy)
named_sync(kBarDsReady, kConsumerThreads);

// dQ before dK, so that the dQ partial is stored while dK runs. At 80-row blocks dV's product first retires
// (Pᵀ's registers free): issuing dQ behind it was 14% slower (HISTORY.md).
if constexpr (kDqT) {
  wgmma_wait<0>();
  fence_operands(pa);
}
// A partial block's dQᵀ piece: the first R/8 fragments of the whole block's (DqTileOrder), of which the bulk
// add takes no more (dq_writer).
constexpr int kDqN = R == BM ? DQN : R;
float dq[kDqN / 2];
wgmma_fence();
issue_dq<T, D, BM, kDqN>(dq, ds_buf, sm.k, wg);
wgmma_commit();
issue_grad<T, D, BM, R>(dk, dsa, slot + sm.q_off);
wgmma_commit();
wgmma_wait<1>();
fence_operands(dq);

if (a.dq_add == kDqBulk) {
  if (it >= sm.dq_bufs) // this piece's previous row block has been read by its bulk reduce
    mbar_wait(sm.dq_empty(it, wg), sm.dq_phase(it) ^ 1u);
  store_dq<kDqN>(sm.dq_half(it, wg), dq, t);
  fence_proxy_async_smem(); // the stores, visible to the bulk reduce
  __syncwarp();
  if (lane == 0)
    mbar_arrive(sm.dq_full(it, wg));
} else {
  add_frags_red<kDqN>(dq_tile<D, BM>(a, w, hq, mb) + wg * 64 * DQN, dq, t);
}
wgmma_wait<0>();
fence_operands(pa);
fence_operands(dsa);
fence_operands(dk);
fence_operands(dv);
__syncwarp();
if (lane == 0)
  mbar_arrive(sm.empty(s)); // Q, dO, LSE₂ and D of this stage are read
