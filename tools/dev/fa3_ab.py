#!/usr/bin/env python3
"""Same-call A/B of fa3_pipelined, TF/s (SM clock MHz) of A and of B and their ratio B/A, per problem and tile.
    tools/dev/fa3_ab.py RESULTS.json AXIS A B   one config axis (A and B are its values) within one results file
    tools/dev/fa3_ab.py --files A.json B.json  two builds run in one call over the same sweep
The summary line also gives the mean over the pairs where both sides ran at >= 1950 MHz (a power-capped point
runs at 1710-1830 MHz: kernels/fa3_pipelined/HISTORY.md), the only pairs that compare code and not clocks."""
import json
import sys

TILE_KEYS = ("block_m", "block_n", "stages", "scheduler")


def problem_name(p):
    return f"d{p['head_dim']} N{p['seqlen_q']}{' causal' if p['causal'] else ''}"


def points(path, axis=None):
    """{(problem, tile): {axis value or '': (tflops, clock)}} of the ok fa3_pipelined points of one file."""
    pts = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("status") != "ok" or b.get("variant") != "fa3_pipelined":
            continue
        cfg = dict(b["config"])
        val = str(cfg.pop(axis)) if axis else ""
        tile = ",".join(f"{k}={v}" for k, v in sorted(cfg.items()) if k in TILE_KEYS)
        pts.setdefault((problem_name(b["problem"]), tile), {})[val] = (b["tflops"], b.get("sm_clock_mhz") or 0)
    return pts


def order(kv):
    prob = kv[0][0].split()
    return (prob[0], "causal" in kv[0][0], int(prob[1][1:]), kv[0][1])


def main():
    if sys.argv[1] == "--files":
        a, b = points(sys.argv[2]), points(sys.argv[3])
        pairs = {k: {"A": a[k][""], "B": b[k][""]} for k in a if k in b}
        la, lb = "A", "B"
        print(f"A = {sys.argv[2]}\nB = {sys.argv[3]}")
    else:
        path, axis, la, lb = sys.argv[1:5]
        pairs = {k: v for k, v in points(path, axis).items() if la in v and lb in v}
    print(f"{'problem':18} {'tile':52} {la:>14} {lb:>14}  {lb}/{la}")
    ratios, hot = [], []
    for (prob, tile), v in sorted(pairs.items(), key=order):
        (ta, ca), (tb, cb) = v[la], v[lb]
        ratios.append(tb / ta)
        if ca >= 1950 and cb >= 1950:
            hot.append(tb / ta)
        print(f"{prob:18} {tile:52} {ta:7.1f} ({ca:4.0f}) {tb:7.1f} ({cb:4.0f})  {tb / ta:.3f}")
    if ratios:
        print(f"{len(ratios)} pairs: {lb}/{la} min {min(ratios):.3f} max {max(ratios):.3f} "
              f"mean {sum(ratios) / len(ratios):.3f}")
    if hot:
        print(f"{len(hot)} pairs with both at >= 1950 MHz: mean {sum(hot) / len(hot):.3f}, "
              f"min {min(hot):.3f}, max {max(hot):.3f}")


if __name__ == "__main__":
    main()
