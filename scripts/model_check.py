#!/usr/bin/env python3
"""Measured HBM bytes (CUPTI) against each point's traffic model, from a results file.

    scripts/model_check.py RESULTS.json [--variant fa1_kv_outer] [--min-seqlen 4096] [--tolerance 0.15]

Prints measured/model per point and exits 1 when any point with counters is outside the tolerance, so a model that
has drifted from the kernel shows up in CI on a GPU runner rather than in a report nobody reads.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--variant", default=None, help="only this variant (default: all)")
    ap.add_argument("--min-seqlen", type=int, default=0, help="only points with seqlen_kv >= this")
    ap.add_argument("--tolerance", type=float, default=0.15, help="allowed |measured/model - 1|")
    a = ap.parse_args()
    try:
        rows = json.load(open(a.results))["benchmarks"]
    except (OSError, ValueError, KeyError) as e:
        print(f"model_check: cannot read {a.results}: {e}; give a flashbench results file", file=sys.stderr)
        return 2
    bad = n = 0
    print(f"{'point':78s} {'measured GB':>11s} {'model GB':>9s} {'meas/model':>10s}")
    for b in rows:
        name, p = b.get("name", "?"), b.get("problem", {})
        if a.variant and not name.startswith(a.variant + "/"):
            continue
        if p.get("seqlen_kv", 0) < a.min_seqlen or b.get("status", "ok") != "ok":
            continue
        meas, model = (b.get("counters") or {}).get("dram_bytes"), b.get("bytes_model")
        if not meas or not model:
            continue
        r = meas / model
        n += 1
        off = abs(r - 1) > a.tolerance
        bad += off
        print(f"{name[:78]:78s} {meas / 1e9:11.4f} {model / 1e9:9.4f} {r:10.3f}{'  OUTSIDE' if off else ''}")
    print(f"model_check: {n} points, {bad} outside +-{a.tolerance:.0%}")
    return 1 if bad or not n else 0


if __name__ == "__main__":
    sys.exit(main())
