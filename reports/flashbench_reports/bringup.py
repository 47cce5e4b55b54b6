"""bringup: the same points on GPU A and GPU B, each point's speed-up explained by the GPUs' measured ceilings.

A point whose arithmetic intensity (FLOPs / bytes_min) is above both GPUs' ridge points is compute-bound and should
speed up by the ratio of the measured GEMM rates; one below both is memory-bound and should speed up by the ratio of
the measured copy bandwidths (bounds.py: the ratio of the two roofline times, which also covers a point between the
ridges). A point that gains less than `tolerance` times its prediction is flagged: something other than the bound
(latency, occupancy, a tile that suits one GPU) holds it back on B.

parse (results.load) -> collect (matched points, bounds) -> plot -> render (DIR/index.html, DIR/bringup.md).
"""
from __future__ import annotations

import os
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import List, Optional, Tuple

from . import bounds as B
from . import figures as F
from . import page
from . import results as R
from .report import _fmt, device_rows

DEFAULT_TOLERANCE = 0.9


@dataclass
class Row:
    """One point timed ok on both GPUs."""
    a: R.Point
    b: R.Point
    speedup: float                      # A time / B time: B's speed-up over A
    intensity: Optional[float] = None   # FLOPs / bytes_min
    bound: str = ""                     # compute | memory | between ('' without ceilings)
    predicted: Optional[float] = None   # ratio of the roofline times
    bound_by: str = ""                  # which ceilings' ratio the prediction is

    @property
    def gain(self) -> Optional[float]:
        """measured / predicted speed-up: 1 = exactly what the ceilings predict."""
        return None if not self.predicted else self.speedup / self.predicted

    def flagged(self, tolerance: float) -> bool:
        return self.gain is not None and self.gain < tolerance


def match(a: R.Results, b: R.Results) -> Tuple[List[Row], List[list], List[str], List[str]]:
    """(rows ok on both, [name, A status, B status, reason] for the rest of the common points, names only in A,
    names only in B). Rows carry their bound where both files have measured GEMM and copy ceilings."""
    am, bm = a.by_name(), b.by_name()
    rows, not_ok = [], []
    for n in sorted((n for n in am if n in bm), key=F.natural_key):
        x, y = am[n], bm[n]
        if not (x.ok and y.ok):
            not_ok.append([n, x.status, y.status, x.reason or y.reason])
            continue
        row = Row(a=x, b=y, speedup=x.median_us / y.median_us)
        dtype = x.problem.get("dtype")
        ra, rb = B.roof(a, dtype), B.roof(b, dtype)
        ai = B.intensity(x)
        if ra and rb and ai:
            f, nbytes = x.flops(), x.num("bytes_min")
            row.intensity = ai
            row.bound = B.bound_kind(ai, [ra.ridge, rb.ridge])
            row.predicted = ra.time_us(f, nbytes) / rb.time_us(f, nbytes)
            row.bound_by = {"compute": "{} ratio".format(ra.compute_name), "memory": "copy ratio",
                            "between": "roofline ratio"}[row.bound]
        rows.append(row)
    only_a = sorted((n for n in am if n not in bm), key=F.natural_key)
    only_b = sorted((n for n in bm if n not in am), key=F.natural_key)
    return rows, not_ok, only_a, only_b


def no_bound_reason(a: R.Results, b: R.Results) -> Optional[str]:
    missing = ["{} ({})".format(r.device_label, r.path) for r in (a, b)
               if r.ceiling("gemm_bf16_tflops") is None or r.ceiling("copy_gbps") is None]
    if missing:
        return ("no measured bf16 GEMM and copy ceilings (context.ceilings) in the file of {}, so speed-ups are not "
                "explained by bounds; re-run with a current flashbench (run measures them) or add "
                "'flashbench probe' output".format(" and ".join(missing)))
    return None


def _pct_own_roof(p: R.Point, res: R.Results) -> Optional[float]:
    r = B.roof(res, p.problem.get("dtype"))
    return None if r is None else B.pct_of_roof(p, r)


