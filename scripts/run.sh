#!/usr/bin/env bash
# The main job: checks what the build needs (installing only what is missing, where it can), builds flashbench,
# runs the quick sweep (sweeps/quick.yaml, or the spec given) into results/<gpu>/<spec>.json and prints a summary:
# the best rate per variant and shape against the ceilings measured on this GPU (scripts/summary.py).
# Without a GPU it says so and prints the dry-run plan. Exit status: flashbench's (1: some point was not ok).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
spec="${1:-$FB_ROOT/sweeps/quick.yaml}"
t0=$(date +%s)
bash "$FB_ROOT/scripts/deps.sh" build
# flashbench alone needs no GoogleTest: where it is missing, the build goes on without the tests (scripts/test.sh
# turns them back on). Otherwise the build folder keeps its tests, for ctest and scripts/test.sh.
log=$(mktemp)
if ! fb_configure 2>"$log"; then
  grep -q GTest "$log" || { cat "$log" >&2; rm -f "$log"; exit 1; }
  echo "run.sh: GoogleTest not found: building flashbench without the tests"
  fb_configure -DFLASHBENCH_BUILD_TESTS=OFF
else
  cat "$log" >&2 # CMake's warnings (a build without CUPTI, for one)
fi
rm -f "$log"
fb_build --target flashbench
t1=$(date +%s)
echo "run.sh: deps and build took $((t1 - t0)) s"
fb="$FB_BUILD/flashbench"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run.sh: no CUDA device on this machine: nothing was measured. The plan for $spec follows."
  exec "$fb" run --dry-run "$spec"
fi
slug=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 |
       tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9]+/-/g; s/^-|-$//g')
out="${FLASHBENCH_OUT:-$FB_ROOT/results/$slug}/$(basename "$spec" .yaml).json"
if [ -e "$out" ]; then # an earlier run's results are kept, under the time they were written
  kept="${out%.json}-$(date -r "$out" +%Y%m%d-%H%M%S).json"
  mv "$out" "$kept"
  echo "run.sh: kept the previous results as $kept"
fi
mkdir -p "$(dirname "$out")"  # flashbench run refuses a missing directory rather than create it
rc=0
"$fb" run "$spec" -o "$out" || rc=$?
echo "run.sh: the sweep took $(( $(date +%s) - t1 )) s (exit $rc)"
if [ -f "$out" ]; then
  echo
  if command -v python3 >/dev/null 2>&1; then python3 "$FB_ROOT/scripts/summary.py" "$out" || true
  else echo "run.sh: no python3 here: no summary (the results are in $out)"; fi
  echo "results: $out"
fi
exit $rc
