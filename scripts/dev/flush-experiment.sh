#!/usr/bin/env bash
# Does the L2 flush method change decode timings? The 7 decode acceptance shapes (sweeps/decode-accept.yaml's
# problems) at two flash_decoding configs, timed with timing.flush = read and = write, the torch SDPA cuDNN and
# flash peers with peers.py --flush read and --flush write, and CUPTI counters (DRAM read/write bytes) of the
# B=1 L=8k point under each flush. Prints one table; flashbench must be built at $FB_BUILD (scripts/env.sh).
#   scripts/dev/flush-experiment.sh OUTDIR   -> OUTDIR/flush.txt, OUTDIR/flush.tgz
set -uo pipefail
out="${1:?usage: scripts/dev/flush-experiment.sh OUTDIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" && source scripts/env.sh
mkdir -p "$out"; work=$(mktemp -d); fb="$FB_BUILD/flashbench"
for how in read write; do
  sed -e "s/^name: decode-accept/name: decode-flush-$how/" \
      -e "s/^timing: {/timing: {flush: $how, /" sweeps/decode-accept.yaml |
    python3 -c "
import sys
keep=('{block_n: 64, warps: 4, stages: 3}','{block_n: 64, warps: 4, stages: 2}')
for l in sys.stdin:
    if l.strip().startswith('- {block_n') and not any(k in l for k in keep): continue
    sys.stdout.write(l)" > "$work/dec-$how.yaml"
  timeout 120 "$fb" run "$work/dec-$how.yaml" --no-counters -o "$work/ours-$how.json" >"$work/sweep-$how.log" 2>&1
  echo "sweep $how rc=$?"
  # counters of the B=1 L=8k point (default config) under this flush
  cat > "$work/ctr-$how.yaml" <<YAML
name: decode-counters-$how
timing: {flush: $how, min_samples: 10, max_noise: 0.03, min_time_s: 0.05, timeout_s: 0.25, point_timeout_s: 60}
problems:
  - {batch: 1, heads_q: 32, heads_kv: 8, seqlen_q: 1, seqlen_kv: [8192, 131072], head_dim: 128, dtype: bf16}
variants:
  flash_decoding:
    configs: [{block_n: 64, warps: 4, stages: 3}]
YAML
  timeout 120 "$fb" run "$work/ctr-$how.yaml" -o "$work/ctr-$how.json" >"$work/ctr-$how.log" 2>&1
  echo "counters $how rc=$?"
done
"$fb" plan "$work/dec-read.yaml" >"$work/plan.json" 2>"$work/plan.log"
for how in read write; do
  PYTHONUNBUFFERED=1 timeout 90 python3 scripts/peers.py --problems "$work/plan.json" --flush $how \
    --peers torch_cudnn,torch_flash --no-verify --min-samples 10 --min-time 0.1 --max-noise 0.03 --timeout 1 \
    -o "$work/peers-$how.json" >"$work/peers-$how.log" 2>&1
  echo "peers $how rc=$?"
done
python3 - "$work" <<'PY' | tee "$out/flush.txt"
import json, sys, os
w = sys.argv[1]
def load(n):
    try: return json.load(open(os.path.join(w, n)))["benchmarks"]
    except Exception as e: print("cannot read", n, e); return []
key = lambda r: r["name"].split("/")[-1]
def short(p):
    kind = "MHA" if p["heads_q"] == p["heads_kv"] else "GQA"
    return "%s B=%d L=%dk" % (kind, p["batch"], p["seqlen_kv"] // 1024)
kvb = lambda p: 2.0 * 2 * p["batch"] * p["seqlen_kv"] * p["heads_kv"] * p["head_dim"]
tab = {}
for how in ("read", "write"):
    for r in load("ours-%s.json" % how):
        if r.get("status") == "ok":
            t = tab.setdefault(key(r), {"p": r["problem"]})
            t["ours-" + how] = min(t.get("ours-" + how, 1e18), r["median_us"])
    for r in load("peers-%s.json" % how):
        if r.get("status") == "ok":
            tab.setdefault(key(r), {"p": r.get("problem")})[r["variant"].split(":")[-1] + "-" + how] = r["median_us"]
cols = ["ours-read", "torch_cudnn-read", "torch_flash-read", "ours-write", "torch_cudnn-write", "torch_flash-write"]
print("median us, best of 2 configs for ours; flush read = clean L2 lines, write = memset (do_bench)")
print("%-16s" % "shape" + "".join("%19s" % c for c in cols) + "%9s%9s%9s" % ("x_read", "x_write", "GB/s_rd"))
for k, t in tab.items():
    if not t.get("p"): continue
    row = "%-16s" % short(t["p"]) + "".join("%19s" % ("%.1f" % t[c] if c in t else "-") for c in cols)
    xr = t["torch_cudnn-read"] / t["ours-read"] if "torch_cudnn-read" in t and "ours-read" in t else None
    xw = t["torch_cudnn-write"] / t["ours-write"] if "torch_cudnn-write" in t and "ours-write" in t else None
    gb = kvb(t["p"]) / t["ours-read"] / 1e3 if "ours-read" in t else None
    row += "%9s%9s%9s" % ("%.2f" % xr if xr else "-", "%.2f" % xw if xw else "-", "%.0f" % gb if gb else "-")
    print(row)
print("\ncounters (default config), DRAM bytes in the kernel's range vs K+V bytes")
for how in ("read", "write"):
    for r in load("ctr-%s.json" % how):
        c = r.get("counters") or {"reason": str(r.get("counters_reason"))}
        print(how, short(r["problem"]), r.get("status"), "median_us=%.1f" % r.get("median_us", 0),
              "K+V=%.1f MB" % (kvb(r["problem"]) / 1e6),
              " ".join("%s=%s" % (n, ("%.1f MB" % (v / 1e6)) if isinstance(v, (int, float)) and "bytes" in n else v)
                       for n, v in sorted(c.items()) if isinstance(v, (int, float, str)))[:600])
PY
tar czf "$out/flush.tgz" -C "$work" . 2>/dev/null
