#!/usr/bin/env bash
# fa2_q_outer GPU pass (issue #3, version 4). Assumes flashbench is already built at $FB_BUILD (scripts/env.sh;
# FLASHBENCH_BUILD_DIR overrides). Runs the FA2 GPU tests, `flashbench check --variant fa2_q_outer`, times the
# candidate split_q tiles of sweeps/fa2-v3.yaml (--no-counters) and the torch SDPA flash + cuDNN peers on the same
# problems, and prints ours / flash / ratio per shape. Each step has its own time limit inside FB_BUDGET_S
# (default 230 s). OUTDIR gets two files: table.txt (the printed summary) and fa2-v3.tgz (results, peers, logs).
set -uo pipefail
out="${1:?usage: scripts/dev/fa2-gpu.sh OUTDIR}"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/env.sh
fb="$FB_BUILD/flashbench"
tk="$FB_BUILD/tests/test_kernels"
work=$(mktemp -d)
mkdir -p "$work/logs" "$out"
t0=$(date +%s)
budget=${FB_BUDGET_S:-230}
left() { local l=$(( budget - ($(date +%s) - t0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
finish() {
  stamp table
  python3 - "$work/fa2-v3.json" "$work/peers.json" <<'PY' 2>&1 | tee -a "$work/summary.txt"
import json, sys
def load(p):
    try:
        return json.load(open(p)).get("benchmarks", [])
    except Exception as e:
        print("(no records in {}: {})".format(p, e)); return []
ours, peers = load(sys.argv[1]), load(sys.argv[2])
def key(r):
    # The problem object, not the record name: peers.py names its records "peer:<peer>/<key>" and its key and
    # flashbench's may differ in optional fields (layout, scale), so both sides are keyed on the same fields.
    p = r.get("problem") or {}
    return "b{}_hq{}_hkv{}_sq{}_skv{}_d{}{}_{}".format(
        p.get("batch"), p.get("heads_q"), p.get("heads_kv"), p.get("seqlen_q"), p.get("seqlen_kv"),
        p.get("head_dim"), "_causal" if p.get("causal") else "", p.get("dtype"))
best, per_cfg, peer = {}, {}, {}
status = {}
for r in ours:
    status[r.get("status")] = status.get(r.get("status"), 0) + 1
    if r.get("status") != "ok" or not r.get("tflops"): continue
    k = key(r)
    per_cfg.setdefault(k, {})[r.get("config_str", "")] = r["tflops"]
    if r["tflops"] > best.get(k, (0, ""))[0]: best[k] = (r["tflops"], r.get("config_str", ""))
for r in peers:
    if r.get("status") == "ok" and r.get("tflops"):
        peer[(key(r), str(r.get("variant", "")).split(":")[-1])] = r["tflops"]  # "peer:torch_flash" -> torch_flash
print("ours: " + ", ".join("{} {}".format(n, s) for s, n in sorted(status.items(), key=lambda x: str(x[0]))))
def short(c):
    d = dict(x.split("=") for x in c.split(",") if "=" in x)
    return "{}x{}x{} s{}".format(d.get("block_m"), d.get("block_n"), d.get("warps"), d.get("stages")) if d else c
print("{:<58} {:>7} {:<16} {:>7} {:>7} {:>6}".format("problem", "ours", "config", "flash", "cudnn", "q/fl"))
for k in sorted(set(best) | {k for k, _ in peer}):
    t, c = best.get(k, (None, ""))
    fl, cu = peer.get((k, "torch_flash")), peer.get((k, "torch_cudnn"))
    f = lambda x: "{:7.1f}".format(x) if x else "      -"
    print("{:<58} {} {:<16} {} {} {:>6}".format(k[:58], f(t), short(c), f(fl), f(cu),
          "{:.3f}".format(t / fl) if t and fl else "-"))
print("per config (TF/s):")
for k in sorted(per_cfg):
    print("  " + k[:58] + "  " + "  ".join("{} {:.1f}".format(short(c), v) for c, v in sorted(per_cfg[k].items())))
PY
  cp "$work/summary.txt" "$out/table.txt"
  tar czf "$out/fa2-v3.tgz" -C "$work" .
  stamp done
}
trap finish EXIT
{
  stamp start
  [ -x "$fb" ] && [ -x "$tk" ] || { echo "flashbench or test_kernels not built in $FB_BUILD"; exit 1; }
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>&1
  git rev-parse --short HEAD 2>/dev/null; git status --porcelain -- kernels/fa2_q_outer 2>/dev/null | head
  stamp tests
  timeout $(left ${FB_TEST_S:-50}) "$tk" --gtest_filter='*Fa2*' >"$work/logs/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$work/logs/tests.log" | head -20
  stamp check
  timeout $(left ${FB_CHECK_S:-30}) "$fb" check --variant fa2_q_outer >"$work/logs/check.log" 2>&1
  echo "check rc=$?"; grep -i "fail" "$work/logs/check.log" | head -5; tail -2 "$work/logs/check.log"
  stamp sweep
  timeout $(left ${FB_SWEEP_S:-100}) "$fb" run sweeps/fa2-v3.yaml --no-counters \
    -o "$work/fa2-v3.json" >"$work/logs/sweep.log" 2>&1
  echo "sweep rc=$?"; tail -3 "$work/logs/sweep.log"
  stamp peers
  "$fb" plan sweeps/fa2-v3.yaml >"$work/plan.json" 2>>"$work/logs/peers.log"
  PYTHONUNBUFFERED=1 timeout $(left ${FB_PEERS_S:-60}) python3 scripts/peers.py --problems "$work/plan.json" \
    --peers torch_flash,torch_cudnn --min-time 0.1 --min-samples 5 --timeout 2 --max-noise 0.01 \
    -o "$work/peers.json" >>"$work/logs/peers.log" 2>&1
  echo "peers rc=$?"; tail -2 "$work/logs/peers.log"
} 2>&1 | tee "$work/summary.txt"
