"""html: one or more results files -> DIR/index.html (self-contained), DIR/figures/*.png, DIR/summary.md.

parse (results.load) -> collect (figures that the data supports, tables) -> render (page) -> main.
"""
from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from typing import List, Optional, Tuple

from . import figures as F
from . import page
from . import results as R

MAX_HEATMAPS = 8
MAX_STATUS_ROWS = 500


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "-", s).strip("-")[:80] or "x"


def merge(files: List[R.Results]) -> Tuple[R.Results, List[str]]:
    """Several files (e.g. a sweep and peers.py output) of one GPU -> one point list. The first file with
    ceilings lends its context; points of the same name in a later file replace earlier ones."""
    notes = []
    ctx = next((r.context for r in files if r.ceilings), files[0].context)
    slugs = {r.device.get("slug") for r in files if r.device.get("slug")}
    if len(slugs) > 1:
        notes.append("the inputs come from different devices ({}); use 'bringup' to compare GPUs".format(
            ", ".join(sorted(slugs))))
    by_name = {}
    for r in files:
        for p in r.points:
            by_name[p.name] = p
    return R.Results(path=", ".join(r.path for r in files), context=ctx, points=list(by_name.values())), notes


def device_rows(results: List[R.Results]) -> List[list]:
    def g(r: R.Results, *path):
        cur = r.context
        for k in path:
            cur = cur.get(k) if isinstance(cur, dict) else None
        return "" if cur is None else cur

    def gb(x):
        return "{:.1f} GB".format(x / 1e9) if isinstance(x, (int, float)) and x else ""

    def mb(x):
        return "{:.1f} MB".format(x / 1e6) if isinstance(x, (int, float)) and x else ""

    facts = [
        ("GPU", lambda r: g(r, "device", "name")),
        ("compute capability", lambda r: g(r, "device", "cc")),
        ("SMs", lambda r: g(r, "device", "sm_count")),
        ("max SM clock (MHz)", lambda r: g(r, "device", "sm_clock_max_mhz")),
        ("max memory clock (MHz)", lambda r: g(r, "device", "mem_clock_max_mhz")),
        ("memory bus (bits)", lambda r: g(r, "device", "mem_bus_width_bits")),
        ("memory", lambda r: gb(g(r, "device", "total_mem_bytes"))),
        ("L2", lambda r: mb(g(r, "device", "l2_bytes"))),
        ("driver", lambda r: g(r, "device", "driver_version_string") or g(r, "device", "driver_version")),
        ("CUDA runtime", lambda r: g(r, "device", "runtime_version")),
        ("measured bf16 GEMM (TFLOP/s)", lambda r: _fmt(r.ceiling("gemm_bf16_tflops"))),
        ("measured copy (GB/s, read+write)", lambda r: _fmt(r.ceiling("copy_gbps"))),
        ("SM clock during probe (MHz)", lambda r: g(r, "ceilings", "sm_clock_mhz")),
        ("timed load (timing.queue)", lambda r: r.timing_queue),
        ("host", lambda r: g(r, "host_name")),
        ("date", lambda r: g(r, "date")),
        ("flashbench", lambda r: " ".join(str(x) for x in (g(r, "flashbench", "version"), g(r, "flashbench", "git_sha"),
                                                            g(r, "flashbench", "build_type")) if x)),
    ]
    return [[label] + [fn(r) for r in results] for label, fn in facts]


def _fmt(x: Optional[float], digits: int = 1) -> str:
    return "" if x is None else "{:.{}f}".format(x, digits)


def status_section(points: List[R.Point]) -> Tuple[str, List[R.Point]]:
    bad = [p for p in points if p.status != R.OK]
    if not bad:
        return "<p>Every point is ok.</p>", bad
    counts = Counter((p.status, p.reason or "(no reason given)") for p in bad)
    parts = ["<p>{} of {} points are not ok.</p>".format(len(bad), len(points)),
             page.table(["status", "reason", "points"], [[s, r, n] for (s, r), n in counts.most_common()], (2,))]
    order = {"crashed": 0, "incorrect": 1, "timeout": 2, "skipped": 3}
    bad_sorted = sorted(bad, key=lambda p: (order.get(p.status, 0), p.name))
    rows = [[p.status, p.name, p.reason,
             "" if p.num("max_error") is None else "{:.3g}".format(p.num("max_error"))] for p in bad_sorted[:MAX_STATUS_ROWS]]
    parts.append("<details><summary>all {} points</summary>{}</details>".format(
        len(bad), page.table(["status", "point", "reason", "max error"], rows)))
    if len(bad) > MAX_STATUS_ROWS:
        parts.append("<p class='muted'>first {} shown</p>".format(MAX_STATUS_ROWS))
    return "\n".join(parts), bad


def best_table(points: List[R.Point]) -> List[list]:
    best = R.best_per_variant(points)
    by_key = defaultdict(list)
    for (v, k), p in best.items():
        by_key[k].append(p)
    rows = []
    for k in sorted(by_key, key=lambda k: (R.family_key(by_key[k][0].problem), R.seqlen_of(by_key[k][0].problem) or 0)):
        ps = sorted(by_key[k], key=lambda p: p.median_us)
        w = ps[0]
        runner = ps[1] if len(ps) > 1 else None
        rows.append([k, w.variant, w.config_str, _fmt(w.tflops), "{:.2f}".format(w.median_us),
                     "" if runner is None else "{} ({:.2f}×)".format(runner.variant, runner.median_us / w.median_us)])
    return rows