def plot_pair(a: R.Results, b: R.Results, path: str, normalised: bool, la: str, lb: str) -> str:
    if normalised and (B.roof(a) is None or B.roof(b) is None):
        missing = [r.device_label for r in (a, b) if B.roof(r) is None]
        raise F.Omitted("no measured bf16 GEMM and copy ceilings in the file of {}; run 'flashbench probe'".format(
            " and ".join(missing)))
    fams = []
    for res in (a, b):
        try:
            fams.append(F._line_families(res.points))
        except F.Omitted:
            fams.append(({}, [], 0))
    shown = [f for f in fams[0][1] if f in fams[1][0]] or fams[0][1] or fams[1][1]
    if not shown:
        raise F.Omitted("neither file has a problem family with ok points at two or more sequence lengths")
    plt = F.plt()
    variants = sorted({v for fd in fams for f in shown for v in fd[0].get(f, {})})
    colors = F.colors_for(variants)
    fig, axes = F._grid(len(shown))
    for ax, fam in zip(axes, shown):
        ys_all = []
        for v in variants:
            for res, fd, ls in ((a, fams[0], "-"), (b, fams[1], "--")):
                pts = sorted(fd[0].get(fam, {}).get(v, {}).items())
                pts = [(s, _pct_own_roof(p, res) if normalised else p.tflops) for s, p in pts]
                pts = [(s, y) for s, y in pts if y is not None]
                if not pts:
                    continue
                ys_all += [y for _, y in pts]
                ax.plot([s for s, _ in pts], [y for _, y in pts], linestyle=ls, marker="o" if ls == "-" else "s",
                        color=colors[v], markersize=4)
        F._seqlen_axis(ax)
        F.log_if_wide(ax, ys_all)
        ax.set_ylabel("% of own measured roofline" if normalised else "TFLOP/s")
        ax.set_title(fam, fontsize=9)
    Line2D = plt.Line2D
    handles = [Line2D([], [], color=colors[v], lw=2) for v in variants]
    labels = list(variants)
    handles += [Line2D([], [], color="0.3", ls="-", marker="o"), Line2D([], [], color="0.3", ls="--", marker="s")]
    labels += ["A: " + la, "B: " + lb]
    F.legend_below(fig, axes, ncols=4, handles=handles, labels=labels)
    F._save(fig, path)
    return ("A ({}) solid, B ({}) dashed; best config per variant on each GPU.".format(la, lb)
            + (" Each GPU is divided by its own measured roofline at the point's minimum bytes: the GEMM rate for "
               "compute-bound points, the copy bandwidth for memory-bound ones." if normalised else ""))


def plot_speedup(rows: List[Row], a: R.Results, b: R.Results, path: str, tolerance: float, la: str, lb: str) -> str:
    """Measured speed-up against arithmetic intensity, over the speed-up the ceilings predict at each intensity."""
    rows = [r for r in rows if r.predicted]
    if not rows:
        raise F.Omitted("no point timed ok on both GPUs has FLOPs and bytes_min with both GPUs' ceilings")
    plt = F.plt()
    fig = F._figure(10, 5.5)
    ax = fig.subplots()
    ra, rb = B.roof(a), B.roof(b)
    ai = [r.intensity for r in rows]
    lo = min(min(ai), ra.ridge, rb.ridge) / 3
    hi = max(max(ai), ra.ridge, rb.ridge) * 3
    xs = [lo * (hi / lo) ** (i / 300) for i in range(301)]
    pred = [ra.time_us(x, 1.0) / rb.time_us(x, 1.0) for x in xs]  # flops = x FLOPs on 1 byte
    curve = ax.plot(xs, pred, "k-", lw=1.5)[0]
    band = ax.fill_between(xs, [tolerance * y for y in pred], pred, color="0.85", lw=0)
    ridges = []
    for r, label, ls in ((ra, "A", ":"), (rb, "B", "-.")):
        ridges.append(ax.axvline(r.ridge, color="0.4", ls=ls, lw=1))
    variants = sorted({r.a.variant for r in rows})
    colors = F.colors_for(variants)
    for v in variants:
        sel = [r for r in rows if r.a.variant == v]
        ax.scatter([r.intensity for r in sel], [r.speedup for r in sel], color=colors[v], s=36, zorder=3,
                   marker="o")
    flagged = [r for r in rows if r.flagged(tolerance)]
    ring = None
    if flagged:
        ring = ax.scatter([r.intensity for r in flagged], [r.speedup for r in flagged], s=130, facecolors="none",
                          edgecolors="red", linewidths=1.5, zorder=4)
    ax.set_xscale("log")
    F.plain_log_labels(ax, "x")
    F.log_if_wide(ax, [r.speedup for r in rows] + pred)
    ax.set_xlabel("arithmetic intensity (FLOPs / bytes_min)")
    ax.set_ylabel("B speed-up over A (A time / B time)")
    ax.grid(True, which="both", alpha=0.3)
    Line2D = plt.Line2D
    handles = [Line2D([], [], ls="", marker="o", color=colors[v]) for v in variants]
    labels = list(variants)
    handles += [curve, band, ridges[0], ridges[1]]
    labels += ["predicted: ratio of roofline times", "within {:.0f}% of the prediction".format(100 * tolerance),
               "A ridge {:.0f} FLOP/B".format(ra.ridge), "B ridge {:.0f} FLOP/B".format(rb.ridge)]
    if ring is not None:
        handles.append(ring)
        labels.append("gains < {:.0f}% of its bound".format(100 * tolerance))
    F.legend_right(fig, ax, handles, labels)
    F._save(fig, path)
    return ("Each point's measured speed-up of B ({}) over A ({}) against its arithmetic intensity. The line is the "
            "speed-up the measured ceilings predict: the copy-bandwidth ratio ({:.2f}×) left of the ridges, the bf16 "
            "GEMM ratio ({:.2f}×) right of them. Circled points gain less than {:.0f}% of their prediction. e4m3 "
            "points are drawn against the bf16 line; their own prediction is in the table.".format(
                lb, la, rb.gbps / ra.gbps, rb.tflops / ra.tflops, 100 * tolerance))


