#!/usr/bin/env bash
# First GPU pass for fa3_pipelined (issue #7) on an H100/H200, with flashbench already built at $FB_BUILD
# (scripts/env.sh): (1) the one-tile layout self-check, which prints "FA3 SELF-CHECK <case>: PASS|FAIL ..." and,
# on a failure, a diagnosis naming the suspect (K-major descriptor, V descriptor LBO, P fragment, ...); (2) the
# whole FA3 gtest filter; (3) `flashbench check --variant fa3_pipelined`; (4) only if those pass, a light timing
# run (v3: the v2 best, separate K/V release at 2 stages, block_n 192 + overlap, stages 4 and 3 consumer
# warpgroups at d64) at d128/d64, N = 1024/4096/8192, causal and not, next to torch SDPA cuDNN/flash.
# Points a config does not support (stages 4 or 3 consumers at d128) are skipped by the harness and not printed.
# Budget: FB_BUDGET_S (default 215 s, under 4 minutes with the start-up). OUTDIR gets 2 files: summary.txt (everything printed here) and
# fa3-gpu.tgz (results JSON, peers JSON, full logs).
#   usage: FLASHBENCH_BUILD_DIR=build scripts/dev/fa3-gpu.sh OUTDIR
set -uo pipefail
out="${1:?usage: scripts/dev/fa3-gpu.sh OUTDIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$root/scripts/env.sh"
mkdir -p "$out"
work=$(mktemp -d)
mkdir -p "$work/logs"
t0=$(date +%s)
budget=${FB_BUDGET_S:-215}
left() { local l=$(( budget - ($(date +%s) - t0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
finish() {
  stamp done
  tar czf "$out/fa3-gpu.tgz" -C "$work" . 2>/dev/null
}
exec > >(tee "$out/summary.txt") 2>&1
trap finish EXIT
fb="$FB_BUILD/flashbench"
tk="$FB_BUILD/tests/test_kernels"
for x in "$fb" "$tk"; do [ -x "$x" ] || { echo "missing $x: build flashbench first (FB_BUILD=$FB_BUILD)"; exit 2; }; done
nvidia-smi --query-gpu=name,compute_cap,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader

stamp self-check
timeout $(left 60) "$tk" --gtest_filter='Layout/Fa3SelfCheck.*' >"$work/logs/selfcheck.log" 2>&1
rc=$?
grep -E "FA3 SELF-CHECK|diagnosis|SKIPPED|launch failed" "$work/logs/selfcheck.log"
if [ $rc -ne 0 ]; then
  [ $rc -eq 124 ] && echo "self-check TIMED OUT: a hang = mbarrier parity / expect_tx bytes / named-barrier counts (see NOTES.md, 'If the first GPU run fails')"
  tail -30 "$work/logs/selfcheck.log"
  echo "self-check rc=$rc: stopping before the full tests"; exit 1
fi

stamp tests
timeout $(left 100) "$tk" --gtest_filter='*Fa3*' >"$work/logs/tests.log" 2>&1
rc=$?
echo "tests rc=$rc"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests? ran" "$work/logs/tests.log" | head -25
grep -m5 -B2 -A6 "Failure" "$work/logs/tests.log" | head -60
[ $rc -eq 124 ] && echo "tests TIMED OUT (a config hangs: compare the last test started in logs/tests.log)"

stamp check
timeout $(left 40) "$fb" check --variant fa3_pipelined >"$work/logs/check.log" 2>&1
crc=$?
echo "check rc=$crc"; grep -m8 -E "FAIL|incorrect|crash|timeout" "$work/logs/check.log"; tail -2 "$work/logs/check.log"
if [ $rc -ne 0 ] || [ $crc -ne 0 ]; then echo "not timing: correctness first"; exit 1; fi

stamp timing
cat > "$work/fa3-time.yaml" <<'YAML'
name: fa3-v3
timing:
  min_samples: 5
  max_noise: 0.02
  min_time_s: 0.03
  timeout_s: 0.5
problems:
  - name: prefill
    tokens: 16384
    hidden: 2048
    seqlen: [1024, 4096, 8192]
    head_dim: [64, 128]
    causal: [false, true]
    dtype: bf16
variants:
  fa3_pipelined:
    configs:
      # v2 best (reference), then v3: K and V slots released separately (2 stages + overlap now viable)
      - {block_m: 128, block_n: 128, stages: 3, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on}
      - {block_m: 128, block_n: 128, stages: 2, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on}
      - {block_m: 128, block_n: 192, stages: 2, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on}
      - {block_m: 128, block_n: 192, stages: 2, consumer_wgs: 2, pingpong: on, intra_wg_overlap: off}
      # d64 only (d128 refuses: shared memory / 3 consumers need head_dim 64)
      - {block_m: 128, block_n: 128, stages: 4, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on}
      - {block_m: 128, block_n: 192, stages: 3, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on}
      - {block_m: 128, block_n: 192, stages: 4, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on}
      - {block_m: 192, block_n: 128, stages: 2, consumer_wgs: 3, pingpong: on, intra_wg_overlap: on}
      - {block_m: 192, block_n: 128, stages: 3, consumer_wgs: 3, pingpong: on, intra_wg_overlap: on}
      - {block_m: 192, block_n: 128, stages: 4, consumer_wgs: 3, pingpong: on, intra_wg_overlap: on}
      - {block_m: 192, block_n: 128, stages: 4, consumer_wgs: 3, pingpong: off, intra_wg_overlap: on}
      - {block_m: 192, block_n: 64, stages: 4, consumer_wgs: 3, pingpong: on, intra_wg_overlap: on}
YAML
stamp peers
"$fb" plan "$work/fa3-time.yaml" > "$work/plan.json" 2>>"$work/logs/peers.log"
PYTHONUNBUFFERED=1 timeout $(left 60) python3 "$root/scripts/peers.py" --problems "$work/plan.json" \
  --peers torch_cudnn,torch_flash --timeout 0.5 --min-time 0.03 -o "$work/peers.json" >>"$work/logs/peers.log" 2>&1
echo "peers rc=$?"
stamp timing-fa3
timeout $(left 140) "$fb" run "$work/fa3-time.yaml" --no-counters -o "$work/fa3.json" >"$work/logs/run.log" 2>&1
echo "run rc=$?"; tail -2 "$work/logs/run.log"
python3 - "$work/fa3.json" "$work/peers.json" <<'PY'
import json, sys
rows = {}
for path in sys.argv[1:]:
    try:
        recs = json.load(open(path))["benchmarks"]
    except Exception as e:
        try:  # a run cut short by its time limit leaves only the partial records
            recs = [json.loads(l) for l in open(path + ".partial.jsonl") if l.strip()]
        except Exception:
            print(f"(no {path}: {e})"); continue
    for r in recs:
        key = r["name"].split("/")[-1]
        who = r.get("variant", "?") + ("[" + r["config_str"] + "]" if r.get("config_str") else "")
        st = r.get("status", "ok")
        if st != "ok" and "skip" in str(st):
            continue  # unsupported here (e.g. stages 4 or 3 consumers at d128)
        val = r.get("tflops") if st == "ok" else st
        rows.setdefault(key, []).append((who, val))
for key in sorted(rows):
    print(key)
    for who, val in sorted(rows[key], key=lambda x: -(x[1] if isinstance(x[1], (int, float)) else -1)):
        print(f"   {val if not isinstance(val, float) else round(val, 1):>10}  {who}")
PY
