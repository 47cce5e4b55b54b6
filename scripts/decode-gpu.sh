#!/usr/bin/env bash
# flash-decoding (issue #8) on one GPU, with flashbench already built at $FB_BUILD (scripts/env.sh; e.g.
# FLASHBENCH_BUILD_DIR=build-gpu): the decode GPU tests, `flashbench check --variant flash_decoding`, the 7
# acceptance shapes x the candidate configs of sweeps/accept/decode.yaml (--no-counters, short timing) and
# the torch SDPA cuDNN / flash peers on the same shapes, then a compact table. About 3-4 minutes.
#   scripts/decode-gpu.sh OUTDIR     ->  OUTDIR/log.txt (summaries + table), OUTDIR/results.tgz (JSON + logs)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
out="${1:?usage: scripts/decode-gpu.sh OUTDIR}"
mkdir -p "$out"
work=$(mktemp -d)
fb="$FB_BUILD/flashbench"
t0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
main() {
  [ -x "$fb" ] || { echo "no $fb: build first (FLASHBENCH_BUILD_DIR=...; scripts/env.sh)"; return 1; }
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
  stamp tests
  timeout ${FB_TEST_S:-70} "$FB_BUILD/tests/test_kernels" --gtest_filter='*FlashDecoding*:*Decode*' \
    >"$work/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |Failure|^\[  FAILED" "$work/tests.log" | head -20
  stamp check
  timeout ${FB_CHECK_S:-50} "$fb" check --variant flash_decoding >"$work/check.log" 2>&1
  echo "check rc=$?"; grep -i "fail" "$work/check.log" | head -5; tail -1 "$work/check.log"
  stamp sweep
  timeout ${FB_SWEEP_S:-70} "$fb" run sweeps/accept/decode.yaml --no-counters -o "$work/ours.json" \
    >"$work/sweep.log" 2>&1
  echo "sweep rc=$?"; tail -2 "$work/sweep.log"
  stamp peers
  "$fb" plan sweeps/accept/decode.yaml >"$work/plan.json" 2>>"$work/peers.log"
  PYTHONUNBUFFERED=1 timeout ${FB_PEERS_S:-45} python3 scripts/peers.py --problems "$work/plan.json" \
    --peers torch_cudnn,torch_flash --no-verify --min-samples 10 --min-time 0.1 --max-noise 0.03 --timeout 1 \
    -o "$work/peers.json" >>"$work/peers.log" 2>&1
  echo "peers rc=$?"; tail -1 "$work/peers.log"
  stamp table
  python3 - "$work/ours.json" "$work/peers.json" <<'PY'
import json, sys
def load(p):
    try:
        return json.load(open(p)).get("benchmarks", [])
    except Exception as e:
        try:  # a sweep cut off by its timeout leaves only the per-point journal
            return [json.loads(l) for l in open(p + ".partial.jsonl") if l.strip().startswith("{")]
        except Exception:
            print("cannot read", p, e); return []
ours, peers = load(sys.argv[1]), load(sys.argv[2])
key = lambda r: r["name"].split("/")[-1]
kvb = lambda p: 2.0 * 2 * p["batch"] * p["seqlen_kv"] * p["heads_kv"] * p["head_dim"]
peer = {}
for r in peers:
    if r.get("status") == "ok":
        peer.setdefault(key(r), {})[r["variant"]] = r["median_us"]
cfgs, shapes, cell = [], [], {}
for r in ours:
    c, k = r.get("config_str", "?"), key(r)
    if c not in cfgs: cfgs.append(c)
    if k not in shapes: shapes.append(k)
    cell[(k, c)] = r
def short(k):
    p = next(r["problem"] for r in ours if key(r) == k)
    kind = "MHA" if p["heads_q"] == p["heads_kv"] else "GQA"
    return "%s B=%d L=%dk" % (kind, p["batch"], p["seqlen_kv"] // 1024)
for i, c in enumerate(cfgs): print("c%d = %s" % (i, c))
print("\nus per config (ok points; status otherwise)")
print("%-16s" % "shape" + "".join("%9s" % ("c%d" % i) for i in range(len(cfgs))) + "%9s%9s" % ("cudnn", "flash"))
for k in shapes:
    row = "%-16s" % short(k)
    for c in cfgs:
        r = cell.get((k, c), {})
        row += "%9.1f" % r["median_us"] if r.get("status") == "ok" else "%9s" % (r.get("status") or "-")[:8]
    pk = peer.get(key({"name": k}), {})
    for v in ("peer:torch_cudnn", "peer:torch_flash"):
        row += "%9.1f" % pk[v] if v in pk else "%9s" % "-"
    print(row)
print("\nbest config per shape vs cuDNN (targets: >= 1.0x everywhere, GQA B=1 L=8k <= 11 us, B=1 L=128k >= 4300 GB/s)")
print("%-16s %-4s %9s %8s %9s %7s %9s" % ("shape", "cfg", "us", "GB/s", "cudnn_us", "x_cdnn", "c0 x_cdnn"))
for k in shapes:
    ok = [(cell[(k, c)]["median_us"], i) for i, c in enumerate(cfgs) if cell.get((k, c), {}).get("status") == "ok"]
    if not ok:
        print("%-16s no ok point" % short(k)); continue
    us, i = min(ok)
    p = cell[(k, cfgs[i])]["problem"]
    cd = peer.get(k, {}).get("peer:torch_cudnn")
    d0 = cell.get((k, cfgs[0]), {})
    x0 = cd / d0["median_us"] if cd and d0.get("status") == "ok" else None
    print("%-16s c%-3d %9.1f %8.0f %9s %7s %9s" % (short(k), i, us, kvb(p) / us / 1e3,
          "%.1f" % cd if cd else "-", "%.2f" % (cd / us) if cd else "-", "%.2f" % x0 if x0 else "-"))
bad = [r for r in ours if r.get("status") not in ("ok",)]
for r in bad[:8]:
    print("not ok:", key(r), r.get("config_str"), r.get("status"), str(r.get("reason"))[:160])
PY
  stamp done
}
main 2>&1 | tee "$out/log.txt"
tar czf "$out/results.tgz" -C "$work" . 2>/dev/null
rm -rf "$work"
