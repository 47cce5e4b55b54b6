#!/usr/bin/env python3
"""Summarise one traced fa3_pipelined launch: where a persistent launch's time goes, per CTA and per work item.

Input: the "fa3trace ..." lines a trace build prints (cmake -DFLASHBENCH_FA3_TRACE=ON; fa3_pipelined.cuh, "trace"),
for example the output of
    FB=build-trace/flashbench; $FB run --variant fa3_pipelined --shape ... --config ... --no-counters > t.log
    python3 tools/dev/fa3_trace.py t.log [--png gantt.png]
Each work item (a work tile, or a stream-K segment of one) has five stamps on each consumer warpgroup's first
thread: tf fetch_tile entered (the previous item done), t0 the item handed over (its Q landed), ts the first P
packed, t1 the last P V retired, t2 O (or the partial) out; and the producer's stamps: tq when it issued the item's Q, tc when the claim of the item returned, tv when it issued
the item's last V.
Reported:
  - the launch (first consumer start to last CTA end), the spread of the CTAs' ends, and the idle share: the time
    CTAs sat with no work before the launch's end, over CTAs x launch;
  - per warpgroup and kind of item (whole tile; a tile's first segment that folds others in; a later segment that
    leaves a partial), medians: count, K/V tiles, the wait for the item (t0 - tf), the start (ts - t0: the first
    Q K^T and softmax alone), the loop per K/V tile after it ((t1 - ts) / (K/V - 1)), the end (t2 - t1: O, LSE, or
    the partial, and the fold), and the Q's lead (t0 - tq: from its load's issue to the hand-over);
  - (logs with the start-split stamps) the wait and the start split: the q_full wait, the rest of the fetch, up to the first
    k_full pass, the first Q K^T, and the first softmax and pack;
  - (logs with the producer's gap stamps) the producer from a tile's last V issue to the next tile's Q issue: up to
    load_q, the Q slot taken, the Q's first and second box issued;
  - (logs with the O-fence stamps) the end split at O's fence: up to it, the fence itself, and from it to O out;
  - the CTAs that finish last, with their last three items.
"""
import argparse
import statistics as st
import sys


def load(path):
    """{cta: (start, end, items)} of warpgroup 0, [items of every consumer warpgroup], {cta: [producer records]}."""
    ctas, items, prod = {}, [], {}
    for line in open(path, errors="replace"):
        if "fa3trace" not in line:
            continue
        w = line[line.index("fa3trace"):].split()
        if w[1] == "lane":
            if int(w[3]) == 0:
                ctas[int(w[2])] = (int(w[4]), int(w[5]), int(w[6]))
            continue
        if w[1] != "rec":
            continue
        c, lane, k = int(w[2]), int(w[3]), None
        x = list(map(int, w[4:])) + [0] * 12
        if lane == 3:
            prod.setdefault(c, []).append(x)
            continue
        n = x[1] & 0xffffffff
        n = n - (1 << 32) if n >= 1 << 31 else n
        part = x[1] >> 32
        items.append(dict(cta=c, wg=lane, q0=x[0] & 0xffffffff, h=(x[0] >> 32) & 0xffff, b=x[0] >> 48, n=n,
                          j0=part & 0x3fff, folds=(part >> 14) & 511, chunk=part >> 23,
                          tf=x[2], t0=x[3], ts=x[4], t1=x[5], t2=x[6],
                          # start-split stamps (0 in older logs): q_full passed, the first k_full passed, S(0) retired
                          tqp=x[7] or None, tk=x[8] or None, ts0=x[9] or None,
                          # O-fence stamps (0 in older logs and with direct O): O's fence entered and passed
                          tfe=x[10] or None, tfp=x[11] or None))
    # the k-th item of a CTA's warpgroup is the producer's k-th Q load (non-causal: no empty or idle tiles)
    seen = {}
    for it in items:
        k = seen.get((it["cta"], it["wg"]), 0)
        seen[(it["cta"], it["wg"])] = k + 1
        q = prod.get(it["cta"], [])
        it["tq"], it["tc"], it["tv"] = (q[k][2], q[k][4], q[k][5]) if k < len(q) else (None, None, None)
    return ctas, items, prod


