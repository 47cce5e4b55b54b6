#!/usr/bin/env python3
"""Best config of each variant per problem against the peers measured in the same call.

    scripts/peer_table.py OURS.json PEERS.json [--variant fa3_pipelined] [--peer torch_cudnn]

OURS is a `flashbench run` results file, PEERS the output of `scripts/peers.py` on the same plan. Prints one row per
problem: the variant's best TFLOP/s and config, each peer's TFLOP/s and the ratio to the chosen peer, then the
SM clock (MHz), the timed loop's busy fraction and mean board power (W) of ours and of that peer. Under a power cap
the clock follows the load, so a ratio is fair only where both loops kept the GPU about as busy. `per MHz` is the
same ratio with each side divided by its mean SM clock: a rough view of the code apart from the power lottery
(compute-bound kernels scale with the SM clock; the clock is a mean sampled over the timed loop).
"""
import argparse
import json
import sys

FIELDS = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim", "causal", "dtype")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ours")
    ap.add_argument("peers")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--peer", default="torch_cudnn", help="the peer the ratio is taken against")
    a = ap.parse_args()
    try:
        ours = json.load(open(a.ours))["benchmarks"]
        peers = json.load(open(a.peers))["benchmarks"]
    except (OSError, ValueError, KeyError) as e:
        print(f"peer_table: cannot read the inputs: {e}; give a flashbench results file and a peers.py file",
              file=sys.stderr)
        return 2
    key = lambda r: tuple(r["problem"].get(f) for f in FIELDS)
    best, peer, peer_rec = {}, {}, {}
    for r in ours:
        if r.get("status") != "ok" or not r.get("tflops"):
            continue
        if a.variant and r.get("variant", r["name"].split("/")[0]) != a.variant:
            continue
        k = key(r)
        if r["tflops"] > best.get(k, (0, ""))[0]:
            best[k] = (r["tflops"], r.get("config_str", ""), r)
    names = []
    for r in peers:
        if r.get("status") == "ok" and r.get("tflops"):
            n = r["name"].split("/")[0].replace("peer:", "")
            peer[(key(r), n)] = r["tflops"]
            peer_rec[(key(r), n)] = r
            if n not in names:
                names.append(n)
    load = lambda r: (f"{(r or {}).get('sm_clock_mhz') or 0:5.0f} {(r or {}).get('busy_fraction') or 0:4.2f} "
                      f"{(r or {}).get('power_w') or 0:4.0f}")
    per_mhz = lambda t, r, p, q: ((t / r["sm_clock_mhz"]) / (p / q["sm_clock_mhz"])
                                  if p and r and q and r.get("sm_clock_mhz") and q.get("sm_clock_mhz") else float("nan"))
    print(f"{'problem':16s} {'ours':>7s} " + " ".join(f"{n:>12s}" for n in names) + f" {'ours/' + a.peer:>18s}"
          f" {'per MHz':>7s}  {'MHz busy    W':>15s} {'(ours | peer)':>15s}  config")
    for k in sorted(best, key=lambda k: (k[5], k[6], k[3], k[0])):
        b, h, hk, sq, skv, d, causal, dt = k
        label = f"d{d} N{sq}{' causal' if causal else ''}"
        t, cfg, rec = best[k]
        p = peer.get((k, a.peer))
        print(f"{label:16s} {t:7.1f} " + " ".join(f"{peer.get((k, n), float('nan')):12.1f}" for n in names) +
              f" {t / p if p else float('nan'):18.3f} {per_mhz(t, rec, p, peer_rec.get((k, a.peer))):7.3f}"
              f"  {load(rec)} | {load(peer_rec.get((k, a.peer)))}  {cfg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