def summary_by_variant(rows: List[Row], tolerance: float) -> List[list]:
    by = defaultdict(list)
    for r in rows:
        by[r.a.variant].append(r)
    out = []
    for v in sorted(by):
        rs = by[v]
        gains = [r.gain for r in rs if r.gain is not None]
        kinds = defaultdict(int)
        for r in rs:
            kinds[r.bound or "unknown"] += 1
        out.append([v, len(rs), ", ".join("{} {}".format(n, k) for k, n in sorted(kinds.items())),
                    "{:.2f}×".format(statistics.median(r.speedup for r in rs)),
                    "" if not gains else "{:.2f}×".format(statistics.median(r.predicted for r in rs if r.predicted)),
                    "" if not gains else "{:.0f}%".format(100 * statistics.median(gains)),
                    "" if not gains else "{:.0f}%".format(100 * min(gains)),
                    sum(r.flagged(tolerance) for r in rs)])
    return out


def point_rows(rows: List[Row], tolerance: float) -> List[list]:
    out = []
    for r in rows:
        flag = "" if r.gain is None else ("below bound" if r.flagged(tolerance) else
                                          "above bound" if r.gain > 1 / tolerance else "as bound")
        out.append([r.a.name, "{:.2f}".format(r.a.median_us), "{:.2f}".format(r.b.median_us),
                    _fmt(r.a.tflops), _fmt(r.b.tflops),
                    "" if r.intensity is None else "{:.0f}".format(r.intensity), r.bound, r.bound_by,
                    "" if r.predicted is None else "{:.2f}×".format(r.predicted), "{:.2f}×".format(r.speedup),
                    "" if r.gain is None else "{:.0f}%".format(100 * r.gain), flag])
    return out


POINT_HEADERS = ["point", "A µs", "B µs", "A TFLOP/s", "B TFLOP/s", "FLOP/B (min bytes)", "bound", "predicted by",
                 "predicted B/A", "measured B/A", "measured / predicted", "verdict"]
SUMMARY_HEADERS = ["variant", "points", "bound", "median measured B/A", "median predicted B/A",
                   "median measured / predicted", "worst", "below bound"]


