"""Figures for the HTML reports. Each `fig_*` saves a PNG and returns a caption, or raises Omitted(why)
when the data cannot support it; the page lists omitted figures with that reason.
matplotlib is imported on first use only.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from . import bounds as B
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


CHECK_LAYOUT = False  # tests set it: _save then refuses a figure whose text overlaps (layout_problems)


class LayoutError(Exception):
    pass


def layout_problems(fig) -> List[str]:
    """Overlapping text in a drawn figure: titles, axis labels, tick labels and legend entries that intersect one
    another, and legends that cover a panel. Text inside the data (heatmap cell values) is not checked."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    texts = list(fig.texts)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
        # tick labels of ticks outside the view limits are not drawn, though matplotlib still lists them
        ab = ax.get_window_extent(r)
        for t in ax.get_xticklabels() + ax.get_xticklabels(minor=True):
            c = t.get_window_extent(r)
            if ab.x0 - 1 <= (c.x0 + c.x1) / 2 <= ab.x1 + 1:
                texts.append(t)
        for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True):
            c = t.get_window_extent(r)
            if ab.y0 - 1 <= (c.y0 + c.y1) / 2 <= ab.y1 + 1:
                texts.append(t)
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_visible() and ax.get_legend()]
    for lg in legends:
        texts += list(lg.get_texts())
        if lg.get_title().get_text():
            texts.append(lg.get_title())
    boxes = []
    for t in texts:
        if t.get_visible() and t.get_text().strip():
            b = t.get_window_extent(r)
            if b.width > 0 and b.height > 0:
                boxes.append((t.get_text(), b.padded(-1.0)))
    out = []
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if boxes[i][1].overlaps(boxes[j][1]):
                out.append("text {!r} overlaps {!r}".format(boxes[i][0], boxes[j][0]))
    for lg in legends:
        lb = lg.get_window_extent(r).padded(-1.0)
        for ax in fig.axes:
            if ax.get_visible() and lb.overlaps(ax.get_window_extent(r)):
                out.append("a legend covers the panel {!r}".format(ax.get_title() or ax.get_ylabel()))
    return out


def _save(fig, path: str) -> None:
    if CHECK_LAYOUT:
        problems = layout_problems(fig)
        if problems:
            plt().close(fig)
            raise LayoutError("{}: {}".format(path, "; ".join(problems[:5])))
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt().close(fig)


def _figure(w: float, h: float):
    """A figure laid out by constrained_layout: titles, tick labels and outside legends get their own room, so no
    text overlaps (tight_layout ignores figure legends)."""
    return plt().figure(figsize=(w, h), layout="constrained")


def _grid(n: int, w: float = 5.0, h: float = 3.6):
    cols = 2 if n == 4 else min(n, 3)
    rows = int(math.ceil(n / cols))
    fig = _figure(w * cols, h * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def colors_for(names) -> Dict[str, tuple]:
    """One colour per name, the same in every panel of a figure (a shared legend needs it)."""
    names = sorted(set(names))
    cmap = plt().get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {v: cmap(i % cmap.N) for i, v in enumerate(names)}


def legend_below(fig, axes, ncols: int = 4, handles=None, labels=None) -> None:
    """One legend for the whole figure, below the panels, out of the data. Entries are de-duplicated by label
    across panels (the same variant in several panels is one entry)."""
    if handles is None:
        seen = {}
        for ax in axes:
            for h, l in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(l, h)
        labels, handles = list(seen), list(seen.values())
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=max(1, min(ncols, len(labels))), fontsize=8,
                   frameon=False)


