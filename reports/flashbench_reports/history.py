"""history: a SQLite store of runs and their points, change points per point and GPU model, and trend plots.

Tables: runs (one per ingested results file; the file's SHA-256 keeps re-ingesting idempotent; the machine it ran
on: GPU UUID and host id from context.machine) and points (one per record of a run, with its kept samples).

Each point's series is taken per GPU model (device slug), across the hosts of a pool: ln(median) per run, in run
order. Change points come from stats.change_points (binary segmentation with a windowed t-test, as Apache
Otava/Hunter confirm an E-Divisive split: window 50 runs, t >= 7 against the series' robust run-to-run spread, and a
level shift beyond the 2% floor). The same run-to-run spread, per point and GPU model, is what `compare --history`
uses between two files (learned_spread). Plots show each segment's level with its noise band (±3 run-to-run
standard deviations), mark the runs where the host changed, and label each run by its id, commit and time.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import re
import sqlite3
from collections import defaultdict
from typing import Dict, Iterable, List, Optional

from . import figures as F
from . import machine as M
from . import page
from . import results as R
from . import stats as S

BAND_SIGMAS = 3.0  # the plotted noise band: segment level ± this many run-to-run standard deviations
MIN_RUNS_FOR_SPREAD = 6  # a point's learned spread needs at least this many ok runs on the GPU model

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
# Columns added after the first schema; connect() adds them to an older database.
RUN_COLUMNS = (("host_key", "TEXT"), ("gpu_uuid", "TEXT"), ("host_id", "TEXT"))
POINT_COLUMNS = (("noisy", "INTEGER"),)


def connect(db: str) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(db)
        con.executescript(SCHEMA)
        for table, cols in (("runs", RUN_COLUMNS), ("points", POINT_COLUMNS)):
            have = {r[1] for r in con.execute("PRAGMA table_info({})".format(table))}
            for name, typ in cols:
                if name not in have:
                    con.execute("ALTER TABLE {} ADD COLUMN {} {}".format(table, name, typ))
        con.commit()
    except sqlite3.DatabaseError as e:
        raise R.UserError("{}: not a flashbench history database ({}); pass another --db path".format(db, e))
    return con


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ingest(path: str, db: str, git_sha: Optional[str] = None) -> int:
    res = R.load(path)
    digest = _sha256(path)
    ctx = res.context
    fb = ctx.get("flashbench") if isinstance(ctx.get("flashbench"), dict) else {}
    sha = git_sha or fb.get("git_sha") or ""
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    mach = M.of(ctx)
    con = connect(db)
    try:
        with con:
            row = con.execute("SELECT id FROM runs WHERE content_sha256 = ?", (digest,)).fetchone()
            if row:
                print("{}: already ingested as run {} in {}; nothing to do".format(path, row[0], db))
                return 0
            cur = con.execute(
                "INSERT INTO runs (git_sha, date, device_slug, device_name, host, source_path, content_sha256, "
                "ingested_at, context_json, host_key, gpu_uuid, host_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (sha, str(ctx.get("date") or now), res.device.get("slug") or res.device.get("name") or "unknown",
                 res.device_label, ctx.get("host_name"), os.path.abspath(path), digest, now, json.dumps(ctx),
                 M.host_key(ctx), mach.get("gpu_uuid"), mach.get("host_id")))
            run_id = cur.lastrowid
            con.executemany(
                "INSERT OR REPLACE INTO points (run_id, name, variant, config_str, problem_key, status, reason, "
                "median_us, tflops, cv, samples_json, noisy) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [(run_id, p.name, p.variant, p.config_str, p.key, p.status, p.reason, p.median_us if p.ok else None,
                  p.tflops if p.ok else None, p.cv, json.dumps(p.samples_us), int(p.noisy)) for p in res.points])
    finally:
        con.close()
    print("ingested {} ({} points, git {}) as run {} into {}".format(path, len(res.points), sha[:12] or "?",
                                                                   run_id, db))
    return 0


def _series(con: sqlite3.Connection, names: Iterable[str] = (), device: Optional[str] = None,
            exclude_sha256: Iterable[str] = ()) -> Dict[str, Dict[str, list]]:
    """name -> device slug -> [row dicts in run order]."""
    want = set(names)
    skip = set(exclude_sha256)
    out: Dict[str, Dict[str, list]] = defaultdict(lambda: defaultdict(list))
    q = ("SELECT p.name, r.id, r.git_sha, r.date, r.device_slug, r.host_key, r.content_sha256, p.status, p.reason, "
         "p.median_us, p.cv, p.noisy, p.variant, r.context_json FROM points p JOIN runs r ON r.id = p.run_id "
         "ORDER BY r.date, r.id")
    sources: Dict[int, Dict[str, str]] = {}  # run id -> its build's per-variant kernel-source hashes
    for name, rid, sha, date, dev, host, digest, status, reason, med, cv, noisy, variant, ctx in con.execute(q):
        if (want and name not in want) or (device and dev != device) or digest in skip:
            continue
        if rid not in sources:
            try:
                sources[rid] = R.context_variant_sources(json.loads(ctx or "{}"))
            except ValueError:
                sources[rid] = {}
        out[name][dev].append({"run": rid, "sha": sha or "", "date": date, "host": host, "status": status,
                               "reason": reason, "median_us": med, "cv": cv, "noisy": bool(noisy),
                               "src": sources[rid].get(variant or "")})
    return out


def _ok(rows: List[dict]) -> List[dict]:
    return [r for r in rows if r["status"] == R.OK and r["median_us"] and r["median_us"] > 0]


def learned_spread(db: str, device: str, exclude_paths: Iterable[str] = ()) -> Dict[str, float]:
    """Per point: the run-to-run standard deviation of ln(median) on this GPU model, from the runs in history
    (stats.series_spread), times sqrt 2: the spread of the difference of two runs, which is what compare tests a
    change against. Points with fewer than MIN_RUNS_FOR_SPREAD ok runs are left out. `exclude_paths`: results
    files to leave out if they were ingested (the two being compared)."""
    if not os.path.exists(db):
        raise R.UserError("{}: no such history database; create it with 'flashbench-report history ingest "
                          "RESULTS.json --db {}', or leave --history out".format(db, db))
    skip = [_sha256(p) for p in exclude_paths if os.path.exists(p)]
    con = connect(db)
    try:
        series = _series(con, device=device, exclude_sha256=skip)
    finally:
        con.close()
    out = {}
    for name, devs in series.items():
        ok = _ok(devs.get(device, []))
        if len(ok) < MIN_RUNS_FOR_SPREAD:
            continue
        s = S.series_spread([math.log(r["median_us"]) for r in ok])
        if s is not None and s > 0:
            out[name] = s * math.sqrt(2.0)
    return out


def detect(rows: List[dict], threshold: float = S.FLOOR, t_min: float = S.T_MIN) -> dict:
    """Change points of one point's series on one GPU model. Marks each ok row with 'change' (regression |
    improvement | None, at the first run of a new level), 'pct' (the level's move), 'level' and 'band' (its
    segment's level and half-width in µs). Returns {"spread": run-to-run sd of ln median or None, "cps": [...]}."""
    for r in rows:
        r["change"], r["pct"], r["level"], r["band"] = None, None, None, None
    ok = _ok(rows)
    if not ok:
        return {"spread": None, "cps": []}
    logs = [math.log(r["median_us"]) for r in ok]
    cps = S.change_points(logs, t_min=t_min, min_shift=threshold)
    spread = S.series_spread(logs)
    segs = S.segments(len(ok), cps)
    levels = [S.median(logs[a:b]) for a, b in segs]
    for k, (a, b) in enumerate(segs):
        for r in ok[a:b]:
            r["level"] = math.exp(levels[k])
            r["band"] = (math.exp(levels[k] + BAND_SIGMAS * spread) - r["level"]) if spread else None
        if k > 0:
            pct = math.exp(levels[k] - levels[k - 1]) - 1.0
            ok[a]["change"], ok[a]["pct"] = ("regression" if pct > 0 else "improvement"), pct
    return {"spread": spread, "cps": [ok[i]["run"] for i in cps]}


def _tick(run: tuple) -> str:
    """'#12 abc1234 11-26 10:07': the run id keeps ticks distinct where runs share a commit and a day."""
    date, rid, sha = run
    return "#{} {} {}".format(rid, (sha or "?")[:7], str(date)[5:16].replace("T", " "))


def plot(db: str, out_dir: str, point: Optional[str] = None, threshold: float = S.FLOOR, alpha: float = S.ALPHA,
         max_points: int = 24, embed: bool = True, t_min: float = S.T_MIN) -> str:
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
    found = {n: {dev: detect(rows, threshold, t_min) for dev, rows in series[n].items()} for n in names}
    changed = [n for n in names if any(r["change"] for rows in series[n].values() for r in rows)]
    chosen = (changed + [n for n in names if n not in changed])[:max_points]

    fig_dir = os.path.join(out_dir, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    plt = F.plt()
    sections, change_rows = [], []
    for n in names:
        for dev, rows in series[n].items():
            prev_host, prev_src = None, None
            for r in _ok(rows):
                host_changed = prev_host is not None and r["host"] != prev_host
                code = {"changed": "kernel sources changed here", "same": "same kernel sources"}.get(
                    R.sources_change(prev_src, r["src"]), "")
                prev_host, prev_src = r["host"], r["src"]
                if r["change"]:
                    change_rows.append([r["date"], dev, "#{} {}".format(r["run"], r["sha"][:12]), r["change"],
                                        "{:+.2f}%".format(100 * r["pct"]),
                                        "host changed here" if host_changed else "", code, n])
    for i, n in enumerate(chosen):
        fig, ax = plt.subplots(figsize=(10, 3.6))
        runs = sorted({(r["date"], r["run"], r["sha"]) for rows in series[n].values() for r in rows})
        pos = {run: k for k, (_, run, _) in enumerate(runs)}
        for dev, rows in sorted(series[n].items()):
            ok = _ok(rows)
            xs = [pos[r["run"]] for r in ok]
            line, = ax.plot(xs, [r["median_us"] for r in ok], marker=".", label=dev, zorder=3)
            col = line.get_color()
            segs = S.segments(len(ok), [k for k, r in enumerate(ok) if r["change"]])
            for a, b in segs:
                seg = ok[a:b]
                lv = seg[0]["level"]
                x0, x1 = xs[a] - 0.4, xs[b - 1] + 0.4
                ax.hlines(lv, x0, x1, colors=col, linestyles="--", linewidth=1, zorder=2)
                if seg[0]["band"]:
                    ax.fill_between([x0, x1], [lv - seg[0]["band"]] * 2, [lv + seg[0]["band"]] * 2, color=col,
                                    alpha=0.15, zorder=1, label="noise band ±{:g}σ ({})".format(BAND_SIGMAS, dev)
                                    if a == 0 else None)
            hosts = [r["host"] for r in ok]
            moved = [k for k in range(1, len(ok)) if hosts[k] != hosts[k - 1] and hosts[k] and hosts[k - 1]]
            if moved:
                ax.scatter([xs[k] for k in moved], [ok[k]["median_us"] for k in moved], marker="o", s=60,
                           facecolors="none", edgecolors="gray", zorder=4, label="host changed ({})".format(dev))
            for kind, mk, c in (("regression", "^", "red"), ("improvement", "v", "green")):
                sel = [k for k, r in enumerate(ok) if r["change"] == kind]
                if sel:
                    ax.scatter([xs[k] for k in sel], [ok[k]["median_us"] for k in sel], marker=mk, s=90, color=c,
                               zorder=5, label="change point: {} ({})".format(kind, dev))
                    for k in sel:
                        ax.annotate("{} {:+.1f}%".format(ok[k]["sha"][:7] or "#{}".format(ok[k]["run"]),
                                                         100 * ok[k]["pct"]), (xs[k], ok[k]["median_us"]),
                                    textcoords="offset points", xytext=(4, 6), fontsize=7, color=c)
            bad = [pos[r["run"]] for r in rows if r["status"] != R.OK]
            if bad and ok:
                ax.scatter(bad, [min(r["median_us"] for r in ok)] * len(bad), marker="x", color="gray",
                           label="not ok ({})".format(dev))
        ax.set_ylabel("median µs")
        ax.set_title(n, fontsize=8)
        step = max(1, int(math.ceil(len(runs) / 30)))
        ax.set_xticks(range(0, len(runs), step))
        ax.set_xticklabels([_tick(r) for r in runs[::step]], rotation=60, ha="right", fontsize=6)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        path = os.path.join(fig_dir, "trend_{:03d}_{}.png".format(i, re.sub(r"[^A-Za-z0-9]+", "-", n)[:60]))
        F._save(fig, path)
        sections.append(page.figure(path, n, embed, out_dir))

    body = ["<p>{} runs, {} points in {}; {} points plotted ({} with a detected change point). Series are per GPU "
            "model, across hosts; a change point is a level shift beyond {:.1f}% with a windowed t ≥ {:g} against "
            "the series' run-to-run spread (window {} runs either side). The band is the segment's level ±{:g} "
            "run-to-run standard deviations; ticks read run id, commit and time; circled runs ran on another host "
            "than the run before.</p>".format(n_runs, len(all_names), page.esc(db), len(chosen), len(changed),
                                             100 * threshold, t_min, S.CP_WINDOW, BAND_SIGMAS),
            "<h2>Detected changes</h2>",
            page.table(["date", "device", "run", "change", "level", "host", "code", "point"], change_rows)
            if change_rows else "<p>None.</p>", "<h2>Trends</h2>"] + sections
    if len(names) > len(chosen):
        body.append("<p class='muted'>{} more points not plotted; use --point or --max-points.</p>".format(
            len(names) - len(chosen)))
    R.write_text_atomic(os.path.join(out_dir, "index.html"), page.render("flashbench history", body))
    md = ["# flashbench history", "", "| date | device | run | change | level | host | code | point |",
          "|---|---|---|---|---:|---|---|---|"]
    md += ["| {} | {} | {} | {} | {} | {} | {} | `{}` |".format(*r) for r in change_rows] or \
        ["| | | | none | | | | |"]
    R.write_text_atomic(os.path.join(out_dir, "history.md"), "\n".join(md) + "\n")
    return os.path.join(out_dir, "index.html")
