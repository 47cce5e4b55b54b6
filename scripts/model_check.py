#!/usr/bin/env python3
"""Measured DRAM bytes (CUPTI) of a results file against this build's traffic models.

    scripts/model_check.py RESULTS.json [--flashbench BUILD/flashbench | --models MODELS.json]
                           [--variant fa1_kv_outer] [--min-seqlen 4096] [--tolerance 0.15]

The models change with the code and the measured bytes do not, so the check never reads the bytes_model a file was
written with: it runs `flashbench model RESULTS.json` (this build's models on the device the file recorded: L2 size,
SMs, shared memory) or reads the JSON that command wrote (--models). A point passes when the measured bytes are
within the tolerance of the model, or when the model gives a range for an uncertain regime (its reason says why)
and the measured bytes lie in it (reports/flashbench_reports/traffic.py: the rule). Exits 1 when any point with
counters fails or none was checked, so that a model drifting from its kernel fails CI on the committed results
(reports/baselines/*/quick-counters.json); 2 on bad input.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "reports"))
from flashbench_reports import traffic  # noqa: E402  (the rule; stdlib only)


def fail(msg):
    print("model_check: " + msg, file=sys.stderr)
    sys.exit(2)


def find_flashbench(given):
    if given:
        return given
    built = os.path.join(ROOT, "build", "flashbench")
    return built if os.access(built, os.X_OK) else shutil.which("flashbench")


def current_models(results, flashbench):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "models.json")
        run = subprocess.run([flashbench, "model", results, "-o", out], capture_output=True, text=True)
        if run.returncode != 0:
            fail("{} model {} failed (exit {}): {}".format(flashbench, results, run.returncode,
                                                          run.stderr.strip() or run.stdout.strip()))
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--flashbench", default=None,
                    help="the flashbench binary whose models to check (default: build/flashbench, else PATH)")
    ap.add_argument("--models", default=None, help="JSON written by `flashbench model RESULTS -o MODELS`")
    ap.add_argument("--variant", default=None, help="only this variant (default: all)")
    ap.add_argument("--min-seqlen", type=int, default=0, help="only points with seqlen_kv >= this")
    ap.add_argument("--tolerance", type=float, default=traffic.TOLERANCE, help="allowed |measured/model - 1|")
    a = ap.parse_args()
    try:
        with open(a.results) as f:
            doc = json.load(f)
        rows = doc["benchmarks"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail("cannot read {}: {}; give a flashbench results file".format(a.results, e))
    # The models count a cold kernel on an L2 of clean lines (timing.flush: read). A write flush (memset) leaves the
    # L2 full of dirty lines whose write-back lands in the counters' window; a warm run finds inputs in L2.
    policy = (doc.get("context") or {}).get("timing_policy") or {}
    if policy.get("flush") != "read" or policy.get("cold") is not True:
        fail("{} was measured with timing cold={} flush={}: the traffic models assume cold runs after a read "
             "flush (an L2 of clean lines); rerun with timing.cold: true and timing.flush: read".format(
                 a.results, policy.get("cold"), policy.get("flush")))
    if a.models:
        try:
            with open(a.models) as f:
                models = json.load(f)
        except (OSError, ValueError) as e:
            fail("cannot read {}: {}; give the JSON of `flashbench model RESULTS -o MODELS`".format(a.models, e))
    else:
        fb = find_flashbench(a.flashbench)
        if not fb:
            fail("no flashbench binary (build/flashbench or PATH) to compute the current models; "
                 "pass --flashbench BIN or --models MODELS.json")
        models = current_models(a.results, fb)
    points = models.get("points") if isinstance(models, dict) else None
    if not isinstance(points, list) or len(points) != len(rows):
        fail("the models file does not match {} ({} points against {} records); "
             "rerun `flashbench model` on it".format(a.results, len(points or []), len(rows)))
    counts = {v: Counter() for v in (traffic.WITHIN, traffic.EXPLAINED, traffic.OUTSIDE)}
    lines = []
    for b, m in zip(rows, points):
        name, p = b.get("name", "?"), b.get("problem", {})
        if m.get("name") != name:
            fail("the models file does not match {} (record {} against {}); rerun `flashbench model` on it"
                 .format(a.results, name, m.get("name")))
        if a.variant and b.get("variant") != a.variant:
            continue
        if p.get("seqlen_kv", 0) < a.min_seqlen or b.get("status", "ok") != "ok":
            continue
        meas, model = (b.get("counters") or {}).get("dram_bytes"), m.get("bytes_model")
        if not meas or not model:
            continue
        v = traffic.verdict(meas, model, m.get("bytes_model_range"), a.tolerance)
        counts[v][b.get("variant", "?")] += 1
        rng = traffic.model_range(m.get("bytes_model_range"))
        note = "" if v == traffic.WITHIN else "  {}: {}".format(
            "EXPLAINED" if v == traffic.EXPLAINED else "OUTSIDE" + ("" if rng else " (no range)"),
            m.get("bytes_model_reason") or "no reason")
        lines.append("{:96s} {:11.1f} {:10.1f} {:10.3f}{}".format(name[:96], meas / 1e6, model / 1e6, meas / model,
                                                                  note))
    print("{:96s} {:>11s} {:>10s} {:>10s}".format("point", "measured MB", "model MB", "meas/model"))
    print("\n".join(lines))
    n = sum(sum(c.values()) for c in counts.values())
    bad = sum(counts[traffic.OUTSIDE].values())
    for var in sorted(set().union(*counts.values())):
        print("  {:16s} {:3d} within +-{:.0%}, {:3d} explained by their range, {:3d} outside".format(
            var, counts[traffic.WITHIN][var], a.tolerance, counts[traffic.EXPLAINED][var],
            counts[traffic.OUTSIDE][var]))
    print("model_check: {} points, {} within +-{:.0%}, {} explained, {} outside".format(
        n, sum(counts[traffic.WITHIN].values()), a.tolerance, sum(counts[traffic.EXPLAINED].values()), bad))
    return 1 if bad or not n else 0


if __name__ == "__main__":
    sys.exit(main())
