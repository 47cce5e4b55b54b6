#!/usr/bin/env bash
# Bring-up on this GPU: probe the ceilings, run the bring-up sweep (plus torch peers when torch is present).
#   scripts/bringup.sh OUT_DIR                 -> OUT_DIR/<gpu-slug>.json (+ peers), OUT_DIR/report/
#   scripts/bringup.sh OUT_DIR OTHER_GPU.json  -> also OUT_DIR/bringup/ comparing OTHER_GPU.json with this GPU
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: scripts/bringup.sh OUT_DIR [OTHER_GPU.json]" >&2; exit 2; }
OUT=$1; OTHER=${2:-}
FB=${FLASHBENCH:-build/flashbench}
[[ -x $FB ]] || { echo "bringup.sh: $FB not found; build first (cmake -B build && cmake --build build)" >&2; exit 2; }
mkdir -p "$OUT"
"$FB" probe -o "$OUT/probe.json"
"$FB" run sweeps/bringup.yaml -o "$OUT/run.json"
SLUG=$(python3 -c 'import json,sys; print(((json.load(open(sys.argv[1])).get("context") or {}).get("device") or {}).get("slug") or "gpu")' "$OUT/run.json")
mv "$OUT/run.json" "$OUT/$SLUG.json"
INPUTS=("$OUT/$SLUG.json")
if "$FB" plan sweeps/bringup.yaml > "$OUT/plan.json" 2>/dev/null; then
  python3 scripts/peers.py --problems "$OUT/plan.json" -o "$OUT/$SLUG-peers.json" --ceilings
  [[ -f $OUT/$SLUG-peers.json ]] && INPUTS+=("$OUT/$SLUG-peers.json")
fi
flashbench-report html "${INPUTS[@]}" -o "$OUT/report"
if [[ -n $OTHER ]]; then
  flashbench-report bringup "$OTHER" "$OUT/$SLUG.json" -o "$OUT/bringup"
fi
echo "bringup.sh: $OUT/$SLUG.json, report $OUT/report${OTHER:+, comparison $OUT/bringup}"
