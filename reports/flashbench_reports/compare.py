"""compare: per-point change between a baseline and a current results file (unpaired), as a CI-comment table.

parse (results.load) -> collect (rows with a verdict each) -> render (Markdown) -> main (exit code).

Two runs of one build on two hosts of a pool differ by a few percent per point (host-to-host drift), and with
~1000 samples a side any steady offset is "significant". So a regression here needs a change beyond the floor AND
T_MIN times the between-run spread (stats.decide): the spread learned from history for that GPU model and point
(--history), else the spread of this pair's own per-point changes. Where the files say they come from different
hosts and history cannot supply a spread, a change beyond the floor is "needs paired run" and compare exits 3:
only a paired run (scripts/nightly.sh) can give that verdict. A point that missed its noise target in either run
is "unknown" beyond the floor, never a regression on its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

from . import machine as M
from . import results as R
from . import stats as S
from .stats import Change, decide

FAIL_KINDS = ("regression", "now failing")
EXIT_OK, EXIT_FAIL, EXIT_NEEDS_PAIRED = 0, 1, 3


@dataclass
class Row:
    name: str
    kind: str  # regression | now failing | improvement | unchanged | unknown | needs paired run | added | removed
    #            | fixed | now skipped | still not ok
    base_status: Optional[str]
    cur_status: Optional[str]
    change: Optional[Change] = None
    note: str = ""


@dataclass
class Context:
    """What the verdicts were decided with, for the table's header."""
    relation: str  # machine.SAME | DIFFERENT | UNKNOWN
    relation_why: str
    run_spread: Optional[float]  # the pair's own spread (None: too few clean points, or not used)
    history_points: int  # points whose spread came from history


def _clean(p: R.Point) -> bool:
    return p.ok and not p.noisy


def collect(base: R.Results, cur: R.Results, threshold: float, alpha: float, z_min: float = S.T_MIN,
            history_spread: Optional[Dict[str, float]] = None, ctx_out: Optional[list] = None) -> List[Row]:
    b, c = base.by_name(), cur.by_name()
    rel, rel_why = M.relation(base.context, cur.context)
    history_spread = history_spread or {}
    # The pair's own spread describes host-to-host drift only when nothing says the hosts differ: between two
    # different hosts it is one draw of that drift, which a per-point history must supply instead.
    own = None
    if rel != M.DIFFERENT:
        own = S.run_spread([math.log(c[n].median_us / b[n].median_us) for n in b
                            if n in c and _clean(b[n]) and _clean(c[n])])
    used_history = 0
    rows: List[Row] = []
    for name in list(b) + [n for n in c if n not in b]:
        bp, cp = b.get(name), c.get(name)
        if bp is None:
            rows.append(Row(name, "added", None, cp.status, note=cp.reason if not cp.ok else ""))
        elif cp is None:
            rows.append(Row(name, "removed", bp.status, None))
        elif bp.ok and cp.ok:
            spread, source = history_spread.get(name), "history"
            if spread is not None:
                used_history += 1
            else:
                spread, source = own, "this pair's"
            ch = decide(bp.median_us, cp.median_us, bp.samples_us, cp.samples_us, bp.cv, cp.cv, threshold, alpha,
                        base_noisy=bp.noisy, cur_noisy=cp.noisy, spread=spread, spread_from=source,
                        needs_spread=rel == M.DIFFERENT, z_min=z_min)
            notes = ["noise target not met"] if (bp.noisy or cp.noisy) and ch.verdict != "unknown" else []
            if ch.verdict in ("regression", "improvement"):
                src = R.SOURCES_NOTE.get(R.sources_verdict(cp.variant, base.variant_sources, cur.variant_sources))
                notes += [src] if src else []
            rows.append(Row(name, ch.verdict, bp.status, cp.status, ch, "; ".join(notes)))
        elif bp.ok and not cp.ok:
            kind = "now failing" if cp.status in R.FAILED_STATUSES or cp.status not in R.NOT_OK_STATUSES \
                else "now skipped"
            rows.append(Row(name, kind, bp.status, cp.status, note=cp.reason))
        elif cp.ok:
            rows.append(Row(name, "fixed", bp.status, cp.status))
        else:
            rows.append(Row(name, "still not ok", bp.status, cp.status, note=cp.reason))
    if ctx_out is not None:
        ctx_out.append(Context(rel, rel_why, own, used_history))
    return rows


def failed(rows: List[Row]) -> bool:
    return any(r.kind in FAIL_KINDS for r in rows)


def exit_code(rows: List[Row]) -> int:
    """1 on a regression or a point that now fails; else 3 where a change needs a paired run; else 0."""
    if failed(rows):
        return EXIT_FAIL
    if any(r.kind == "needs paired run" for r in rows):
        return EXIT_NEEDS_PAIRED
    return EXIT_OK


