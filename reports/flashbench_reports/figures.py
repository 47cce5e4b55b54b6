"""Figures for the HTML reports. Each `fig_*` saves a PNG and returns a caption, or raises Omitted(why)
when the data cannot support it; the page lists omitted figures with that reason.
matplotlib is imported on first use only.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from . import results as R

MAX_PANELS = 6


class Omitted(Exception):
    pass


_PLT = None


def plt():
    global _PLT
    if _PLT is None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
        _PLT = pyplot
    return _PLT


def _save(fig, path: str) -> None:
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt().close(fig)


def _grid(n: int, w: float = 5.0, h: float = 3.6):
    cols = min(n, 3)
    rows = int(math.ceil(n / cols))
    fig, axes = plt().subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def _families(points: List[R.Point]) -> Dict[str, Dict[str, Dict[int, R.Point]]]:
    """family -> variant -> seqlen -> best ok point (best config per variant).

    Families are taken at fixed batch or at fixed tokens (batch x seqlen), whichever gives more curves with two or
    more sequence lengths: sweeps fix one or the other."""
    best = R.best_per_variant(points).items()

    def group(by_tokens):
        fam: Dict[str, Dict[str, Dict[int, R.Point]]] = defaultdict(lambda: defaultdict(dict))
        for (variant, _key), p in best:
            s = R.seqlen_of(p.problem)
            if s is None or p.tflops is None:
                continue
            fam[R.family_key(p.problem, by_tokens)][variant][s] = p
        return fam

    def curves(fam):
        return sum(1 for v in fam.values() if len({s for vs in v.values() for s in vs}) >= 2)

    by_batch, by_tokens = group(False), group(True)
    return by_tokens if curves(by_tokens) > curves(by_batch) else by_batch


def _line_families(points):
    fam = _families(points)
    usable = {f: v for f, v in fam.items() if len({s for vs in v.values() for s in vs}) >= 2}
    if not usable:
        raise Omitted("no problem family has ok points at two or more sequence lengths")
    ranked = sorted(usable, key=lambda f: -sum(len(v) for v in usable[f].values()))
    return usable, ranked[:MAX_PANELS], len(ranked) - min(len(ranked), MAX_PANELS)


def _style(variant: str):
    return {"linestyle": "--", "marker": "s"} if variant.startswith("peer:") else {"linestyle": "-", "marker": "o"}


def fig_tflops_vs_seqlen(points, res, path, scale: Optional[float] = None, ylabel="TFLOP/s") -> str:
    usable, shown, dropped = _line_families(points)
    fig, axes = _grid(len(shown))
    for ax, f in zip(axes, shown):
        for variant in sorted(usable[f]):
            pts = sorted(usable[f][variant].items())
            ys = [p.tflops * (scale or 1.0) for _, p in pts]
            ax.plot([s for s, _ in pts], ys, label=variant, **_style(variant))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seqlen_kv")
        ax.set_ylabel(ylabel)
        ax.set_title(f, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, path)
    note = " ({} more families not drawn)".format(dropped) if dropped else ""
    return "Best config per variant at each sequence length; dashed lines are peers (torch SDPA / FlexAttention)." + note


def fig_pct_of_ceiling(points, res, path) -> str:
    peak = res.ceiling("gemm_bf16_tflops")
    if peak is None:
        raise Omitted("the results file has no measured ceilings (context.ceilings); run 'flashbench probe' "
                      "or peers.py --ceilings")
    fig_tflops_vs_seqlen(points, res, path, scale=100.0 / peak, ylabel="% of measured bf16 GEMM TFLOP/s")
    return ("TFLOP/s as a percentage of this GPU's measured dense bf16 GEMM rate ({:.0f} TFLOP/s, {}). "
            "fp32 points are also divided by the bf16 ceiling.".format(peak, res.ceilings.get("gemm_mnk") or "8192³"))


def fig_roofline(points, res, path) -> str:
    peak, bw = res.ceiling("gemm_bf16_tflops"), res.ceiling("copy_gbps")
    if peak is None or bw is None:
        raise Omitted("needs measured bf16 GEMM and copy-bandwidth ceilings (context.ceilings), which this file lacks")
    best = [p for p in R.best_per_variant(points).values() if p.flops() and p.tflops]
    rows = []
    n_measured = 0
    for p in best:
        meas = p.measured_dram_bytes()
        nbytes, kind = (meas, "measured") if meas else (p.num("bytes_model"), "model") if p.num("bytes_model") \
            else (p.num("bytes_min"), "minimum")
        if not nbytes:
            continue
        n_measured += kind == "measured"
        rows.append((p, p.flops() / nbytes, kind))
    if not rows:
        raise Omitted("no ok point has FLOPs together with measured, model or minimum bytes")
    fig, ax = plt().subplots(figsize=(8, 5))
    ai = [r[1] for r in rows]
    lo, hi = min(ai) / 4, max(ai) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, x * bw * 1e9 / 1e12) for x in xs], "k-", lw=1.5,
            label="roof: {:.0f} TFLOP/s, {:.0f} GB/s (measured)".format(peak, bw))
    markers = {"measured": "o", "model": "^", "minimum": "x"}
    variants = sorted({r[0].variant for r in rows})
    cmap = plt().get_cmap("tab10")
    for i, v in enumerate(variants):
        for kind, m in markers.items():
            sel = [r for r in rows if r[0].variant == v and r[2] == kind]
            if sel:
                ax.scatter([r[1] for r in sel], [r[0].tflops for r in sel], marker=m, color=cmap(i % 10),
                           label="{} ({} bytes)".format(v, kind))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOPs per DRAM byte (measured where counters exist, else model, else minimum)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path)
    return ("Roofline against this GPU's measured ceilings. Arithmetic intensity uses DRAM bytes measured by "
            "counters for {} of {} points; the others use the variant's traffic model (▲) or the minimum bytes "
            "(×), which overstate intensity when the kernel moves more than modelled.".format(n_measured, len(rows)))


def _representative_problems(points: List[R.Point], pred, k: int = 4) -> List[str]:
    cover: Dict[str, set] = defaultdict(set)
    size: Dict[str, float] = {}
    for p in points:
        if p.ok and pred(p):
            cover[p.key].add(p.variant)
            size[p.key] = p.flops() or 0
    return sorted(cover, key=lambda key: (-len(cover[key]), -size[key]))[:k]


def fig_hbm_bytes(points, res, path) -> str:
    has = lambda p: p.num("bytes_model") or p.measured_dram_bytes()
    keys = _representative_problems(points, has)
    if not keys:
        raise Omitted("no ok point has a traffic model (bytes_model) or measured DRAM bytes")
    best = R.best_per_variant([p for p in points if has(p)])
    fig, axes = _grid(len(keys), w=6.0)
    any_measured = False
    for ax, key in zip(axes, keys):
        ps = sorted([p for (v, k), p in best.items() if k == key], key=lambda p: p.variant)
        xs = list(range(len(ps)))
        series = [("measured", [p.measured_dram_bytes() for p in ps]), ("model", [p.num("bytes_model") for p in ps]),
                  ("minimum", [p.num("bytes_min") for p in ps])]
        for j, (label, vals) in enumerate(series):
            any_measured |= label == "measured" and any(vals)
            ax.bar([x + (j - 1) * 0.27 for x in xs], [(v or 0) / 1e6 for v in vals], width=0.27, label=label)
        ax.set_xticks(xs)
        ax.set_xticklabels([p.variant for p in ps], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("HBM MB (1 MB = 1e6 B)")
        ax.set_title(key, fontsize=8)
        ax.legend(fontsize=7)
    _save(fig, path)
    return "HBM traffic per variant (best config): measured by counters{}, the variant's model, and the minimum " \
           "(Q, K, V read once; O, LSE written once).".format("" if any_measured else
                                                             " (none in this file: counters were not collected)")


def fig_occupancy(points, res, path) -> str:
    rows = [p for p in points if p.ok and p.num("occupancy", "theoretical_pct") is not None
            and p.num("counters", "achieved_occupancy_pct") is not None]
    if not rows:
        raise Omitted("no ok point has both theoretical occupancy and achieved occupancy (counters)")
    fig, ax = plt().subplots(figsize=(7, 5))
    limiters = sorted({str(p.get("occupancy", "limiter") or "unknown") for p in rows})
    marks = "osD^vP*X"
    for i, lim in enumerate(limiters):
        sel = [p for p in rows if str(p.get("occupancy", "limiter") or "unknown") == lim]
        ax.scatter([p.num("occupancy", "theoretical_pct") for p in sel],
                   [p.num("counters", "achieved_occupancy_pct") for p in sel], marker=marks[i % len(marks)],
                   label="limited by {}".format(lim), alpha=0.8)
    ax.plot([0, 100], [0, 100], "k:", lw=1, label="achieved = theoretical")
    ax.set_xlim(0, 105)
    ax.set_ylim(0, 105)
    ax.set_xlabel("theoretical occupancy (%)")
    ax.set_ylabel("achieved occupancy (%)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    _save(fig, path)
    return "Achieved vs theoretical occupancy per point; the marker says what limits the theoretical value."


def fig_split_q_vs_k(points, res, path) -> str:
    best: Dict[Tuple[str, str], R.Point] = {}
    for p in points:
        if p.ok and p.variant == "fa2_q_outer" and p.config.get("warp_layout") in ("split_q", "split_k"):
            k = (p.key, p.config["warp_layout"])
            if k not in best or p.median_us < best[k].median_us:
                best[k] = p
    keys = sorted({k for k, lay in best if (k, "split_q") in best and (k, "split_k") in best},
                  key=lambda k: (R.family_key(best[(k, "split_q")].problem), R.seqlen_of(best[(k, "split_q")].problem) or 0))
    if not keys:
        raise Omitted("no problem has ok fa2_q_outer points with both warp_layout=split_q and split_k")
    keys = keys[:16]
    fig, ax = plt().subplots(figsize=(max(6, 0.7 * len(keys) + 2), 4.5))
    xs = list(range(len(keys)))
    for j, lay in enumerate(("split_q", "split_k")):
        ax.bar([x + (j - 0.5) * 0.4 for x in xs], [best[(k, lay)].tflops or 0 for k in keys], width=0.4, label=lay)
    ax.set_xticks(xs)
    ax.set_xticklabels(keys, rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s (best config per layout)")
    ax.set_title("fa2_q_outer: split-Q vs split-K warp layout")
    ax.legend()
    _save(fig, path)
    return "fa2_q_outer with each warp layout, best of the other config axes per problem."


def heatmap_groups(points: List[R.Point]) -> List[Tuple[str, str]]:
    """(variant, problem key) pairs with a tuning sweep over at least 2 block_m and 2 block_n values."""
    grid: Dict[Tuple[str, str], set] = defaultdict(set)
    for p in points:
        bm, bn = p.config.get("block_m"), p.config.get("block_n")
        if isinstance(bm, int) and isinstance(bn, int):
            grid[(p.variant, p.key)].add((bm, bn))
    ok = [k for k, cells in grid.items() if len({c[0] for c in cells}) >= 2 and len({c[1] for c in cells}) >= 2]
    return sorted(ok, key=lambda k: -len(grid[k]))


def fig_heatmap(points, res, path, variant: str, key: str) -> str:
    import numpy as np
    cells: Dict[Tuple[int, int], Optional[float]] = {}
    for p in points:
        if p.variant != variant or p.key != key:
            continue
        c = (p.config.get("block_m"), p.config.get("block_n"))
        if None in c:
            continue
        t = p.tflops if p.ok else None
        if t is not None and (cells.get(c) is None or t > cells[c]):
            cells[c] = t
        cells.setdefault(c, None)
    bms = sorted({c[0] for c in cells})
    bns = sorted({c[1] for c in cells})
    z = np.full((len(bms), len(bns)), np.nan)
    for (bm, bn), t in cells.items():
        if t is not None:
            z[bms.index(bm), bns.index(bn)] = t
    if np.all(np.isnan(z)):
        raise Omitted("{} on {}: no ok tile configuration".format(variant, key))
    fig, ax = plt().subplots(figsize=(1.1 * len(bns) + 3, 0.8 * len(bms) + 2))
    cmap = plt().get_cmap("viridis").with_extremes(bad="#dddddd")
    im = ax.imshow(np.ma.masked_invalid(z), cmap=cmap, origin="lower", aspect="auto")
    fig.colorbar(im, ax=ax, label="TFLOP/s (best over other axes)")
    ax.set_xticks(range(len(bns)))
    ax.set_xticklabels(bns)
    ax.set_yticks(range(len(bms)))
    ax.set_yticklabels(bms)
    ax.set_xlabel("block_n")
    ax.set_ylabel("block_m")
    best = np.nanmax(z)
    for i in range(len(bms)):
        for j in range(len(bns)):
            v = z[i, j]
            if (bms[i], bns[j]) not in cells:
                continue
            txt = "×" if np.isnan(v) else "{:.0f}".format(v)
            ax.text(j, i, txt, ha="center", va="center", fontsize=8,
                    color="black" if np.isnan(v) or v >= 0.6 * best else "white",
                    fontweight="bold" if v == best else "normal")
    ax.set_title("{}\n{}".format(variant, key), fontsize=9)
    _save(fig, path)
    return "Tile sweep of {} on {}: TFLOP/s per (block_m, block_n), × = tried but not ok (skipped, " \
           "incorrect, ...), empty = not tried.".format(variant, key)
