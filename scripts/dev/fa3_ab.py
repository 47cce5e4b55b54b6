#!/usr/bin/env python3
"""Same-call A/B of one config axis of fa3_pipelined: for every problem and every config that differs
only in AXIS, TFLOP/s (SM clock MHz) of value A and of value B and their ratio B/A.
usage: scripts/dev/fa3_ab.py RESULTS.json AXIS A B"""
import json
import sys


def main():
    path, axis, va, vb = sys.argv[1:5]
    pts = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("status") != "ok" or b.get("variant") != "fa3_pipelined":
            continue
        p = b["problem"]
        prob = f"d{p['head_dim']} N{p['seqlen_q']}{' causal' if p['causal'] else ''}"
        cfg = dict(b["config"])
        val = str(cfg.pop(axis))
        key = (prob, ",".join(f"{k}={v}" for k, v in sorted(cfg.items()) if k in ("block_m", "block_n", "stages")))
        pts.setdefault(key, {})[val] = (b["tflops"], b.get("sm_clock_mhz") or 0)
    print(f"{'problem':18} {'tile':34} {axis}={va:>10} {axis}={vb:>10}  {vb}/{va}")
    ratios = []
    for (prob, tile), v in sorted(pts.items(), key=lambda kv: (kv[0][0].split()[0], 'causal' in kv[0][0], int(kv[0][0].split()[1][1:]), kv[0][1])):
        if va in v and vb in v:
            (ta, ca), (tb, cb) = v[va], v[vb]
            ratios.append(tb / ta)
            print(f"{prob:18} {tile:34} {ta:7.1f} ({ca:4.0f}) {tb:7.1f} ({cb:4.0f})  {tb / ta:.3f}")
    if ratios:
        print(f"{len(ratios)} pairs: {vb}/{va} min {min(ratios):.3f} max {max(ratios):.3f} mean {sum(ratios) / len(ratios):.3f}")


if __name__ == "__main__":
    main()
