#!/usr/bin/env bash
# For a GPU CI runner: build with all cores, run every test (GPU tests included), check every variant x config on
# the awkward shapes, run the quick sweep and (when torch is there) the peers, and put results and logs in OUTDIR.
# The runner is expected to be provisioned (CUDA, cmake and the libraries in the README); nothing is installed here
# and no network is needed (scripts/deps.sh test, run by hand, names what is missing).
# Exit status: non-zero if any step failed; every step still runs so one failure does not hide the others.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
outdir="${1:?usage: scripts/gpu-ci.sh OUTDIR [SPEC]}"
spec="${2:-$FB_ROOT/sweeps/quick.yaml}"
mkdir -p "$outdir"
status=0
step() { # name, command...
  local name=$1; shift
  local t0=$(date +%s)
  if "$@" >"$outdir/$name.log" 2>&1; then echo "gpu-ci: $name ok ($(( $(date +%s) - t0 )) s)"
  else local rc=$?; echo "gpu-ci: $name FAILED (exit $rc, $(( $(date +%s) - t0 )) s); see $name.log"; tail -n 30 "$outdir/$name.log"; status=1; fi
}
nvidia-smi -L || { echo "gpu-ci: no GPU visible: this script is for GPU runners"; exit 1; }
step build bash -c "source '$FB_ROOT/scripts/env.sh'; fb_configure -DFLASHBENCH_BUILD_TESTS=ON && fb_build"
fb="$FB_BUILD/flashbench"
step tests bash -c "cd '$FB_BUILD' && ctest --output-on-failure -j 4 -L 'gpu|cpu'"
step check "$fb" check
results="$outdir/$(basename "$spec" .yaml).json"
step sweep "$fb" run "$spec" -o "$results"
[ -f "$results" ] && step summary python3 "$FB_ROOT/scripts/summary.py" "$results" && cat "$outdir/summary.log"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null && [ -f "$FB_ROOT/scripts/peers.py" ]; then
  step peers bash -c "'$fb' plan '$spec' > '$outdir/plan.json' && python3 '$FB_ROOT/scripts/peers.py' --problems '$outdir/plan.json' --ceilings --timeout 2 -o '$outdir/peers.json'"
fi
exit $status
