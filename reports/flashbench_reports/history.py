"""history: a SQLite store of runs and their points, and trend plots that mark detected changes.

Tables: runs (one per ingested results file; the file's SHA-256 keeps re-ingesting idempotent) and
points (one per record of a run, with its kept samples so later change detection uses the same
noise-aware rule as `compare`). Changes are detected between consecutive runs of a point on the same
device only: a trend across two GPUs is not a regression.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import sqlite3
from collections import defaultdict
from typing import Dict, List, Optional

from . import figures as F
from . import page
from . import results as R
from .stats import decide

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  git_sha TEXT, date TEXT, device_slug TEXT, device_name TEXT, host TEXT,
  source_path TEXT, content_sha256 TEXT UNIQUE, ingested_at TEXT, context_json TEXT);
CREATE TABLE IF NOT EXISTS points (
  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  name TEXT NOT NULL, variant TEXT, config_str TEXT, problem_key TEXT, status TEXT, reason TEXT,
  median_us REAL, tflops REAL, cv REAL, samples_json TEXT,
  PRIMARY KEY (run_id, name));
CREATE INDEX IF NOT EXISTS points_by_name ON points(name);
"""


def connect(db: str) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(db)
        con.executescript(SCHEMA)
    except sqlite3.DatabaseError as e:
        raise R.UserError("{}: not a flashbench history database ({}); pass another --db path".format(db, e))
    return con


def ingest(path: str, db: str, git_sha: Optional[str] = None) -> int:
    res = R.load(path)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    ctx = res.context
    fb = ctx.get("flashbench") if isinstance(ctx.get("flashbench"), dict) else {}
    sha = git_sha or fb.get("git_sha") or ""
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    con = connect(db)
    try:
        with con:
            row = con.execute("SELECT id FROM runs WHERE content_sha256 = ?", (digest,)).fetchone()
            if row:
                print("{}: already ingested as run {} in {}; nothing to do".format(path, row[0], db))
                return 0
            cur = con.execute(
                "INSERT INTO runs (git_sha, date, device_slug, device_name, host, source_path, content_sha256, "
                "ingested_at, context_json) VALUES (?,?,?,?,?,?,?,?,?)",
                (sha, str(ctx.get("date") or now), res.device.get("slug") or res.device.get("name") or "unknown",
                 res.device_label, ctx.get("host_name"), os.path.abspath(path), digest, now, json.dumps(ctx)))
            run_id = cur.lastrowid
            con.executemany(
                "INSERT OR REPLACE INTO points VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [(run_id, p.name, p.variant, p.config_str, p.key, p.status, p.reason, p.median_us if p.ok else None,
                  p.tflops if p.ok else None, p.cv, json.dumps(p.samples_us)) for p in res.points])
    finally:
        con.close()
    print("ingested {} ({} points, git {}) as run {} into {}".format(path, len(res.points), sha[:12] or "?",
                                                                   run_id, db))
    return 0


def _series(con: sqlite3.Connection, names: List[str]) -> Dict[str, Dict[str, list]]:
    """name -> device -> [row dicts in run order]."""
    out: Dict[str, Dict[str, list]] = defaultdict(lambda: defaultdict(list))
    q = ("SELECT p.name, r.id, r.git_sha, r.date, r.device_slug, p.status, p.reason, p.median_us, p.cv, "
         "p.samples_json FROM points p JOIN runs r ON r.id = p.run_id ORDER BY r.date, r.id")
    for name, rid, sha, date, dev, status, reason, med, cv, samples in con.execute(q):
        if names and name not in names:
            continue
        out[name][dev].append({"run": rid, "sha": sha or "", "date": date, "status": status, "reason": reason,
                               "median_us": med, "cv": cv, "samples": json.loads(samples or "[]")})
    return out


def detect(rows: List[dict], threshold: float, alpha: float) -> None:
    """Marks each row with 'change' = regression | improvement | None vs the previous ok run (same device)."""
    prev = None
    for r in rows:
        r["change"], r["pct"] = None, None
        if r["status"] != R.OK or not r["median_us"]:
            continue
        if prev is not None:
            ch = decide(prev["median_us"], r["median_us"], prev["samples"], r["samples"], prev["cv"], r["cv"],
                        threshold, alpha)
            if ch.verdict != "unchanged":
                r["change"], r["pct"] = ch.verdict, ch.change
        prev = r


