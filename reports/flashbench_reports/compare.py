"""compare: per-point change between a baseline and a current results file, as a CI-comment table.

parse (results.load) -> collect (rows with a verdict each) -> render (Markdown) -> main (exit code).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from . import results as R
from .stats import Change, decide

FAIL_KINDS = ("regression", "now failing")


@dataclass
class Row:
    name: str
    kind: str  # regression | now failing | improvement | unchanged | added | removed | fixed | now skipped | still not ok
    base_status: Optional[str]
    cur_status: Optional[str]
    change: Optional[Change] = None
    note: str = ""


def collect(base: R.Results, cur: R.Results, threshold: float, alpha: float) -> List[Row]:
    b, c = base.by_name(), cur.by_name()
    rows: List[Row] = []
    for name in list(b) + [n for n in c if n not in b]:
        bp, cp = b.get(name), c.get(name)
        if bp is None:
            rows.append(Row(name, "added", None, cp.status, note=cp.reason if not cp.ok else ""))
        elif cp is None:
            rows.append(Row(name, "removed", bp.status, None))
        elif bp.ok and cp.ok:
            ch = decide(bp.median_us, cp.median_us, bp.samples_us, cp.samples_us, bp.cv, cp.cv, threshold, alpha)
            note = "noise target not met" if (bp.noisy or cp.noisy) else ""
            rows.append(Row(name, ch.verdict, bp.status, cp.status, ch, note))
        elif bp.ok and not cp.ok:
            kind = "now failing" if cp.status in R.FAILED_STATUSES or cp.status not in R.NOT_OK_STATUSES \
                else "now skipped"
            rows.append(Row(name, kind, bp.status, cp.status, note=cp.reason))
        elif cp.ok:
            rows.append(Row(name, "fixed", bp.status, cp.status))
        else:
            rows.append(Row(name, "still not ok", bp.status, cp.status, note=cp.reason))
    return rows


def failed(rows: List[Row]) -> bool:
    return any(r.kind in FAIL_KINDS for r in rows)


def _md(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _pct(x: Optional[float]) -> str:
    return "" if x is None else "{:+.2f}%".format(100 * x)


def render(rows: List[Row], base: R.Results, cur: R.Results, threshold: float, alpha: float) -> str:
    counts = {}
    for r in rows:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    order = ["regression", "now failing", "improvement", "fixed", "now skipped", "added", "removed",
             "still not ok", "unchanged"]
    verdict = "❌ **FAIL**" if failed(rows) else "✅ **PASS**"
    out = ["## flashbench compare: {}".format(verdict), ""]
    out.append("Baseline `{}` ({}) → current `{}` ({}). A regression needs a median slowdown beyond "
               "{:.1f}% that is also significant (Mann-Whitney U at α={} and beyond both runs' noise)."
               .format(base.path, base.device_label, cur.path, cur.device_label, 100 * threshold, alpha))
    out.append("")
    out.append(", ".join("{} {}".format(counts[k], k) for k in order if k in counts) or "no points")
    if base.device.get("slug") and cur.device.get("slug") and base.device.get("slug") != cur.device.get("slug"):
        out += ["", "⚠️ The runs are on different devices ({} vs {}); use `bringup` to compare GPUs."
                .format(base.device.get("slug"), cur.device.get("slug"))]
    if base.timing_queue != cur.timing_queue:
        out += ["", "⚠️ The runs were timed under different loads (timing.queue {} vs {}): under a power cap the "
                "clock follows the load, so a change may be the method's, not the code's. Time both with the same "
                "queue.".format(base.timing_queue, cur.timing_queue)]
    out.append("")

    timed = [r for r in rows if r.change is not None and r.kind != "unchanged"]
    timed.sort(key=lambda r: (r.kind != "regression", -abs(r.change.change)))
    if timed:
        out += ["| verdict | point | baseline µs | current µs | change | p-value | noise | why |",
                "|---|---|---:|---:|---:|---:|---:|---|"]
        for r in timed:
            c = r.change
            out.append("| {} | `{}` | {:.2f} | {:.2f} | {} | {} | {} | {} |".format(
                r.kind, _md(r.name), c.base_us, c.cur_us, _pct(c.change),
                "" if c.p_value is None else "{:.2g}".format(c.p_value),
                "" if c.noise is None else "{:.2f}%".format(100 * c.noise), _md(c.why + ("; " + r.note if r.note else ""))))
        out.append("")
    status_rows = [r for r in rows if r.change is None]
    status_rows.sort(key=lambda r: order.index(r.kind) if r.kind in order else 99)
    if status_rows:
        out += ["| change | point | baseline status | current status | reason |", "|---|---|---|---|---|"]
        for r in status_rows:
            out.append("| {} | `{}` | {} | {} | {} |".format(r.kind, _md(r.name), r.base_status or "—",
                                                            r.cur_status or "—", _md(r.note)))
        out.append("")
    same = [r for r in rows if r.kind == "unchanged"]
    if same:
        out += ["<details><summary>{} unchanged points</summary>".format(len(same)), "",
                "| point | baseline µs | current µs | change | p-value | why |", "|---|---:|---:|---:|---:|---|"]
        for r in same:
            c = r.change
            out.append("| `{}` | {:.2f} | {:.2f} | {} | {} | {} |".format(
                _md(r.name), c.base_us, c.cur_us, _pct(c.change),
                "" if c.p_value is None else "{:.2g}".format(c.p_value), _md(c.why)))
        out += ["", "</details>", ""]
    return "\n".join(out)


def run(baseline: str, current: str, threshold: float, alpha: float, output: Optional[str]) -> int:
    if not (0 <= threshold < 10):
        raise R.UserError("--threshold {} is out of range; give a fraction such as 0.02 for 2%".format(threshold))
    if not (0 < alpha < 1):
        raise R.UserError("--alpha {} must be between 0 and 1, e.g. 0.05".format(alpha))
    base, cur = R.load(baseline), R.load(current)
    rows = collect(base, cur, threshold, alpha)
    text = render(rows, base, cur, threshold, alpha)
    if output:
        R.write_text_atomic(output, text)
    print(text)
    return 1 if failed(rows) else 0
