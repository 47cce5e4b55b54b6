"""html: one or more results files -> DIR/index.html (self-contained), DIR/figures/*.png, DIR/summary.md.

parse (results.load) -> collect (figures that the data supports, tables) -> render (page) -> main.
"""
from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from typing import Dict, List, Optional, Tuple

from . import figures as F
from . import page
from . import results as R
from . import traffic as T

MAX_HEATMAPS = 8
MAX_STATUS_ROWS = 500


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "-", s).strip("-")[:80] or "x"


def _bus_id(x) -> Optional[Tuple[int, int, int, int]]:
    """A PCI bus id as (domain, bus, device, function): CUDA writes 0000:18:00.0, NVML 00000000:18:00.0."""
    m = re.fullmatch(r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)\s*", str(x or ""))
    return None if not m else tuple(int(g or "0", 16) for g in m.groups())


def device_identity(r: R.Results) -> Tuple[Optional[str], Optional[str], Optional[tuple]]:
    """(GPU model, host, PCI bus id) of a results file; None where the file does not say."""
    d = r.device
    model = d.get("slug") or d.get("name")
    host = r.context.get("host_name")
    return (str(model) if model else None, str(host) if host else None, _bus_id(d.get("pci_bus_id")))


def group_by_device(files: List[R.Results]) -> List[List[R.Results]]:
    """Files -> one list per GPU, in the order first seen. Files join a group when the GPU model, host and PCI bus
    id agree. Raises UserError when it cannot tell: a file without a device while several are given, or a file that
    lacks the host or bus id that another file of the same model has (same GPU or a second card?)."""
    if len(files) == 1:
        return [files]
    ids = []
    for r in files:
        model, host, bus = device_identity(r)
        if model is None:
            raise R.UserError("{}: no device in context (context.device.slug or name), so its points cannot be "
                              "placed with the GPU they ran on; report it alone (flashbench-report html {} -o DIR) "
                              "or re-run it with a current flashbench".format(r.path, r.path))
        ids.append((model, host, bus))
    for i, (model, host, bus) in enumerate(ids):
        for j, (m2, h2, b2) in enumerate(ids):
            if m2 != model or i == j:
                continue
            for what, a, b in (("host_name", host, h2), ("device.pci_bus_id", bus, b2)):
                if a is None and b is not None:
                    raise R.UserError("{}: context.{} is missing while {} (also {}) has one, so it cannot tell "
                                      "whether both ran on the same GPU; report them separately".format(
                                          files[i].path, what, files[j].path, model))
    groups: Dict[tuple, List[R.Results]] = {}
    for r, ident in zip(files, ids):
        groups.setdefault(ident, []).append(r)
    return list(groups.values())


def group_labels(groups: List[List[R.Results]]) -> List[str]:
    """A section name per group: the GPU name, plus the host and then the bus id where two groups share a name."""
    names = [g[0].device_label for g in groups]
    labels = []
    for g, name in zip(groups, names):
        label = name
        if names.count(name) > 1:
            same = [h for h, n in zip(groups, names) if n == name]
            host = g[0].context.get("host_name")
            if len({x[0].context.get("host_name") for x in same}) == len(same) and host:
                label = "{} on {}".format(name, host)
            else:
                label = "{} on {} at PCI {}".format(name, host or "?", g[0].device.get("pci_bus_id") or "?")
        labels.append(label)
    return labels


def merge(files: List[R.Results]) -> R.Results:
    """Several files (e.g. a sweep and peers.py output) of one GPU -> one point list. The first file with
    ceilings lends its context; points of the same name in a later file replace earlier ones."""
    ctx = next((r.context for r in files if r.ceilings), files[0].context)
    by_name = {}
    for r in files:
        for p in r.points:
            by_name[p.name] = p
    return R.Results(path=", ".join(r.path for r in files), context=ctx, points=list(by_name.values()))


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
    bad_sorted = sorted(bad, key=lambda p: (order.get(p.status, 0), F.natural_key(p.name)))
    rows = [[p.status, p.name, p.reason,
             "" if p.num("max_error") is None else "{:.3g}".format(p.num("max_error"))] for p in bad_sorted[:MAX_STATUS_ROWS]]
    parts.append("<details><summary>all {} points</summary>{}</details>".format(
        len(bad), page.table(["status", "point", "reason", "max error"], rows, (3,), wrap=(1,))))
    if len(bad) > MAX_STATUS_ROWS:
        parts.append("<p class='muted'>first {} shown</p>".format(MAX_STATUS_ROWS))
    return "\n".join(parts), bad