def _md(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _pct(x: Optional[float]) -> str:
    return "" if x is None else "{:+.2f}%".format(100 * x)


ORDER = ["regression", "now failing", "needs paired run", "unknown", "improvement", "fixed", "now skipped", "added",
         "removed", "still not ok", "unchanged"]


def render(rows: List[Row], base: R.Results, cur: R.Results, threshold: float, alpha: float,
           z_min: float = S.T_MIN, ctx: Optional[Context] = None) -> str:
    counts: Dict[str, int] = {}
    for r in rows:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    code = exit_code(rows)
    verdict = {EXIT_FAIL: "❌ **FAIL**", EXIT_NEEDS_PAIRED: "⚠️ **NO VERDICT** (different hosts: a verdict needs a "
               "paired run)", EXIT_OK: "✅ **PASS**"}[code]
    out = ["## flashbench compare: {}".format(verdict), ""]
    out.append("Baseline `{}` ({}, {}) → current `{}` ({}, {}). A regression needs a median slowdown beyond {:.1f}% "
               "that stands {:g}× clear of the between-run spread (and of the measurement noise) and is significant "
               "(Mann-Whitney U at α={}); a point that missed its noise target is never a regression on its own."
               .format(base.path, base.device_label, M.host_label(base.context), cur.path, cur.device_label,
                       M.host_label(cur.context), 100 * threshold, z_min, alpha))
    out.append("")
    out.append(", ".join("{} {}".format(counts[k], k) for k in ORDER if k in counts) or "no points")
    if ctx is not None:
        out += ["", "Machines: {}.".format(ctx.relation_why)]
        spread = []
        if ctx.history_points:
            spread.append("history for {} point(s)".format(ctx.history_points))
        if ctx.run_spread is not None:
            spread.append("this pair's per-point spread {:.2f}% elsewhere".format(100 * ctx.run_spread))
        elif ctx.relation == M.DIFFERENT:
            spread.append("none learned elsewhere: the runs are on different hosts; give --history DB, or time "
                          "both builds in one paired run (scripts/nightly.sh)")
        else:
            spread.append("too few clean points to learn one from this pair; measurement noise only")
        out.append("Between-run spread: " + "; ".join(spread) + ".")
    if base.device.get("slug") and cur.device.get("slug") and base.device.get("slug") != cur.device.get("slug"):
        out += ["", "⚠️ The runs are on different devices ({} vs {}); use `bringup` to compare GPUs."
                .format(base.device.get("slug"), cur.device.get("slug"))]
    if base.timing_queue != cur.timing_queue:
        out += ["", "⚠️ The runs were timed under different loads (timing.queue {} vs {}): under a power cap the "
                "clock follows the load, so a change may be the method's, not the code's. Time both with the same "
                "queue.".format(base.timing_queue, cur.timing_queue)]
    out.append("")

    timed = [r for r in rows if r.change is not None and r.kind != "unchanged"]
    timed.sort(key=lambda r: (ORDER.index(r.kind), -abs(r.change.change)))
    if timed:
        out += ["| verdict | point | baseline µs | current µs | change | z | p-value | noise | why |",
                "|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in timed:
            c = r.change
            out.append("| {} | `{}` | {:.2f} | {:.2f} | {} | {} | {} | {} | {} |".format(
                r.kind, _md(r.name), c.base_us, c.cur_us, _pct(c.change),
                "" if c.z is None else "{:.1f}".format(c.z),
                "" if c.p_value is None else "{:.2g}".format(c.p_value),
                "" if c.noise is None else "{:.2f}%".format(100 * c.noise),
                _md(c.why + ("; " + r.note if r.note else ""))))
        out.append("")
    status_rows = [r for r in rows if r.change is None]
    status_rows.sort(key=lambda r: ORDER.index(r.kind) if r.kind in ORDER else 99)
    if status_rows:
        out += ["| change | point | baseline status | current status | reason |", "|---|---|---|---|---|"]
        for r in status_rows:
            out.append("| {} | `{}` | {} | {} | {} |".format(r.kind, _md(r.name), r.base_status or "—",
                                                            r.cur_status or "—", _md(r.note)))
        out.append("")
    same = [r for r in rows if r.kind == "unchanged"]
    if same:
        out += ["<details><summary>{} unchanged points</summary>".format(len(same)), "",
                "| point | baseline µs | current µs | change | z | p-value | why |", "|---|---:|---:|---:|---:|---:|---|"]
        for r in same:
            c = r.change
            out.append("| `{}` | {:.2f} | {:.2f} | {} | {} | {} | {} |".format(
                _md(r.name), c.base_us, c.cur_us, _pct(c.change), "" if c.z is None else "{:.1f}".format(c.z),
                "" if c.p_value is None else "{:.2g}".format(c.p_value), _md(c.why + ("; " + r.note if r.note else ""))))
        out += ["", "</details>", ""]
    return "\n".join(out)


def run(baseline: str, current: str, threshold: float, alpha: float, output: Optional[str],
        z_min: float = S.T_MIN, history_db: Optional[str] = None) -> int:
    if not (0 <= threshold < 10):
        raise R.UserError("--threshold {} is out of range; give a fraction such as 0.02 for 2%".format(threshold))
    if not (0 < alpha < 1):
        raise R.UserError("--alpha {} must be between 0 and 1, e.g. 0.05".format(alpha))
    if not (z_min > 0):
        raise R.UserError("--min-z {} must be positive, e.g. 7".format(z_min))
    base, cur = R.load(baseline), R.load(current)
    spread = None
    if history_db:
        from . import history
        spread = history.learned_spread(history_db, cur.device.get("slug") or cur.device.get("name") or "unknown",
                                        exclude_paths=(baseline, current))
    ctx: list = []
    rows = collect(base, cur, threshold, alpha, z_min, spread, ctx)
    text = render(rows, base, cur, threshold, alpha, z_min, ctx[0])
    if output:
        R.write_text_atomic(output, text)
    print(text)
    return exit_code(rows)