def plot(db: str, out_dir: str, point: Optional[str] = None, threshold: float = 0.02, alpha: float = 0.05,
         max_points: int = 24, embed: bool = True) -> str:
    if not os.path.exists(db):
        raise R.UserError("{}: no such history database; create it with 'flashbench-report history ingest "
                          "RESULTS.json --db {}'".format(db, db))
    con = connect(db)
    try:
        all_names = [n for (n,) in con.execute("SELECT DISTINCT name FROM points ORDER BY name")]
        n_runs = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        if point:
            names = [n for n in all_names if n == point] or [n for n in all_names if point in n]
            if not names:
                raise R.UserError("{}: no point named or containing {!r}; see the names with 'flashbench-report "
                                  "compare' or the results JSON".format(db, point))
        else:
            names = all_names
        series = _series(con, names)
    finally:
        con.close()
    for devs in series.values():
        for rows in devs.values():
            detect(rows, threshold, alpha)
    changed = [n for n in names if any(r["change"] for rows in series[n].values() for r in rows)]
    chosen = (changed + [n for n in names if n not in changed])[:max_points]

    fig_dir = os.path.join(out_dir, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    plt = F.plt()
    sections, change_rows = [], []
    for n in names:
        for dev, rows in series[n].items():
            for r in rows:
                if r["change"]:
                    change_rows.append([r["date"], dev, r["sha"][:12], r["change"], "{:+.2f}%".format(100 * r["pct"]), n])
    for i, n in enumerate(chosen):
        fig, ax = plt.subplots(figsize=(9, 3.2))
        runs = sorted({(r["date"], r["run"], r["sha"]) for rows in series[n].values() for r in rows})
        pos = {run: k for k, (_, run, _) in enumerate(runs)}
        for dev, rows in sorted(series[n].items()):
            ok = [(j, r) for j, r in enumerate(rows) if r["median_us"]]
            xs = [pos[r["run"]] for r in rows]
            ax.plot([xs[j] for j, _ in ok], [r["median_us"] for _, r in ok], marker=".", label=dev)
            for kind, mk, col in (("regression", "^", "red"), ("improvement", "v", "green")):
                sel = [(j, r) for j, r in ok if r["change"] == kind]
                if sel:
                    ax.scatter([xs[j] for j, _ in sel], [r["median_us"] for _, r in sel], marker=mk, s=90, color=col,
                               zorder=5, label="{} ({})".format(kind, dev))
                    for j, r in sel:
                        ax.annotate("{} {:+.1f}%".format(r["sha"][:7], 100 * r["pct"]), (xs[j], r["median_us"]),
                                    textcoords="offset points", xytext=(4, 6), fontsize=7, color=col)
            bad = [j for j, r in enumerate(rows) if r["status"] != R.OK]
            if bad and ok:
                ax.scatter([xs[j] for j in bad], [min(r["median_us"] for _, r in ok)] * len(bad), marker="x",
                           color="gray", label="not ok ({})".format(dev))
        ax.set_ylabel("median µs")
        ax.set_title(n, fontsize=8)
        step = max(1, len(runs) // 12)
        ax.set_xticks(range(0, len(runs), step))
        ax.set_xticklabels(["{} {}".format(str(d)[:10], s[:7]) for d, _, s in runs[::step]], rotation=30,
                           ha="right", fontsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        path = os.path.join(fig_dir, "trend_{:03d}_{}.png".format(i, re.sub(r"[^A-Za-z0-9]+", "-", n)[:60]))
        F._save(fig, path)
        sections.append(page.figure(path, n, embed, out_dir))

    body = ["<p>{} runs, {} points in {}; {} points plotted ({} with a detected change). A change is a median "
            "move beyond {:.1f}% that is significant (Mann-Whitney U at α={} and beyond noise) against the "
            "previous ok run on the same device.</p>".format(n_runs, len(all_names), page.esc(db), len(chosen),
                                                             len(changed), 100 * threshold, alpha),
            "<h2>Detected changes</h2>",
            page.table(["date", "device", "git", "change", "median", "point"], change_rows)
            if change_rows else "<p>None.</p>", "<h2>Trends</h2>"] + sections
    if len(names) > len(chosen):
        body.append("<p class='muted'>{} more points not plotted; use --point or --max-points.</p>".format(
            len(names) - len(chosen)))
    R.write_text_atomic(os.path.join(out_dir, "index.html"), page.render("flashbench history", body))
    md = ["# flashbench history", "", "| date | device | git | change | median | point |", "|---|---|---|---|---:|---|"]
    md += ["| {} | {} | {} | {} | {} | `{}` |".format(*r) for r in change_rows] or ["| | | | none | | |"]
    R.write_text_atomic(os.path.join(out_dir, "history.md"), "\n".join(md) + "\n")
    return os.path.join(out_dir, "index.html")
