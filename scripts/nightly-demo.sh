#!/usr/bin/env bash
# Checks the paired nightly gate on a GPU (one call of a few minutes): the same build as reference and candidate,
# RUNS times, must flag nothing; then the candidate with VARIANT slowed by FRACTION (a calibrated spin, test only),
# RUNS times, must flag that variant's points and nothing else. Uses sweeps/ci/nightly-smoke.yaml (every variant,
# >= 12 points). Prints one table row per run: machine (GPU UUID / host id), points, flagged, false regressions,
# missed, unknown. Stops starting runs once BUDGET_S seconds have passed, so that it fits one GPU call.
#   scripts/nightly-demo.sh OUTDIR [RUNS] [VARIANT:FRACTION] [BUDGET_S]
#   e.g. scripts/nightly-demo.sh /tmp/gate 3 fa2_q_outer:0.03 420
# Needs build/flashbench and build/libflashbench_capi.so (FLASHBENCH_BUILD to use another build folder), torch.
# Exit 0 when every run came out right, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?OUTDIR}; runs=${2:-3}; slow=${3:-fa2_q_outer:0.03}; budget=${4:-420}
build=${FLASHBENCH_BUILD:-build}
spec=${FLASHBENCH_DEMO_SPEC:-sweeps/ci/nightly-smoke.yaml}
mkdir -p "$out/ref"
# The same build on both sides: a copy, so that the two libraries are two files, as two builds' would be.
cp "$build/flashbench" "$build/libflashbench_capi.so" "$out/ref/" || exit 2
git rev-parse HEAD >"$out/ref/BUILD_ID" 2>/dev/null; cp "$out/ref/BUILD_ID" "$build/BUILD_ID" 2>/dev/null
start=$SECONDS
files=()
for i in $(seq 1 "$runs"); do  # same and slowed runs alternate, so a spent budget leaves both kinds
  for kind in same slow; do
    (( SECONDS - start < budget )) || { echo "nightly-demo.sh: budget of ${budget}s spent; stopping"; break 2; }
    f="$out/$kind-$(date -u +%H%M%S)-$i.json"
    args=(--ref "$out/ref" --cand "$build" --spec "$spec" -o "$f")
    [[ $kind == slow ]] && args+=(--test-slowdown "$slow")
    python3 scripts/nightly_paired.py "${args[@]}" >"$f.log" 2>&1
    rc=$?
    (( rc <= 1 )) || { echo "nightly-demo.sh: run failed (exit $rc):"; tail -5 "$f.log"; exit 2; }
    files+=("$f")
  done
done
python3 scripts/nightly_paired.py table "${files[@]}"
