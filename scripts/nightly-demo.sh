#!/usr/bin/env bash
# Exercises the nightly gate on a GPU: two clean runs of the same build must report zero regressions; a third run
# with one variant deliberately slowed (FLASHBENCH_TEST_SLOWDOWN launches it twice per timed sample) must exit 1
# and name exactly that variant's points. Uses sweeps/ci/nightly-smoke.yaml and a fresh state folder under OUTDIR.
#   scripts/nightly-demo.sh OUTDIR [SLOWED_VARIANT]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?OUTDIR}; slowed=${2:-fa1_kv_outer}
state="$out/state"; rm -rf "$state"; mkdir -p "$out"
export FLASHBENCH_NIGHTLY_SPEC=sweeps/ci/nightly-smoke.yaml
run() { bash scripts/nightly.sh "$state" >"$out/nightly$1.log" 2>&1; echo $?; }
rc1=$(run 1); rc2=$(run 2)
rc3=$(FLASHBENCH_TEST_SLOWDOWN=$slowed run 3)
md=$(ls -t "$state"/reports/*/compare.md | head -1)
echo "run 1 (becomes the baseline): exit $rc1"
echo "run 2 (same build):           exit $rc2   $(grep -c -i 'regress' "$(ls -t "$state"/reports/*/compare.md | sed -n 2p)" 2>/dev/null) lines mention regressions"
echo "run 3 ($slowed slowed x2):    exit $rc3"
echo "--- compare.md of run 3 ---"; cat "$md"
cp "$md" "$out/compare-slowed.md"