def build(path_a: str, path_b: str, out_dir: str, embed: bool = True, tolerance: float = DEFAULT_TOLERANCE) -> str:
    if not 0 < tolerance <= 1:
        raise R.UserError("--tolerance {} is outside (0, 1]; give the fraction of the predicted speed-up a point "
                          "must reach, e.g. 0.9".format(tolerance))
    a, b = R.load(path_a), R.load(path_b)
    la, lb = a.device_label, b.device_label
    if la == lb:
        la, lb = la + " (A)", lb + " (B)"
    rows, not_ok, only_a, only_b = match(a, b)
    fig_dir = os.path.join(out_dir, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    made, omitted = [], []
    why_no_bound = no_bound_reason(a, b)
    path = os.path.join(fig_dir, "bringup_speedup.png")
    try:
        if why_no_bound:
            raise F.Omitted(why_no_bound)
        made.append(("Speed-up against the bound", path, plot_speedup(rows, a, b, path, tolerance, la, lb)))
    except F.Omitted as e:
        omitted.append(("Speed-up against the bound", str(e)))
    for title, stem, norm in (("Absolute TFLOP/s", "bringup_abs", False),
                              ("Normalised by each GPU's measured roofline", "bringup_norm", True)):
        path = os.path.join(fig_dir, stem + ".png")
        try:
            made.append((title, path, plot_pair(a, b, path, norm, la, lb)))
        except F.Omitted as e:
            omitted.append((title, str(e)))

    ra, rb = B.roof(a), B.roof(b)
    flagged = [r for r in rows if r.flagged(tolerance)]
    summary = summary_by_variant(rows, tolerance)
    prows = point_rows(rows, tolerance)
    n_common = len(rows) + len(not_ok)
    if why_no_bound:
        explain = "Speed-ups are not explained: " + why_no_bound + "."
    else:
        explain = (
            "How each speed-up is explained: a point's arithmetic intensity is its FLOPs over bytes_min (Q, K, V read "
            "once, the output written once). A GPU's ridge point is its measured GEMM rate over its measured copy "
            "bandwidth: A {:.0f} TFLOP/s / {:.0f} GB/s = {:.0f} FLOP/B, B {:.0f} TFLOP/s / {:.0f} GB/s = {:.0f} FLOP/B. "
            "Above both ridges a point is compute-bound and B should be {:.2f}× A (the GEMM ratio); below both it is "
            "memory-bound and B should be {:.2f}× A (the copy ratio); between them the prediction is the ratio of the "
            "two roofline times. A point is flagged when it gains less than {:.0f}% of its prediction: {} of {} "
            "points.".format(ra.tflops, ra.gbps, ra.ridge, rb.tflops, rb.gbps, rb.ridge, rb.tflops / ra.tflops,
                             rb.gbps / ra.gbps, 100 * tolerance, len(flagged), len(rows)))

    body = ["<p>A = {} ({}), B = {} ({}). {} points in both, {} timed ok on both; {} only in A, {} only in B.</p>"
            .format(page.esc(la), page.esc(os.path.basename(path_a)), page.esc(lb), page.esc(os.path.basename(path_b)), n_common,
                    len(rows),
                    len(only_a), len(only_b)),
            "<h2>Devices</h2>", page.table(["", "A: " + la, "B: " + lb], device_rows([a, b])),
            "<h2>Speed-up against the ratio of measured ceilings</h2>", "<p>{}</p>".format(page.esc(explain))]
    if summary:
        body += ["<h3>Per variant</h3>", page.table(SUMMARY_HEADERS, summary, (1, 3, 4, 5, 6, 7))]
    if flagged:
        body += ["<h3>Points that gain less than their bound predicts</h3>",
                 page.table(["point", "bound", "predicted B/A", "measured B/A", "measured / predicted"],
                            [[r.a.name, r.bound, "{:.2f}×".format(r.predicted), "{:.2f}×".format(r.speedup),
                              "{:.0f}%".format(100 * r.gain)] for r in sorted(flagged, key=lambda r: r.gain)],
                            (2, 3, 4), wrap=(0,))]
    for title, path, cap in made:
        body += ["<h2>{}</h2>".format(page.esc(title)), page.figure(path, cap, embed, out_dir)]
    body += ["<h2>Points timed on both</h2>",
             page.table(POINT_HEADERS, prows, (1, 2, 3, 4, 5, 8, 9, 10), wrap=(0,)) if prows else
             "<p>No point is ok on both GPUs.</p>"]
    if not_ok:
        body += ["<h2>Points not ok on one or both</h2>", page.table(["point", "A", "B", "reason"], not_ok,
                                                                     wrap=(0, 3))]
    if only_a or only_b:
        body += ["<h2>Points on one GPU only</h2>",
                 page.table(["point", "only in"], [[n, "A"] for n in only_a] + [[n, "B"] for n in only_b], wrap=(0,))]
    body += ["<h2>Figures omitted</h2>", page.omitted_list(omitted)]
    R.write_text_atomic(os.path.join(out_dir, "index.html"),
                        page.render("flashbench bring-up: {} vs {}".format(la, lb), body))

    md = ["# flashbench bring-up: A = {} vs B = {}".format(la, lb), "",
          "| device fact | A | B |", "|---|---|---|"]
    md += ["| {} | {} | {} |".format(*r) for r in device_rows([a, b])]
    md += ["", explain, ""]
    if summary:
        md += ["| " + " | ".join(SUMMARY_HEADERS) + " |", "|---|" + "---:|" * (len(SUMMARY_HEADERS) - 1)]
        md += ["| {} |".format(" | ".join(str(c) for c in r)) for r in summary]
        md.append("")
    md += ["| " + " | ".join(POINT_HEADERS) + " |", "|---|" + "---:|" * 5 + "---|---|" + "---:|" * 3 + "---|"]
    md += ["| `{}` | {} |".format(r[0], " | ".join(r[1:])) for r in prows]
    if not_ok:
        md += ["", "Not ok on one or both:"] + ["- `{}`: A {}, B {}: {}".format(*r) for r in not_ok]
    R.write_text_atomic(os.path.join(out_dir, "bringup.md"), "\n".join(md) + "\n")
    return os.path.join(out_dir, "index.html")
