#!/usr/bin/env python3
"""Best config of each variant per problem against the peers measured in the same call.

    scripts/peer_table.py OURS.json PEERS.json [--variant fa3_pipelined] [--peer torch_cudnn]
    scripts/peer_table.py INTERLEAVED.json --variant fa3_pipelined [--peer torch_cudnn]

OURS is a `flashbench run` results file, PEERS the output of `scripts/peers.py` on the same plan. With one file, it
is the output of `scripts/peers.py --ours VARIANT --rounds R`: the variant timed by peers.py itself, in turn with the
peers, R rounds. Records are paired by problem and round (repetition_index): the ratio is the median of the rounds'
ratios, with their range when there are several. Where the file holds several configs of the variant per problem
(peers.py --ours-top K), the config is chosen by its ratio in round 0 and, given 2 or more rounds, the ratio reported
is over rounds 1..R-1 only, so that the samples that chose it do not also grade it.

Prints one row per problem: the variant's best TFLOP/s (median over rounds) and config, each peer's TFLOP/s and the
ratio to the chosen peer, then the SM clock (MHz), the timed loop's busy fraction and mean board power (W) of ours
and of that peer (first round). Under a power cap the clock follows the load, so a ratio is fair only where both
loops kept the GPU about as busy, and where both were timed under the same power and thermal state (interleaved
rounds). `per MHz` is the same ratio with each side divided by its sampled SM clock: a rough view of the code apart
from the power lottery (compute-bound kernels scale with the SM clock).
"""
import argparse
import json
import os
import statistics
import sys

# The problem key of the harness (flashbench_reports/problem.py), from the checkout: nothing needs installing.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reports"))
from flashbench_reports.problem import normalize_dtype, problem_key  # noqa: E402


def label_of(p: dict) -> str:
    """A problem's row label: head dim, sequence length (batch, heads and both lengths where seqlen_q != seqlen_kv),
    causal, then whatever else sets it apart (layout, scale, kv_lens, page size), as the key spells it."""
    base = problem_key({k: v for k, v in p.items() if k in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv",
                                                             "head_dim", "causal", "dtype")})
    rest = problem_key(p)[len(base):].replace("_", " ")
    causal = " causal" if p.get("causal") else ""
    if p.get("seqlen_q") == p.get("seqlen_kv"):
        return f"d{p.get('head_dim')} N{p.get('seqlen_q')}{causal}{rest}"
    # Decode and other seqlen_q != seqlen_kv rows differ in batch, heads and cache length, so all of them show.
    hq, hkv = p.get("heads_q"), p.get("heads_kv")
    heads = f"{hq}" if hq == hkv else f"{hq}/{hkv}"
    return f"d{p.get('head_dim')} B{p.get('batch')} H{heads} q{p.get('seqlen_q')} kv{p.get('seqlen_kv')}{causal}{rest}"


