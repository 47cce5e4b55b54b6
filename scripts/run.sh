#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the quick sweep (sweeps/quick.yaml, or the spec given)
# into results/<gpu>/quick.json. Without a GPU it says so and prints the dry-run plan.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
spec="${1:-$FB_ROOT/sweeps/quick.yaml}"
FLASHBENCH_SKIP_PY="${FLASHBENCH_SKIP_PY:-1}" bash "$FB_ROOT/scripts/deps.sh"
fb_configure
fb_build --target flashbench
fb="$FB_BUILD/flashbench"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run.sh: no CUDA device on this machine: nothing was measured. The plan for $spec follows."
  exec "$fb" run --dry-run "$spec"
fi
slug=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 |
       tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9]+/-/g; s/^-|-$//g')
out="${FLASHBENCH_OUT:-$FB_ROOT/results/$slug}/$(basename "$spec" .yaml).json"
mkdir -p "$(dirname "$out")"  # flashbench run refuses a missing directory rather than create it
"$fb" run "$spec" -o "$out"
