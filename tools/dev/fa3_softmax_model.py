#!/usr/bin/env python3
"""numpy model of fa3_pipelined's per-warp online softmax (optimistic exp2, sum check, slow path, redo), in
float32, against a float64 reference LSE. It replays the kernel's decisions per warp of 16 rows and per K/V tile on
the test suites' key-growth inputs (keys in 4 blocks along the sequence with std 1, g, g^2, g^3), so a numerical hole
in the algorithm shows up in seconds without a GPU. It found the bug where a row's offset jumped by 126-128 log2
units and ex2.approx.ftz flushed alpha to 0 (the redo bound is now 2^100; kernels/fa3_pipelined/HISTORY.md, optimistic softmax).
    tools/dev/fa3_softmax_model.py [--seeds 6] [--redo-above 2**100]"""
import argparse

import numpy as np

SLACK = 8.0  # kRescaleSlack: the fast path holds while every lane-partial row sum is <= 2^SLACK


def model_warp(S, last, rows, block_n, n_tiles, sl2, redo_above, stats):
    """Returns (m, lane-partial l) per row of one warp after all K/V tiles, as the kernel would hold them."""
    m = np.full(len(rows), -np.inf, np.float32)
    l = np.zeros((len(rows), 4), np.float32)
    settled = False
    for j in range(n_tiles):
        cols = np.arange(j * block_n, (j + 1) * block_n)
        Sw = np.full((len(rows), block_n), -np.inf, np.float32)
        for a, r in enumerate(rows):
            vis = cols <= last[r]
            Sw[a, vis] = S[r, cols[vis]]
        lane = (cols % 8) // 2  # accumulator column 8i + 2c + e lives in lane c of the quad

        def lanesum(P):
            return np.stack([P[:, lane == c].sum(1) for c in range(4)], 1).astype(np.float32)

        if settled:  # softmax_tile_optimistic
            off = (m * sl2).astype(np.float32)
            with np.errstate(over="ignore", invalid="ignore"):
                P = np.exp2(Sw * sl2 - off[:, None]).astype(np.float32)
            s = lanesum(P)
            if np.all(s <= 2.0 ** SLACK):
                l += s
                stats["fast"] += 1
                continue
            mp = P.max(1)
            if np.all(mp <= redo_above):
                with np.errstate(divide="ignore"):
                    lg = np.log2(mp).astype(np.float32)
                m_new = np.maximum(m, (off + lg) / sl2).astype(np.float32)
                alpha = np.exp2(off - m_new * sl2).astype(np.float32)
                alpha[alpha < 2.0 ** -126] = 0.0  # ex2.approx.ftz
                l = ((l + s) * alpha[:, None]).astype(np.float32)
                m = m_new
                stats["slow"] += 1
                continue
            stats["redo"] += 1  # S recomputed, then the exact path below
        mx = Sw.max(1)  # softmax_tile (exact, lazy)
        with np.errstate(invalid="ignore"):
            grow = np.any((mx - m) * sl2 > SLACK)
        alpha = np.ones(len(rows), np.float32)
        if grow:
            m_new = np.maximum(m, mx)
            alpha = np.exp2(m * sl2 - np.where(m_new == -np.inf, 0, m_new * sl2)).astype(np.float32)
            m = m_new
        off = np.where(m == -np.inf, 0, m * sl2)
        P = np.exp2(Sw * sl2 - off[:, None]).astype(np.float32)
        l = l * alpha[:, None] + lanesum(P) if grow else l + lanesum(P)
        settled = bool(np.all(m > -np.inf))
        stats["exact"] += 1
    return m, l


def run(sq, skv, d, hq, hkv, growth, block_n, causal, seed, redo_above):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((hq, sq, d)).astype(np.float32)
    k = rng.standard_normal((hkv, skv, d)).astype(np.float32)
    for part in range(4):
        k[:, skv * part // 4: skv * (part + 1) // 4] *= growth ** part
    scale = 1 / np.sqrt(d)
    sl2 = np.float32(scale * 1.4426950408889634)
    rows_all = np.arange(sq)
    last = np.minimum(skv - 1, rows_all + skv - sq) if causal else np.full(sq, skv - 1)
    bad, stats = 0, {"fast": 0, "slow": 0, "redo": 0, "exact": 0}
    for h in range(hq):
        S = q[h].astype(np.float64) @ k[h // (hq // hkv)].T.astype(np.float64)
        Sm = np.where(np.arange(skv)[None, :] <= last[:, None], S, -np.inf)
        mx = Sm.max(1)
        with np.errstate(invalid="ignore"):
            ref_lse = mx * scale + np.log(np.exp((Sm - mx[:, None]) * scale).sum(1))
        for w0 in range(0, sq, 16):
            rows = list(range(w0, min(w0 + 16, sq)))
            n_tiles = (skv + block_n - 1) // block_n
            if causal:
                n_tiles = min(n_tiles, max(last[rows]) // block_n + 1)
            if n_tiles <= 0:
                continue
            m, l = model_warp(S.astype(np.float32), last, rows, block_n, n_tiles, sl2, redo_above, stats)
            lt = l.sum(1)
            with np.errstate(divide="ignore"):
                lse = np.where(lt > 0, (m * sl2 + np.log2(lt)) * np.log(2), -np.inf)
            for a, r in enumerate(rows):
                if np.isfinite(ref_lse[r]) and abs(lse[a] - ref_lse[r]) > 2e-3:
                    bad += 1
    return bad, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--redo-above", type=float, default=2.0 ** 100)
    a = ap.parse_args()
    total = 0
    for seed in range(a.seeds):
        for bn in (64, 128, 192):
            for args in ((1000, 1000, 128, 8, 2, 3.0, bn, True), (300, 500, 64, 2, 1, 6.0, bn, True)):
                bad, st = run(*args, seed, a.redo_above)
                total += bad
                print(f"seed {seed} sq{args[0]} skv{args[1]} d{args[2]} growth x{args[5]:g} block_n {bn}: "
                      f"{bad} rows off the reference LSE; tiles {st}")
    print("FAIL" if total else "ok", f"({total} bad rows)")
    raise SystemExit(1 if total else 0)


if __name__ == "__main__":
    main()
