#!/usr/bin/env python3
"""Summarise fdec_trace output (tools/dev/fdec_trace.cu): where one decode launch's time goes.

For each file: medians over its runs of the launch (stamp kernel -> first instruction), the streaming (loop end of
the median and of the last CTA, counted from the first CTA's first instruction) and the tail of the CTA that
combined last (warp merge, partial stores, ticket, combine phases). Slot numbers are those of flash_decoding.cuh.
    python3 tools/dev/fdec_trace.py out1.txt [out2.txt.gz ...]
"""
import gzip
import statistics as st
import sys


def load(path):
    head, runs = {}, []
    for line in (gzip.open(path, "rt") if path.endswith(".gz") else open(path)):
        w = line.split()
        if w[0] == "#":
            head = {w[i]: int(w[i + 1]) for i in range(1, len(w) - 1, 2)}
        elif w[0] == "run":  # run R us X [stamp T]
            runs.append({"us": float(w[3]), "stamp": int(w[5]) if len(w) > 5 else 0, "ctas": []})
        elif w[0] == "cta":
            runs[-1]["ctas"].append([int(x) for x in w[2:]])
    return head, runs


def summarise(run):
    c = [x for x in run["ctas"] if x[1]]
    t0 = min(x[29] or x[1] for x in c)  # first instruction of the first CTA
    us = lambda v: (v - t0) / 1e3
    lend = [max(x[10:14]) for x in c]
    last = max((x for x in c if x[22]), key=lambda x: x[21])
    le = max(last[10:14])
    d = lambda a, b: (b - a) / 1e3 if a and b else float("nan")  # older traces lack some slots
    return {
        "event": run["us"],
        "launch": (t0 - run["stamp"]) / 1e3 if run["stamp"] else float("nan"),
        "first copies": st.median(us(x[30]) for x in c) if c[0][30] else float("nan"),
        "loop end med": us(st.median(lend)),
        "loop end max": us(max(lend)),
        "merge": d(le, last[18]),
        "stores": d(last[18], last[23]),
        "to ticket": d(last[23], last[19]),
        "ticket": d(last[19], last[20]),
        "to combine": d(last[20], last[24]),
        "loads+lse": d(last[24], last[26]),
        "barrier": d(last[26], last[27]),
        "fma": d(last[27], last[28]),
        "store+end": d(last[28], last[21]),
        "tail": d(le, last[21]),
        "end": us(last[21]),
        "ctas sharing an SM": len(c) - len({x[0] for x in c}),
    }


def main(paths):
    for path in paths:
        head, runs = load(path)
        rows = [summarise(r) for r in runs]
        med = {k: st.median(r[k] for r in rows) for k in rows[0]}
        print(f"{path} {head} ({len(runs)} runs, medians, us)")
        print("  " + " | ".join(f"{k} {v:.2f}" for k, v in med.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
