#!/usr/bin/env bash
# One GPU-machine pass for flash-decoding (issue #8): build, GPU tests, the decode sweep, the torch peers, the
# tuning sweep and `check`, each under its own time limit inside an overall budget (FB_BUDGET_S, default 380 s);
# results, the table and a tarball of the logs end up in OUTDIR (at most 6 files).
set -uo pipefail
out="${1:?usage: scripts/decode-gpu.sh OUTDIR}"
work=$(mktemp -d)
mkdir -p "$work/logs" "$out"
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
budget=${FB_BUDGET_S:-380}
left() { local l=$(( budget - ($(date +%s) - t0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
finish() {
  stamp done
  for f in decode.json peers-decode.json tune-decode.json; do [ -f "$work/$f" ] && cp "$work/$f" "$out/"; done
  python3 scripts/decode_table.py "$work/decode.json" "$work/peers-decode.json" "$work/tune-decode.json" 2>&1 |
    tee "$out/table.txt"
  tar czf "$out/logs.tgz" -C "$work" logs
}
trap finish EXIT
stamp build
{ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real &&
  cmake --build build-gpu -j16 --target flashbench test_kernels; } >"$work/logs/build.log" 2>&1 ||
  { tail -40 "$work/logs/build.log"; exit 1; }
fb=build-gpu/flashbench
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >>"$work/logs/build.log" 2>&1
stamp tests
timeout $(left ${FB_TEST_S:-100}) build-gpu/tests/test_kernels --gtest_filter='*FlashDecoding*:*Decode*' \
  >"$work/logs/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |Failure|FAIL" "$work/logs/tests.log" | head -20
stamp tune
timeout $(left ${FB_TUNE_S:-90}) $fb run sweeps/tune-decode.yaml --no-counters -o "$work/tune-decode.json" \
  >"$work/logs/tune.log" 2>&1
echo "tune rc=$?"; tail -2 "$work/logs/tune.log"
# The config with the best geometric mean of (kv GB/s / best kv GB/s of its problem) over the tuned problems runs
# the decode sweep (and becomes flash_decoding's default).
best=$(python3 - "$work/tune-decode.json" <<'PY'
import json, math, sys
try:
    recs = [r for r in json.load(open(sys.argv[1]))["benchmarks"] if r.get("status") == "ok"]
except Exception:
    recs = []
top = {}
for r in recs:
    k = r["name"].split("/")[-1]
    top[k] = max(top.get(k, 0), r["kv_gbps"])
score = {}
for r in recs:
    score.setdefault(r["config_str"], []).append(math.log(r["kv_gbps"] / top[r["name"].split("/")[-1]]))
full = [c for c, v in score.items() if len(v) == len(top)]
print(max(full, key=lambda c: sum(score[c])) if full else "")
PY
)
echo "best config: ${best:-default}"
spec=sweeps/decode.yaml
if [ -n "$best" ]; then
  spec="$work/decode.yaml"
  sed "s|^  flash_decoding: default|  flash_decoding:\n    configs: [{$(echo "$best" | sed 's/=/: /g; s/,/, /g; s/last_cta/1/; s/two_kernels/0/')}]|" \
    sweeps/decode.yaml > "$spec"
  grep -A2 "^variants" "$spec"
fi
stamp sweep
timeout $(left ${FB_SWEEP_S:-70}) $fb run "$spec" --no-counters -o "$work/decode.json" >"$work/logs/sweep.log" 2>&1
echo "sweep rc=$?"; tail -3 "$work/logs/sweep.log"
stamp peers
$fb plan sweeps/decode.yaml > "$work/plan.json" 2>>"$work/logs/peers.log"
PYTHONUNBUFFERED=1 timeout $(left ${FB_PEERS_S:-80}) python3 scripts/peers.py --problems "$work/plan.json" \
  --peers torch_cudnn,torch_flash --timeout 3 --ceilings -o "$work/peers-decode.json" >>"$work/logs/peers.log" 2>&1
echo "peers rc=$?"
stamp check
timeout $(left ${FB_CHECK_S:-50}) $fb check --variant flash_decoding >"$work/logs/check.log" 2>&1
echo "check rc=$?"; grep FAIL "$work/logs/check.log" | head -5; tail -1 "$work/logs/check.log"
stamp counters-repro
# For the CUPTI work: does the counters pass crash for a plain variant too, or only for flash_decoding?
for v in naive flash_decoding; do
  timeout $(left 25) $fb run --variant $v --shape batch=1,heads_q=8,heads_kv=2,seqlen_q=1,seqlen_kv=4096,head_dim=128,dtype=bf16 \
    -o "$work/ctr-$v.json" >"$work/logs/counters-$v.log" 2>&1
  echo "counters $v rc=$?"; grep -i -m2 "crash\|signal" "$work/logs/counters-$v.log"
done
