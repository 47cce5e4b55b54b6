#!/usr/bin/env python3
"""Warp-state samples per SASS instruction from ncu's source page, and their sums over address ranges.
    ncu --section SourceCounters -k regex:fa3_kernel -c 1 -o rep build/flashbench run ...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
    tools/dev/ncu_sass_hot.py sass.csv [--top 0.2] [NAME=START:END ...]   (offsets in hex from the kernel's start)
Prints every instruction with at least --top percent of the samples (offset, share, executions, text, top stall
reasons), then each NAME range's share and stall mix. kernels/fa3_pipelined/HISTORY.md records where this mapped the K/V loop."""
import collections
import csv
import sys


def main():
    args = sys.argv[1:]
    path, top, ranges = args[0], 0.2, []
    rest = args[1:]
    while rest:
        a = rest.pop(0)
        if a == "--top":
            top = float(rest.pop(0))
        else:
            name, span = a.split("=")
            lo, hi = span.split(":")
            ranges.append((name, int(lo, 16), int(hi, 16)))
    rows = list(csv.reader(open(path)))
    hdr = rows[1]
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    base = int(rows[2][0], 16)
    recs = []
    for r in rows[2:]:
        if len(r) < len(hdr):
            continue
        st = {h[6:]: int(r[ix[h]] or 0) for h in stalls}
        recs.append((int(r[0], 16) - base, r[1].strip(), int(r[ix["Warp Stall Sampling (All Samples)"]] or 0),
                     int(r[ix["Instructions Executed"]] or 0), st))
    tot = sum(x[2] for x in recs) or 1
    print(f"{tot} samples, {len(recs)} instructions")
    for off, src, s, ex, st in recs:
        if 100 * s / tot >= top:
            mix = " ".join(f"{k}:{100 * v // max(s, 1)}" for k, v in sorted(st.items(), key=lambda x: -x[1])[:3])
            print(f"{off:05x} {100 * s / tot:5.2f}% ex={ex:9d} {src[:56]:56s} {mix}")
    for name, lo, hi in ranges:
        sel = [r for r in recs if lo <= r[0] < hi]
        s = sum(r[2] for r in sel)
        mix = collections.Counter()
        for r in sel:
            mix.update(r[4])
        print(f"{name:24s} {100 * s / tot:5.1f}%  " + " ".join(f"{k}:{100 * v / max(s, 1):.0f}" for k, v in mix.most_common(5)))


if __name__ == "__main__":
    main()