def best_table(points: List[R.Point]) -> List[list]:
    """One row per problem: the fastest variant (best config) and the runner-up. Rows in natural order of the
    problem key (b2 before b16)."""
    best = R.best_per_variant(points)
    by_key = defaultdict(list)
    for (v, k), p in best.items():
        by_key[k].append(p)
    rows = []
    for k in sorted(by_key, key=F.natural_key):
        ps = sorted(by_key[k], key=lambda p: p.median_us)
        w = ps[0]
        runner = ps[1] if len(ps) > 1 else None
        rows.append([k, w.variant, w.config_str, _fmt(w.tflops), "{:.2f}".format(w.median_us),
                     "" if runner is None else "{} ({:.2f}×)".format(runner.variant, runner.median_us / w.median_us)])
    return rows


MODEL_TOLERANCE = T.TOLERANCE  # |measured / model - 1| beyond which a traffic model is listed (model_check's)


def _mb(x: Optional[float]) -> str:
    return "" if x is None else "{:.1f}".format(x / 1e6)


def _size(x: float) -> str:
    return "{:.1f} MB".format(x / 1e6) if x >= 1e6 else "{:.1f} kB".format(x / 1e3)


def traffic_section(points: List[R.Point]) -> Tuple[str, List[str]]:
    """Measured DRAM bytes against bytes_min and the traffic model, per point with counters: (html, markdown lines).
    Lists every point below bytes_min (its output still in L2 when the kernel ends) and every point whose model is
    off by more than MODEL_TOLERANCE, with the record's bytes_model_reason where the variant gives one and whether
    that reason covers the measurement (traffic.py: the measured bytes inside the range the reason gives)."""
    with_counters = [p for p in points if p.ok and p.measured_dram_bytes()]
    if not with_counters:
        msg = "No ok point has measured DRAM bytes (counters were not collected), so no traffic model is checked."
        return "<p class='muted'>{}</p>".format(msg), [msg]
    below = sorted([p for p in with_counters if p.num("bytes_min") and p.measured_dram_bytes() < p.num("bytes_min")],
                   key=lambda p: F.natural_key(p.name))
    modelled = [p for p in with_counters if p.num("bytes_model")]
    verdicts = {p.name: T.verdict(p.measured_dram_bytes(), p.num("bytes_model"), p.get("bytes_model_range"),
                                  MODEL_TOLERANCE) for p in modelled}
    off = sorted([p for p in modelled if verdicts[p.name] != T.WITHIN], key=lambda p: F.natural_key(p.name))
    html, md = [], []
    intro = ("{} ok points have measured DRAM bytes (counters: read + write). bytes_min counts Q, K and V read once "
             "and O and LSE written once.".format(len(with_counters)))
    html.append("<p>{}</p>".format(page.esc(intro)))
    md.append(intro)
    if below:
        why = ("{} of them moved fewer bytes than bytes_min. L2 is write-back: when the kernel ends, the last lines of "
               "its output are still dirty in L2, and their write to DRAM happens after the counters stop (when a "
               "later kernel or the next flush evicts them). The shortfall below is that output still in L2; a "
               "shortfall in reads instead would mean inputs were already in L2 (no cold flush). The traffic "
               "models count it (the usable L2 keeps the last lines the kernel moved, the written ones in "
               "proportion; all of them when everything moved fits), and each point's model regime says how "
               "much.".format(len(below)))
        rows = []
        for p in below:
            meas, mn = p.measured_dram_bytes(), p.num("bytes_min")
            rows.append([p.name, _mb(mn), _mb(p.num("counters", "dram_read_bytes")),
                         _mb(p.num("counters", "dram_write_bytes")), "{:.3f}".format(meas / mn), _size(mn - meas),
                         "{} of output write-back still in L2 at kernel end".format(_size(mn - meas)),
                         str(p.get("bytes_model_reason") or "no model regime recorded")])
        html += ["<h4>Measured below bytes_min</h4>", "<p>{}</p>".format(page.esc(why)),
                 page.table(["point", "bytes_min MB", "read MB", "write MB", "measured / min", "short by",
                             "why", "model regime"], rows, (1, 2, 3, 4, 5), wrap=(0, 7))]
        md += ["", "Measured below bytes_min: " + why, "",
               "| point | bytes_min MB | measured MB | measured / min | why |", "|---|---:|---:|---:|---|"]
        md += ["| `{}` | {} | {} | {} | {} |".format(r[0], r[1], _mb(p.measured_dram_bytes()), r[4], r[6])
               for r, p in zip(rows, below)]
    else:
        line = "No point moved fewer bytes than bytes_min."
        html.append("<p>{}</p>".format(line))
        md.append(line)
    if not modelled:
        line = "No point with counters has a traffic model (bytes_model)."
        html.append("<p>{}</p>".format(line))
        md += ["", line]
    elif off:
        explained = sum(verdicts[p.name] == T.EXPLAINED for p in off)
        head = ("{} of {} modelled points are more than {:.0f}% off their variant's traffic model "
                "(measured / model outside {:.2f}-{:.2f}); {} of them lie in the range their model's reason "
                "gives for an uncertain regime.".format(len(off), len(modelled), 100 * MODEL_TOLERANCE,
                                                        1 - MODEL_TOLERANCE, 1 + MODEL_TOLERANCE, explained))

        def rng(p):
            r = T.model_range(p.get("bytes_model_range"))
            return "{}-{}".format(_mb(r[0]), _mb(r[1])) if r else ""

        rows = [[p.name, _mb(p.num("bytes_model")), rng(p), _mb(p.measured_dram_bytes()),
                 "{:.2f}".format(p.measured_dram_bytes() / p.num("bytes_model")),
                 "explained" if verdicts[p.name] == T.EXPLAINED else "not explained",
                 str(p.get("bytes_model_reason") or "no reason recorded")] for p in off]
        per_variant = Counter(p.variant for p in off)
        html += ["<h4>Traffic model off by more than {:.0f}%</h4>".format(100 * MODEL_TOLERANCE),
                 "<p>{} By variant: {}.</p>".format(page.esc(head), page.esc(", ".join(
                     "{} {}".format(v, n) for v, n in sorted(per_variant.items())))),
                 page.table(["point", "model MB", "range MB", "measured MB", "measured / model", "verdict",
                             "reason"], rows, (1, 2, 3, 4), wrap=(0, 6))]
        md += ["", head, "", "| point | model MB | range MB | measured MB | measured / model | verdict | reason |",
               "|---|---:|---:|---:|---:|---|---|"]
        md += ["| `{}` | {} | {} | {} | {} | {} | {} |".format(*r) for r in rows]
    else:
        line = "All {} modelled points are within {:.0f}% of their traffic model.".format(len(modelled),
                                                                                      100 * MODEL_TOLERANCE)
        html.append("<p>{}</p>".format(line))
        md += ["", line]
    return "\n".join(html), md