def build(paths: List[str], out_dir: str, embed: bool = True) -> str:
    files = [R.load(p) for p in paths]
    res, notes = merge(files)
    points = res.points
    fig_dir = os.path.join(out_dir, "figures")
    os.makedirs(fig_dir, exist_ok=True)

    specs = [
        ("TFLOP/s vs sequence length", "tflops_vs_seqlen", F.fig_tflops_vs_seqlen),
        ("Percent of measured ceiling", "pct_of_ceiling", F.fig_pct_of_ceiling),
        ("Roofline", "roofline", F.fig_roofline),
        ("HBM bytes: measured vs model vs minimum", "hbm_bytes", F.fig_hbm_bytes),
        ("Occupancy: achieved vs theoretical", "occupancy", F.fig_occupancy),
        ("fa2_q_outer: split-Q vs split-K", "split_q_vs_split_k", F.fig_split_q_vs_k),
    ]
    made, omitted = [], []
    for title, stem, fn in specs:
        path = os.path.join(fig_dir, stem + ".png")
        try:
            made.append((title, path, fn(points, res, path)))
        except F.Omitted as e:
            omitted.append((title, str(e)))
    groups = F.heatmap_groups(points)
    if not groups:
        omitted.append(("Tile heatmaps", "no variant was swept over two or more block_m and block_n values on one problem"))
    for variant, key in groups[:MAX_HEATMAPS]:
        path = os.path.join(fig_dir, "heatmap_{}_{}.png".format(_slug(variant), _slug(key)))
        try:
            made.append(("Tile heatmap: {} on {}".format(variant, key), path,
                         F.fig_heatmap(points, res, path, variant, key)))
        except F.Omitted as e:
            omitted.append(("Tile heatmap", str(e)))
    if len(groups) > MAX_HEATMAPS:
        omitted.append(("Tile heatmaps", "{} more tuning sweeps not drawn (limit {})".format(
            len(groups) - MAX_HEATMAPS, MAX_HEATMAPS)))

    status_html, bad = status_section(points)
    best_rows = best_table(points)
    n_ok = sum(p.ok for p in points)
    body = ["<p>{} points from {}: {} ok, {} not ok; {} variants ({} peers).</p>".format(
        len(points), page.esc(res.path), n_ok, len(bad), len({p.variant for p in points}),
        len({p.variant for p in points if p.is_peer}))]
    body += ["<p class='bad'>Note: {}</p>".format(page.esc(n)) for n in notes]
    body += ["<h2>Device</h2>", page.table(["", res.device_label], device_rows([res]))]
    body += ["<h2>Best variant per problem</h2>",
             page.table(["problem", "fastest", "config", "TFLOP/s", "median µs", "runner-up (slower by)"],
                        best_rows, (3, 4)) if best_rows else "<p>No ok points.</p>"]
    for title, path, caption in made:
        body += ["<h2>{}</h2>".format(page.esc(title)), page.figure(path, caption, embed, out_dir)]
    body += ["<h2>Points not ok (skipped, incorrect, crashed, timeout)</h2>", status_html]
    body += ["<h2>Figures omitted</h2>", page.omitted_list(omitted)]
    html_text = page.render("flashbench report: {}".format(res.device_label), body,
                            subtitle="generated by flashbench-report from {}".format(res.path))
    R.write_text_atomic(os.path.join(out_dir, "index.html"), html_text)

    md = ["# flashbench summary: {}".format(res.device_label), "",
          "{} points: {} ok, {} not ok ({}).".format(len(points), n_ok, len(bad), ", ".join(
              "{} {}".format(n, s) for s, n in Counter(p.status for p in bad).most_common()) or "none"), ""]
    if res.ceilings:
        md += ["Measured ceilings: {} TFLOP/s bf16 GEMM, {} GB/s copy.".format(
            _fmt(res.ceiling("gemm_bf16_tflops")), _fmt(res.ceiling("copy_gbps"))), ""]
    if best_rows:
        md += ["| problem | fastest | config | TFLOP/s | median µs |", "|---|---|---|---:|---:|"]
        md += ["| {} | {} | {} | {} | {} |".format(*r[:5]) for r in best_rows[:40]]
        md.append("")
    md += ["Figures: {}.".format(", ".join(t for t, _, _ in made) or "none")]
    if omitted:
        md += ["", "Omitted:"] + ["- {}: {}".format(t, w) for t, w in omitted]
    if bad:
        md += ["", "Not ok:"] + ["- {} `{}`: {}".format(p.status, p.name, p.reason) for p in bad[:30]]
        if len(bad) > 30:
            md.append("- … {} more in index.html".format(len(bad) - 30))
    R.write_text_atomic(os.path.join(out_dir, "summary.md"), "\n".join(md) + "\n")
    return os.path.join(out_dir, "index.html")
