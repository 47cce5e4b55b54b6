#!/usr/bin/env bash
# Bring-up on this GPU: probe the ceilings, run the bring-up sweep (every catalog variant on compute-bound prefill and
# memory-bound decode; sweeps/bringup.yaml), time the torch peers where torch is present, and write the reports.
#   scripts/bringup.sh OUT_DIR                 -> OUT_DIR/<gpu-slug>.json (+ -peers.json), OUT_DIR/report/
#   scripts/bringup.sh OUT_DIR OTHER_GPU.json  -> also OUT_DIR/bringup/: OTHER_GPU.json as A, this GPU as B, each
#                                                 point's speed-up against the ratio of the measured ceilings
# Run it on each GPU and pass the first GPU's OUT_DIR/<slug>.json to the second; scripts/make_examples.py turns the
# two files into reports/examples/bringup-<a>-<b>/.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: scripts/bringup.sh OUT_DIR [OTHER_GPU.json]" >&2; exit 2; }
OUT=$1; OTHER=${2:-}
FB=${FLASHBENCH:-build/flashbench}
[[ -x $FB ]] || { echo "bringup.sh: $FB not found; build first (cmake -B build && cmake --build build)" >&2; exit 2; }
[[ -z $OTHER || -f $OTHER ]] || { echo "bringup.sh: $OTHER: no such results file; pass the other GPU's <slug>.json" >&2; exit 2; }
if command -v flashbench-report >/dev/null; then REPORT=(flashbench-report); else REPORT=(env PYTHONPATH=reports python3 -m flashbench_reports); fi
mkdir -p "$OUT"
"$FB" probe -o "$OUT/probe.json"
"$FB" run sweeps/bringup.yaml -o "$OUT/run.json"
SLUG=$(python3 -c 'import json,sys; print(((json.load(open(sys.argv[1])).get("context") or {}).get("device") or {}).get("slug") or "gpu")' "$OUT/run.json")
mv "$OUT/run.json" "$OUT/$SLUG.json"
INPUTS=("$OUT/$SLUG.json")
if python3 -c "import torch" 2>/dev/null && "$FB" plan sweeps/bringup.yaml > "$OUT/plan.json" 2>/dev/null; then
  python3 scripts/peers.py --problems "$OUT/plan.json" -o "$OUT/$SLUG-peers.json" --ceilings ||
    echo "bringup.sh: peers.py failed (above); the report goes on without peers" >&2
  if [[ -f $OUT/$SLUG-peers.json ]]; then INPUTS+=("$OUT/$SLUG-peers.json"); fi
else
  echo "bringup.sh: torch not importable (or 'flashbench plan' failed); no peers timed" >&2
fi
"${REPORT[@]}" html "${INPUTS[@]}" -o "$OUT/report"
if [[ -n $OTHER ]]; then
  "${REPORT[@]}" bringup "$OTHER" "$OUT/$SLUG.json" -o "$OUT/bringup"
fi
echo "bringup.sh: $OUT/$SLUG.json, report $OUT/report${OTHER:+, comparison $OUT/bringup}"