FIGURE_SPECS = [
    ("TFLOP/s vs sequence length", "tflops_vs_seqlen", F.fig_tflops_vs_seqlen),
    ("Percent of measured roofline", "pct_of_ceiling", F.fig_pct_of_ceiling),
    ("Roofline", "roofline", F.fig_roofline),
    ("HBM bytes: measured vs model vs minimum", "hbm_bytes", F.fig_hbm_bytes),
    ("Occupancy: achieved vs theoretical", "occupancy", F.fig_occupancy),
    ("fa2_q_outer: split-Q vs split-K", "split_q_vs_split_k", F.fig_split_q_vs_k),
]


def device_section(res: R.Results, fig_dir: str, prefix: str, out_dir: str, embed: bool, h: str = "h2"
                   ) -> Tuple[List[str], List[str], List[R.Point]]:
    """One GPU's part of the report: (html parts, markdown lines, points not ok). Figures are written as
    fig_dir/prefix + stem + .png."""
    points = res.points
    made, omitted = [], []
    for title, stem, fn in FIGURE_SPECS:
        path = os.path.join(fig_dir, prefix + stem + ".png")
        try:
            made.append((title, path, fn(points, res, path)))
        except F.Omitted as e:
            omitted.append((title, str(e)))
    groups = F.heatmap_groups(points)
    if not groups:
        omitted.append(("Tile heatmaps", "no variant was swept over two or more block_m and block_n values on one problem"))
    for variant, key in groups[:MAX_HEATMAPS]:
        path = os.path.join(fig_dir, "{}heatmap_{}_{}.png".format(prefix, _slug(variant), _slug(key)))
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
    traffic_html, traffic_md = traffic_section(points)
    n_ok = sum(p.ok for p in points)
    body = ["<p>{} points from {}: {} ok, {} not ok; {} variants ({} peers).</p>".format(
        len(points), page.esc(res.path), n_ok, len(bad), len({p.variant for p in points}),
        len({p.variant for p in points if p.is_peer}))]
    body += ["<{0}>Device</{0}>".format(h), page.table(["", res.device_label], device_rows([res]))]
    body += ["<{0}>Best variant per problem</{0}>".format(h),
             page.table(["problem", "fastest", "config", "TFLOP/s", "median µs", "runner-up (slower by)"],
                        best_rows, (3, 4), wrap=(0, 2)) if best_rows else "<p>No ok points.</p>"]
    for title, path, caption in made:
        body += ["<{0}>{1}</{0}>".format(h, page.esc(title)), page.figure(path, caption, embed, out_dir)]
    body += ["<{0}>DRAM traffic: measured vs minimum and model</{0}>".format(h), traffic_html]
    body += ["<{0}>Points not ok (skipped, incorrect, crashed, timeout)</{0}>".format(h), status_html]
    body += ["<{0}>Figures omitted</{0}>".format(h), page.omitted_list(omitted)]

    md = ["{} points from {}: {} ok, {} not ok ({}).".format(len(points), res.path, n_ok, len(bad), ", ".join(
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
    md += [""] + traffic_md
    if bad:
        md += ["", "Not ok:"] + ["- {} `{}`: {}".format(p.status, p.name, p.reason) for p in bad[:30]]
        if len(bad) > 30:
            md.append("- … {} more in index.html".format(len(bad) - 30))
    return body, md, bad


def build(paths: List[str], out_dir: str, embed: bool = True) -> str:
    """Every input is read and grouped by GPU before anything is written: a refusal leaves no output."""
    files = [R.load(p) for p in paths]
    groups = group_by_device(files)
    labels = group_labels(groups)
    merged = [merge(g) for g in groups]
    fig_dir = os.path.join(out_dir, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    src = ", ".join(paths)
    if len(merged) == 1:
        res, label = merged[0], labels[0]
        body, md_dev, _ = device_section(res, fig_dir, "", out_dir, embed)
        title = "flashbench report: {}".format(label)
        md = ["# flashbench summary: {}".format(label), ""] + md_dev
    else:
        anchors = ["dev{}-{}".format(i + 1, _slug(l)) for i, l in enumerate(labels)]
        body = ["<p>{} results files from {} GPUs, one section each, each against its own measured ceilings; "
                "'flashbench-report bringup A.json B.json' compares two GPUs point by point.</p>".format(
                    len(files), len(merged)),
                "<ul>" + "".join("<li><a href='#{}'>{}</a>: {}</li>".format(a, page.esc(l), page.esc(r.path))
                                 for a, l, r in zip(anchors, labels, merged)) + "</ul>"]
        md = ["# flashbench summary: {} GPUs".format(len(merged)), ""]
        for i, (res, label, anchor) in enumerate(zip(merged, labels, anchors)):
            part, md_dev, _ = device_section(res, fig_dir, "{}_".format(anchor), out_dir, embed, h="h3")
            body += ["<h2 id='{}'>{}</h2>".format(anchor, page.esc(label))] + part
            md += ["## {}".format(label), ""] + md_dev + [""]
        title = "flashbench report: {}".format(" | ".join(labels))
    html_text = page.render(title, body, subtitle="generated by flashbench-report from {}".format(src))
    R.write_text_atomic(os.path.join(out_dir, "index.html"), html_text)
    R.write_text_atomic(os.path.join(out_dir, "summary.md"), "\n".join(md) + "\n")
    return os.path.join(out_dir, "index.html")