def kind(it):
    return "later" if it["j0"] > 0 else ("first" if it["folds"] > 0 else "whole")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def med(xs):
    xs = [x for x in xs if x is not None]
    return st.median(xs) if xs else float("nan")


def summary(ctas, items, out, prod=None):
    if not ctas:
        out.write("no fa3trace lines (a trace build? the launch number reached?)\n")
        return
    t_ref = min(v[0] for v in ctas.values())
    t_end = max(v[1] for v in ctas.values())
    span = (t_end - t_ref) / 1e3
    ends = [(v[1] - t_ref) / 1e3 for v in ctas.values()]
    idle = sum(t_end - v[1] for v in ctas.values()) / (len(ctas) * (t_end - t_ref))
    out.write(f"launch {span:.1f} us over {len(ctas)} CTAs, {len(items)} warpgroup-items; CTA ends: first "
              f"{min(ends):.1f}, median {st.median(ends):.1f}, p90 {pct(ends, 0.9):.1f}, last {max(ends):.1f} us; "
              f"idle before the end {100 * idle:.1f}% of CTA time\n")
    us = lambda a, b: (a - b) / 1e3 if a and b else None
    out.write(f"{'wg':>2} {'kind':6} {'count':>6} {'K/V':>5} {'wait':>6} {'start':>6} {'loop/KV':>8} {'end':>6} "
              f"{'end p90':>7} {'Q lead':>7}   (us, medians)\n")
    for wg in sorted({i["wg"] for i in items}):
        for k in ("whole", "first", "later"):
            lst = [i for i in items if i["wg"] == wg and kind(i) == k]
            if not lst:
                continue
            kv = [i["n"] - i["j0"] for i in lst]
            loop = [us(i["t1"], i["ts"]) / (i["n"] - i["j0"] - 1) for i in lst if i["n"] - i["j0"] > 1]
            end = [us(i["t2"], i["t1"]) for i in lst]
            out.write(f"{wg:2d} {k:6} {len(lst):6d} {st.median(kv):5.1f} {med([us(i['t0'], i['tf']) for i in lst]):6.2f} "
                      f"{med([us(i['ts'], i['t0']) for i in lst]):6.2f} {med(loop):8.3f} {st.median(end):6.2f} "
                      f"{pct(end, 0.9):7.2f} {med([us(i['t0'], i['tq']) for i in lst]):7.2f}\n")
    def split_table(chain, labels, note=""):
        """Per warpgroup, medians over whole tiles of the intervals between consecutive stamps of `chain`."""
        if not any(i[chain[1]] for i in items):
            return
        ws = [max(6, len(l)) for l in labels]
        out.write(f"{'wg':>2} " + " ".join(f"{l:>{w}}" for l, w in zip(labels, ws)) +
                  f"   (us, medians over whole tiles{note})\n")
        for wg in sorted({i["wg"] for i in items}):
            lst = [i for i in items if i["wg"] == wg and kind(i) == "whole" and all(i[k] for k in chain)]
            out.write(f"{wg:2d} " + " ".join(f"{med([us(i[b], i[a]) for i in lst]):{w}.2f}"
                                             for a, b, w in zip(chain, chain[1:], ws)) + "\n")
    # the wait and the start split at the q_full pass, the first k_full pass and S(0)'s retirement
    split_table(("tf", "tqp", "t0", "tk", "ts0", "ts"), ("q_full wait", "fetch rest", "to k_full", "QK(0)", "softmax(0)"))
    # the end split at O's fence (fence.proxy.async: MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S)
    split_table(("t1", "tfe", "tfp", "t2"), ("to fence", "fence", "after"), ": the last P V retired to O out")
    # warpgroup 1 against 0 on the same item
    by = {(i["cta"], i["wg"]): [] for i in items}
    for i in items:
        by[(i["cta"], i["wg"])].append(i)
    d0, d1 = [], []
    for (c, wg), lst in by.items():
        if wg != 1 or (c, 0) not in by:
            continue
        for a, b in zip(by[(c, 0)], lst):
            d0.append(us(b["t0"], a["t0"]))
            d1.append(us(b["t1"], a["t1"]))
    if d0:
        out.write(f"warpgroup 1 behind 0: hand-over {med(d0):.2f} us, last P V retired {med(d1):.2f} us\n")
    # the producer around a tile boundary, against warpgroup 0's last P V of the tile before (negative: earlier)
    pc, pv, pq = [], [], []
    for (c, wg), lst in by.items():
        if wg != 0:
            continue
        for a, b in zip(lst, lst[1:]):
            pc.append(us(b["tc"], a["t1"]))
            pv.append(us(a["tv"], a["t1"]))
            pq.append(us(b["tq"], a["t1"]))
    out.write(f"producer, from warpgroup 0's last P V of a tile: next claim returned {med(pc):+.2f} us, the tile's "
              f"last V issued {med(pv):+.2f} us, the next Q issued {med(pq):+.2f} us\n")
    # the producer between a tile's last V issue and the next tile's Q issue
    gaps = [[], [], [], []]
    for recs in (prod or {}).values():
        for a, b in zip(recs, recs[1:]):
            if a[5] and b[8] and b[9] and b[10] and b[2]:
                for k, (x, y) in enumerate(((b[8], a[5]), (b[9], b[8]), (b[10], b[9]), (b[2], b[10]))):
                    gaps[k].append(us(x, y))
    if gaps[0]:
        out.write(f"producer, last V issued to next Q issued: to load_q {med(gaps[0]):.2f}, Q slot taken "
                  f"{med(gaps[1]):.2f}, first Q box issued {med(gaps[2]):.2f}, second box issued {med(gaps[3]):.2f} us "
                  f"(medians)\n")
    w0 = {c: sorted(l, key=lambda i: i["t0"]) for (c, wg), l in by.items() if wg == 0}
    last = sorted(w0.items(), key=lambda kv: -ctas[kv[0]][1])[:6]
    out.write("CTAs that finish last (warpgroup 0's last three items: kind K/V t0-t1-t2 in us from the launch start):\n")
    for c, lst in last:
        s = "  ".join(f"{kind(i)[0]}{i['n'] - i['j0']} {(i['t0'] - t_ref) / 1e3:.1f}-{(i['t1'] - t_ref) / 1e3:.1f}-"
                      f"{(i['t2'] - t_ref) / 1e3:.1f}" for i in lst[-3:])
        out.write(f"  cta {c:3d} end {(ctas[c][1] - t_ref) / 1e3:7.1f}: {s}\n")


def gantt(ctas, items, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t_ref = min(v[0] for v in ctas.values())
    colour = {"whole": "tab:blue", "first": "tab:orange", "later": "tab:green"}
    fig, ax = plt.subplots(figsize=(12, 6))
    for it in items:
        if it["wg"] != 0:
            continue
        y = it["cta"]
        ax.barh(y, (it["t1"] - it["t0"]) / 1e3, left=(it["t0"] - t_ref) / 1e3, height=0.8, color=colour[kind(it)])
        ax.barh(y, (it["t2"] - it["t1"]) / 1e3, left=(it["t1"] - t_ref) / 1e3, height=0.8, color="black")
    ax.set_xlabel("us from the first consumer start (black: O / partial / fold)")
    ax.set_ylabel("CTA")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--png", help="a Gantt chart of the (last) log's launch")
    args = ap.parse_args()
    for path in args.logs:
        ctas, items, prod = load(path)
        sys.stdout.write(f"== {path}\n")
        summary(ctas, items, sys.stdout, prod)
    if args.png and ctas:
        gantt(ctas, items, args.png)


if __name__ == "__main__":
    main()
