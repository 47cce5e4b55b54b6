#!/usr/bin/env python3
"""Same-call A/B of two builds over one sweep, run alternately (tools/dev/ab.sh): per point (variant, config,
problem) the ratio B/A of the median time over each side's passes, and of the fastest sample.

    tools/dev/ab_compare.py --a A1.json A2.json ... --b B1.json B2.json ... [--tolerance 0.01]

A point counts when it is ok and verified on every pass of both sides. The summary says how many ratios fall
outside 1 +- tolerance; the median-of-medians ratio decides, the fastest-sample ratio is shown beside it because a
power-capped board moves the medians with its clock phase."""
import argparse
import json
import statistics
import sys


def load(paths):
    runs = []
    for path in paths:
        pts = {}
        with open(path) as f:
            for b in json.load(f)["benchmarks"]:
                if b.get("status") != "ok":
                    continue
                variant, config, problem = b["name"].split("/", 2)  # variant/config_str/problem_key
                key = (variant, config, problem)
                pts[key] = (b["median_us"], b.get("min_us") or b["median_us"])
        runs.append(pts)
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", nargs="+", required=True)
    ap.add_argument("--b", nargs="+", required=True)
    ap.add_argument("--tolerance", type=float, default=0.01)
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)
    keys = set.intersection(*(set(r) for r in a + b))
    if not keys:
        print("ab_compare: no point is ok in every pass of both sides")
        return 2
    rows, outside = [], 0
    for k in sorted(keys):
        ma = statistics.median(r[k][0] for r in a)
        mb = statistics.median(r[k][0] for r in b)
        fa = min(r[k][1] for r in a)
        fb = min(r[k][1] for r in b)
        ratio = ma / mb  # speed of B relative to A: > 1 means B is faster
        rows.append((k, ma, mb, ratio, fa / fb))
        outside += abs(ratio - 1) > args.tolerance
    print(f"{'variant':15} {'problem':48} {'A us':>9} {'B us':>9} {'B/A speed':>9} {'fastest':>8}")
    for (v, c, p), ma, mb, r, rf in rows:
        print(f"{v:15} {p[:48]:48} {ma:9.1f} {mb:9.1f} {r:9.3f} {rf:8.3f}")
    ratios = [r[3] for r in rows]
    print(f"{len(rows)} points: B/A speed median {statistics.median(ratios):.4f}, min {min(ratios):.4f}, "
          f"max {max(ratios):.4f}; {outside} outside +-{args.tolerance:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
