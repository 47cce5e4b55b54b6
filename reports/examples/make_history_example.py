#!/usr/bin/env python3
"""History example: a trend with a detected change point and its noise band.

  python reports/examples/make_history_example.py --results RUN1.json RUN2.json ... -o OUT   (real data)
  python reports/examples/make_history_example.py --synthetic -o OUT                          (SYNTHETIC data)

With --results, the nightly runs given (flashbench run or scripts/nightly_paired.py files of one GPU model, in any
order: history orders them by date) are ingested into OUT/history.sqlite and plotted into OUT (index.html,
history.md, figures/). That is the example to keep: real runs, real hosts.

With --synthetic, the runs are made up here, and every file and page says so: 30 nights of one point on one GPU
model, with 0.4% run-to-run noise, a 4% slowdown landing at night 19, and the pool moving the job to another host
at night 11 without a change of level. It shows what the page looks like before real history exists; it is not a
measurement.
"""
import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from flashbench_reports import history  # noqa: E402
from flashbench_reports.cli import main as report  # noqa: E402


def synthetic_runs(out_dir: str) -> list:
    rng = random.Random(2026)
    prob = {"batch": 4, "heads_q": 32, "heads_kv": 8, "seqlen_q": 4096, "seqlen_kv": 4096, "head_dim": 128,
            "causal": True, "dtype": "bf16", "layout": "bshd", "scale": 0}
    name = "fa3_pipelined/SYNTHETIC/b4_hq32_hkv8_sq4096_skv4096_d128_causal_bf16"
    paths = []
    for night in range(30):
        level = 1000.0 * (1.04 if night >= 19 else 1.0)
        med = level * (1 + rng.gauss(0, 0.004))
        samples = [med * (1 + rng.gauss(0, 0.002)) for _ in range(50)]
        host = "synthetic-host-a" if night < 11 else "synthetic-host-b"
        doc = {"context": {
            "schema_version": 1, "date": "2026-10-{:02d}T03:00:00+00:00".format(night + 1),
            "host_name": "SYNTHETIC", "spec": {"name": "SYNTHETIC history example", "path": "none"},
            "flashbench": {"version": "SYNTHETIC", "git_sha": "syn{:04d}".format(night)},
            "device": {"name": "SYNTHETIC GPU model", "slug": "synthetic-gpu"},
            "machine": {"gpu_uuid": "GPU-SYNTHETIC-" + host[-1], "host_id": host, "source": "SYNTHETIC"}},
            "benchmarks": [{"name": name, "variant": "fa3_pipelined", "config_str": "SYNTHETIC", "problem": prob,
                            "status": "ok", "median_us": med, "samples_us": samples, "cv": 0.002, "noisy": False,
                            "run_type": "iteration", "time_unit": "us", "real_time": med, "iterations": 50}]}
        p = os.path.join(out_dir, "runs", "synthetic-night-{:02d}.json".format(night + 1))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            json.dump(doc, f)
        paths.append(p)
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--results", nargs="+", help="real nightly results files of one GPU model")
    src.add_argument("--synthetic", action="store_true", help="made-up runs, labelled SYNTHETIC everywhere")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--point", help="plot this point (name or substring) only")
    ap.add_argument("--max-points", type=int, default=4)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    db = os.path.join(a.out, "history.sqlite")
    if os.path.exists(db):
        os.unlink(db)
    paths = synthetic_runs(a.out) if a.synthetic else a.results
    for p in paths:
        if report(["history", "ingest", p, "--db", db]) != 0:
            return 2
    args = ["history", "plot", "--db", db, "-o", a.out, "--max-points", str(a.max_points), "--link-figures"]
    if a.point:
        args += ["--point", a.point]
    rc = report(args)
    if a.synthetic:
        os.unlink(db)  # the runs are the record; the database is rebuilt from them
        with open(os.path.join(a.out, "README.md"), "w") as f:
            f.write("# SYNTHETIC history example\n\nEvery number here is made up by "
                    "`reports/examples/make_history_example.py --synthetic` (30 nights, 0.4% noise, a 4% step at "
                    "night 19, a host change at night 11 without a step). It shows the page, not a measurement. "
                    "For real data: `make_history_example.py --results RUN.json ... -o OUT`.\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
