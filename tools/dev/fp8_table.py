"""fa3_fp8 (e4m3) against torch SDPA's cuDNN backend (bf16) and fa3_pipelined (bf16) on the same shapes: one line per
(N, causal). FP8 and bf16 problems have different keys, so the pairs come from different timed loops of the same
call (peers.py --rounds: ours and cuDNN each in its own problem's loop, alternating); the ratio is good to the rounds'
spread, printed beside it. Also prints the ceilings (bf16 and e4m3 GEMM) and any peer's skip reason, and the two
sweeps' best by fastest sample (min_us: both kernels at the clock they reach before the board's power limit bites,
which the medians of different sweep points do not share: 1695-1980 MHz in one measured call).
    python3 tools/dev/fp8_table.py SWEEP.json PEERS.json
    python3 tools/dev/fp8_table.py PEERS.json          (fp8 against cuDNN bf16 only: the peers file alone)"""
import json
import statistics
import sys


def main(sweep_path, peers_path):
    sweep = json.load(open(sweep_path))["benchmarks"] if sweep_path else []
    doc = json.load(open(peers_path))
    peers, ctx = doc["benchmarks"], doc["context"]
    flops, bf16_sweep, fastest = {}, {}, {}
    for r in sweep:
        if r.get("status") != "ok":
            continue
        k = (r["problem"]["seqlen_q"], bool(r["problem"]["causal"]))
        fastest[(r["variant"], k)] = min(fastest.get((r["variant"], k), 1e30), r["min_us"])
        if r["variant"] == "fa3_pipelined":
            bf16_sweep[k] = min(bf16_sweep.get(k, 1e30), r["median_us"])
            flops[k] = r["flops"]
    times = {}
    for r in peers:
        p = r["problem"]
        k = (p["seqlen_q"], bool(p["causal"]))
        if r.get("status") != "ok":
            if r["variant"] == "peer:torch_fp8" and r["problem"]["dtype"] == "e4m3" and r.get("reason"):
                times.setdefault("why_fp8", r["reason"])
            continue
        times.setdefault((r["variant"].replace("peer:", ""), k), []).append(r["median_us"])
        if not sweep_path and r["variant"] == "fa3_fp8":
            flops[k] = r["flops"]
    print("ceilings:", json.dumps(ctx.get("ceilings") or {})[:300])
    if "why_fp8" in times:
        print("torch_fp8:", times["why_fp8"][:300])
    print(f"{'N':>6} {'causal':>6} {'fp8 TF/s':>9} {'cuDNN bf16':>10} {'fa3 bf16':>9} {'fp8/cuDNN':>9} {'rounds':>13} {'fp8/fa3':>8}"
          f" | fastest samples: {'fp8':>6} {'fa3 bf16':>8} {'ratio':>6}")
    for k in sorted(flops):
        ours, cud = times.get(("fa3_fp8", k)), times.get(("torch_cudnn", k))
        if not ours or not cud:
            continue
        ratios = [c / o for o, c in zip(ours, cud)]
        f = flops[k]
        if not sweep_path:
            print(f"{k[0]:6d} {int(k[1]):6d} {f / statistics.median(ours) / 1e6:9.1f} {f / statistics.median(cud) / 1e6:10.1f} "
                  f"{'-':>9} {statistics.median(ratios):9.3f} {min(ratios):6.3f}-{max(ratios):.3f}")
            continue
        print(f"{k[0]:6d} {int(k[1]):6d} {f / statistics.median(ours) / 1e6:9.1f} {f / statistics.median(cud) / 1e6:10.1f} "
              f"{f / bf16_sweep[k] / 1e6:9.1f} {statistics.median(ratios):9.3f} {min(ratios):6.3f}-{max(ratios):.3f} "
              f"{bf16_sweep[k] / statistics.median(ours):8.3f} | {' ' * 17}"
              f"{f / fastest[('fa3_fp8', k)] / 1e6:6.1f} {f / fastest[('fa3_pipelined', k)] / 1e6:8.1f} "
              f"{fastest[('fa3_pipelined', k)] / fastest[('fa3_fp8', k)]:6.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:3]) if len(sys.argv) > 2 else main(None, sys.argv[1])