def legend_right(fig, ax, handles=None, labels=None) -> None:
    """The legend to the right of a single-panel figure, out of the data."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)


def log_if_wide(ax, values, axis: str = "y", decades: float = 1.3) -> bool:
    """Log scale on an axis whose positive values span more than `decades` decades (20x by default): on a linear
    axis the small ones would sit flat on zero."""
    vals = [v for v in values if v is not None and v > 0]
    if len(vals) >= 2 and math.log10(max(vals) / min(vals)) > decades:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
        plain_log_labels(ax, axis)
        return True
    if axis == "y" and vals and len(vals) == len([v for v in values if v is not None]):
        ax.set_ylim(0, max(vals) * 1.08)  # a linear rate axis from zero: a 0.1% wiggle must not fill the panel
    try:
        ax.ticklabel_format(axis=axis, useOffset=False)  # "+1.1e2" above the axis reads as part of a title
    except AttributeError:  # the axis was already logarithmic
        pass
    return False


def plain_log_labels(ax, axis: str = "y") -> None:
    """Log-axis labels as plain numbers (300, not 3×10^2), minor ticks labelled at 2 and 5 only."""
    from matplotlib.ticker import FuncFormatter

    def major(v, _):
        return "{:g}".format(v) if v > 0 else ""

    a = ax.yaxis if axis == "y" else ax.xaxis

    def minor(v, _):
        lo, hi = sorted(a.get_view_interval())
        if v <= 0 or lo <= 0 or hi / lo > 10 ** 2.2:  # over two decades the major labels suffice
            return ""
        lead = round(v / 10 ** math.floor(math.log10(v) + 1e-9))
        return "{:g}".format(v) if lead in (2, 5) else ""
    a.set_major_formatter(FuncFormatter(major))
    a.set_minor_formatter(FuncFormatter(minor))


def text_color_for(rgba) -> str:
    """Black or white, whichever reads on a cell of this colour (relative luminance of the sRGB colour)."""
    def lin(c):
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (lin(c) for c in rgba[:3])
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.179 else "white"


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


def _seqlen_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("seqlen_kv")
    ax.grid(True, which="both", alpha=0.3)


def fig_tflops_vs_seqlen(points, res, path, value=None, ylabel="TFLOP/s") -> str:
    """`value(point)` gives the plotted number (default: TFLOP/s)."""
    value = value or (lambda p: p.tflops)
    usable, shown, dropped = _line_families(points)
    colors = colors_for(v for f in shown for v in usable[f])
    fig, axes = _grid(len(shown))
    drawn = 0
    for ax, f in zip(axes, shown):
        ys_all = []
        for variant in sorted(usable[f]):
            pts = [(s, value(p)) for s, p in sorted(usable[f][variant].items())]
            pts = [(s, y) for s, y in pts if y is not None]
            if not pts:
                continue
            drawn += 1
            ys_all += [y for _, y in pts]
            ax.plot([s for s, _ in pts], [y for _, y in pts], label=variant, color=colors[variant], **_style(variant))
        _seqlen_axis(ax)
        log_if_wide(ax, ys_all)
        ax.set_ylabel(ylabel)
        ax.set_title(f, fontsize=9)
    if not drawn:
        plt().close(fig)
        raise Omitted("no ok point has the FLOPs and bytes this figure needs")
    legend_below(fig, axes)
    _save(fig, path)
    note = " ({} more families not drawn)".format(dropped) if dropped else ""
    return "Best config per variant at each sequence length; dashed lines are peers (torch SDPA / FlexAttention)." + note


def fig_pct_of_ceiling(points, res, path) -> str:
    if res.ceiling("gemm_bf16_tflops") is None or res.ceiling("copy_gbps") is None:
        raise Omitted("the results file has no measured ceilings (context.ceilings: bf16 GEMM and copy); run "
                      "'flashbench probe' or peers.py --ceilings")
    fig_tflops_vs_seqlen(points, res, path, value=lambda p: _pct_of_own_roof(p, res),
                         ylabel="% of measured roofline")
    r = B.roof(res)
    return ("Speed as a percentage of this GPU's measured roofline at each point's minimum bytes: the bf16 GEMM rate "
            "({:.0f} TFLOP/s) for compute-bound points, the copy bandwidth ({:.0f} GB/s) for memory-bound ones "
            "(ridge {:.0f} FLOP/B). e4m3 points use the e4m3 GEMM where the file has it, else the bf16 one."
            .format(r.tflops, r.gbps, r.ridge))


def _pct_of_own_roof(p, res) -> Optional[float]:
    r = B.roof(res, p.problem.get("dtype"))
    return None if r is None else B.pct_of_roof(p, r)


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
    fig = _figure(9, 5)
    ax = fig.subplots()
    ai = [r[1] for r in rows]
    lo, hi = min(min(ai), peak * 1e3 / bw) / 4, max(max(ai), peak * 1e3 / bw) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, x * bw * 1e9 / 1e12) for x in xs], "k-", lw=1.5,
            label="roof: {:.0f} TFLOP/s, {:.0f} GB/s (measured)".format(peak, bw))
    fp8_peak = res.ceiling("gemm_e4m3_tflops")
    if fp8_peak and any(r[0].problem.get("dtype") in B.FP8_DTYPES for r in rows):
        ax.plot(xs, [min(fp8_peak, x * bw * 1e9 / 1e12) for x in xs], "k--", lw=1,
                label="e4m3 roof: {:.0f} TFLOP/s (measured)".format(fp8_peak))
    markers = {"measured": "o", "model": "^", "minimum": "x"}
    variants = sorted({r[0].variant for r in rows})
    colors = colors_for(variants)
    handles, labels = [], []
    for v in variants:
        for kind, m in markers.items():
            sel = [r for r in rows if r[0].variant == v and r[2] == kind]
            if sel:
                ax.scatter([r[1] for r in sel], [r[0].tflops for r in sel], marker=m, color=colors[v])
    for line in ax.get_lines():
        handles.append(line)
        labels.append(line.get_label())
    for v in variants:
        handles.append(plt().Line2D([], [], ls="", marker="o", color=colors[v]))
        labels.append(v)
    for kind, m in markers.items():
        if any(r[2] == kind for r in rows):
            handles.append(plt().Line2D([], [], ls="", marker=m, color="0.4"))
            labels.append("{} bytes".format(kind))
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_labels(ax, "x")
    plain_log_labels(ax, "y")
    ax.set_xlabel("FLOPs per DRAM byte (measured where counters exist, else model, else minimum)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    legend_right(fig, ax, handles, labels)
    _save(fig, path)
    return ("Roofline against this GPU's measured ceilings. Arithmetic intensity uses DRAM bytes measured by "
            "counters for {} of {} points (●); the others use the variant's traffic model (▲) or the minimum bytes "
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
    n_var = max(len([1 for (v, k) in best if k == key]) for key in keys)
    fig, axes = _grid(len(keys), w=6.0, h=1.2 + 0.55 * n_var)
    any_measured = False
    colors = {"measured": "tab:blue", "model": "tab:orange", "minimum": "tab:gray"}
    for ax, key in zip(axes, keys):
        # variants down the y axis: names stay horizontal and readable
        ps = sorted([p for (v, k), p in best.items() if k == key], key=lambda p: p.variant, reverse=True)
        ys = list(range(len(ps)))
        series = [("measured", [p.measured_dram_bytes() for p in ps]), ("model", [p.num("bytes_model") for p in ps]),
                  ("minimum", [p.num("bytes_min") for p in ps])]
        vals_all = []
        for j, (label, vals) in enumerate(series):
            any_measured |= label == "measured" and any(vals)
            mb = [(v or 0) / 1e6 for v in vals]
            vals_all += mb
            ax.barh([y + (1 - j) * 0.27 for y in ys], mb, height=0.27, label=label, color=colors[label])
        log_if_wide(ax, vals_all, axis="x")
        ax.set_yticks(ys)
        ax.set_yticklabels([p.variant for p in ps], fontsize=8)
        ax.set_xlabel("HBM MB (1 MB = 1e6 B)")
        ax.set_title(key, fontsize=8)
        ax.grid(True, axis="x", which="both", alpha=0.3)
    legend_below(fig, axes)
    _save(fig, path)
    return "HBM traffic per variant (best config): measured by counters{}, the variant's model, and the minimum " \
           "(Q, K, V read once; O, LSE written once).".format("" if any_measured else
                                                             " (none in this file: counters were not collected)")


def occupancy_label(p: R.Point) -> str:
    """What limits the theoretical occupancy; nothing does at 100% (every resource allows the full warp count, and
    the harness still names the first of the tied limits)."""
    t = p.num("occupancy", "theoretical_pct")
    if t is not None and t >= 99.95:
        return "not limited (100%)"
    return "limited by {}".format(p.get("occupancy", "limiter") or "unknown")


def fig_occupancy(points, res, path) -> str:
    rows = [p for p in points if p.ok and p.num("occupancy", "theoretical_pct") is not None
            and p.num("counters", "achieved_occupancy_pct") is not None]
    if not rows:
        raise Omitted("no ok point has both theoretical occupancy and achieved occupancy (counters)")
    fig = _figure(9, 5.5)
    ax = fig.subplots()
    variants = sorted({p.variant for p in rows})
    colors = colors_for(variants)
    limiters = sorted({occupancy_label(p) for p in rows})
    marks = dict(zip(limiters, "osD^vP*X"))
    for v in variants:
        for lim in limiters:
            sel = [p for p in rows if p.variant == v and occupancy_label(p) == lim]
            if sel:
                ax.scatter([p.num("occupancy", "theoretical_pct") for p in sel],
                           [p.num("counters", "achieved_occupancy_pct") for p in sel], marker=marks[lim],
                           color=colors[v], alpha=0.8, s=40)
    diag = ax.plot([0, 100], [0, 100], "k:", lw=1)[0]
    ax.set_xlim(0, 105)
    ax.set_ylim(0, 105)
    ax.set_xlabel("theoretical occupancy (%)")
    ax.set_ylabel("achieved occupancy (%)")
    ax.grid(True, alpha=0.3)
    Line2D = plt().Line2D
    handles = [Line2D([], [], ls="", marker="o", color=colors[v]) for v in variants]
    labels = list(variants)
    handles += [Line2D([], [], ls="", marker=marks[l], color="0.4") for l in limiters]
    labels += limiters
    handles.append(diag)
    labels.append("achieved = theoretical")
    legend_right(fig, ax, handles, labels)
    _save(fig, path)
    return ("Achieved vs theoretical occupancy per point: colour = variant, marker = what limits the theoretical "
            "value (nothing at 100%).")


def fig_split_q_vs_k(points, res, path) -> str:
    best: Dict[Tuple[str, str], R.Point] = {}
    for p in points:
        if p.ok and p.variant == "fa2_q_outer" and p.config.get("warp_layout") in ("split_q", "split_k"):
            k = (p.key, p.config["warp_layout"])
            if k not in best or p.median_us < best[k].median_us:
                best[k] = p
    keys = sorted({k for k, lay in best if (k, "split_q") in best and (k, "split_k") in best},
                  key=lambda k: natural_key(k))
    if not keys:
        raise Omitted("no problem has ok fa2_q_outer points with both warp_layout=split_q and split_k")
    keys = keys[:16]
    fig = _figure(10, 1.5 + 0.45 * len(keys))
    ax = fig.subplots()
    ys = list(range(len(keys)))[::-1]  # first key at the top
    vals = []
    for j, lay in enumerate(("split_q", "split_k")):
        xs = [best[(k, lay)].tflops or 0 for k in keys]
        vals += xs
        ax.barh([y + (0.5 - j) * 0.4 for y in ys], xs, height=0.4, label=lay)
    log_if_wide(ax, vals, axis="x")
    ax.set_yticks(ys)
    ax.set_yticklabels(keys, fontsize=8)
    ax.set_xlabel("TFLOP/s (best config per layout)")
    ax.set_title("fa2_q_outer: split-Q vs split-K warp layout", fontsize=10)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    legend_right(fig, ax)
    _save(fig, path)
    return "fa2_q_outer with each warp layout, best of the other config axes per problem."


def natural_key(s: str):
    """Sort key that orders digit runs by value: b2 < b4 < b16 < b32 (a string sort gives b16 < b2 < b32 < b4)."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(s)) if t]