def choose_on_round0(best: dict, mine_all: dict, peer_of) -> str:
    """Where a problem has several configs of ours (peers.py --ours-top K): keeps, in `best`, only the config with the
    highest ratio to the peer in round 0, and drops round 0 when there are later rounds. Returns a note for the
    table, or "" where every problem had one config."""
    by_problem = {}
    for (k, cfg), recs in mine_all.items():
        by_problem.setdefault(k, []).append((cfg, recs))
    most = max(len(c) for c in by_problem.values())
    if most < 2:
        return ""
    later_rounds = False
    for k, cands in by_problem.items():
        if len(cands) < 2:
            continue
        q0 = peer_of(k, 0)

        def round0_ratio(cand):
            r0 = cand[1].get(0)
            return r0["tflops"] / q0["tflops"] if r0 and q0 else 0.0
        cfg, recs = max(cands, key=round0_ratio)
        later = {i: r for i, r in recs.items() if i > 0}
        later_rounds = later_rounds or bool(later)
        for i in [i for (kk, i) in best if kk == k]:
            del best[(k, i)]
        for i, r in (later or recs).items():
            best[(k, i)] = (r["tflops"], cfg, r)
    return (f"up to {most} configs per problem, each problem's chosen by its ratio in round 0; " +
            ("the ratios are from the later rounds" if later_rounds else
             "the ratios are from those same samples (give peers.py --rounds 2 or more)"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ours")
    ap.add_argument("peers", nargs="?", default=None)
    ap.add_argument("--variant", default=None)
    ap.add_argument("--peer", default="torch_cudnn", help="the peer the ratio is taken against")
    a = ap.parse_args()
    try:
        ours = json.load(open(a.ours))["benchmarks"]
        peers = json.load(open(a.peers))["benchmarks"] if a.peers else ours
    except (OSError, ValueError, KeyError) as e:
        print(f"peer_table: cannot read the inputs: {e}; give a flashbench results file and a peers.py file, or "
              "one file of peers.py --ours", file=sys.stderr)
        return 2
    key = lambda r: problem_key(dict(r["problem"], dtype=normalize_dtype(r["problem"].get("dtype"))))
    problem_of = {}  # key -> the problem
    rep = lambda r: r.get("repetition_index") or 0
    best, peer = {}, {}  # (problem, round) -> (tflops, config, record); (problem, peer name, round) -> record
    mine_all = {}  # (problem, config) -> {round: record}, for the one-file (interleaved) mode
    for r in ours:
        v = r.get("variant", r["name"].split("/")[0])
        if r.get("status") != "ok" or not r.get("tflops") or v.startswith("peer:"):
            continue
        if a.variant and v != a.variant:
            continue
        k = (key(r), rep(r))
        problem_of[key(r)] = r["problem"]
        mine_all.setdefault((key(r), r.get("config_str", "")), {})[rep(r)] = r
        if r["tflops"] > best.get(k, (0, ""))[0]:
            best[k] = (r["tflops"], r.get("config_str", ""), r)
    names = []
    for r in peers:
        if r.get("status") == "ok" and r.get("tflops") and r["name"].startswith("peer:"):
            n = r["name"].split("/")[0].replace("peer:", "")
            peer[(key(r), n, rep(r))] = r
            if n not in names:
                names.append(n)
    if not best:
        print(f"peer_table: no verified point of {a.variant or 'any variant'} in {a.ours}", file=sys.stderr)
        return 2
    # With two files the rounds of ours and of the peers are unrelated: pair every round of ours with round 0.
    paired = a.peers is None
    chosen = ""
    if paired:
        chosen = choose_on_round0(best, mine_all, lambda k, i: peer.get((k, a.peer, i)))
    load = lambda r: (f"{(r or {}).get('sm_clock_mhz') or 0:5.0f} {(r or {}).get('busy_fraction') or 0:4.2f} "
                      f"{(r or {}).get('power_w') or 0:4.0f}")
    mhz_ratio = lambda r, q: (q["sm_clock_mhz"] / r["sm_clock_mhz"]
                              if r.get("sm_clock_mhz") and q.get("sm_clock_mhz") else float("nan"))
    rounds = max(k[1] for k in best) + 1
    def order(k):
        p = problem_of[k]
        return (p.get("head_dim") or 0, bool(p.get("causal")), p.get("seqlen_q") or 0, p.get("batch") or 0, k)
    problems = sorted({k[0] for k in best}, key=order)
    labels = {k: label_of(problem_of[k]) for k in problems}
    w = max([17] + [len(x) for x in labels.values()])
    print(f"{'problem':{w}s} {'ours':>7s} " + " ".join(f"{n:>12s}" for n in names) + f" {'ours/' + a.peer:>18s}"
          + (f" {'range':>13s}" if rounds > 1 else "") +
          f" {'per MHz':>7s}  {'MHz busy    W':>15s} {'(ours | peer)':>15s}  config")
    for k in problems:
        label = labels[k]
        mine = [(i, best[(k, i)]) for i in range(rounds) if (k, i) in best]
        ratios, per_mhz, cols = [], [], {n: [] for n in names}
        for i, (t, cfg, rec) in mine:
            j = i if paired else 0
            for n in names:
                if (k, n, j) in peer:
                    cols[n].append(peer[(k, n, j)]["tflops"])
            q = peer.get((k, a.peer, j))
            if q:
                ratios.append(t / q["tflops"])
                per_mhz.append(t / q["tflops"] * mhz_ratio(rec, q))
        med = lambda xs: statistics.median(xs) if xs else float("nan")
        t, cfg, rec = mine[0][1]
        print(f"{label:{w}s} {med([m[1][0] for m in mine]):7.1f} " +
              " ".join(f"{med(cols[n]):12.1f}" for n in names) + f" {med(ratios):18.3f}" +
              (f" {min(ratios):6.3f}-{max(ratios):6.3f}" if rounds > 1 and ratios else
               f" {'':13s}" if rounds > 1 else "") +
              f" {med(per_mhz):7.3f}  {load(rec)} | {load(peer.get((k, a.peer, 0 if not paired else mine[0][0])))}"
              f"  {cfg}")
    if chosen:
        print(chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