def heatmap_groups(points: List[R.Point]) -> List[Tuple[str, str]]:
    """(variant, problem key) pairs with a tuning sweep over at least 2 block_m and 2 block_n values."""
    grid: Dict[Tuple[str, str], set] = defaultdict(set)
    for p in points:
        bm, bn = p.config.get("block_m"), p.config.get("block_n")
        if isinstance(bm, int) and isinstance(bn, int):
            grid[(p.variant, p.key)].add((bm, bn))
    ok = [k for k, cells in grid.items() if len({c[0] for c in cells}) >= 2 and len({c[1] for c in cells}) >= 2]
    return sorted(ok, key=lambda k: (-len(grid[k]), k[0], natural_key(k[1])))


def fig_heatmap(points, res, path, variant: str, key: str) -> str:
    import numpy as np
    from matplotlib.colors import Normalize
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
    fig = _figure(max(5.5, 1.1 * len(bns) + 3), 0.8 * len(bms) + 2.2)
    ax = fig.subplots()
    cmap = plt().get_cmap("viridis").with_extremes(bad="#dddddd")
    norm = Normalize(vmin=np.nanmin(z), vmax=np.nanmax(z))
    im = ax.imshow(np.ma.masked_invalid(z), cmap=cmap, norm=norm, origin="lower", aspect="auto")
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
            color = "black" if np.isnan(v) else text_color_for(cmap(norm(v)))
            ax.text(j, i, txt, ha="center", va="center", fontsize=9, color=color,
                    fontweight="bold" if v == best else "normal")
    ax.set_title("{}\n{}".format(variant, key), fontsize=9)
    _save(fig, path)
    return "Tile sweep of {} on {}: TFLOP/s per (block_m, block_n), bold = fastest, × = tried but not ok " \
           "(skipped, incorrect, ...), empty = not tried.".format(variant, key)
