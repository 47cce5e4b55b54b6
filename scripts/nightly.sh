#!/usr/bin/env bash
# Nightly regression run: sweep -> compare with the last good baseline of this GPU -> history -> report.
# Exit status: 0 ok, 1 regression (from flashbench-report compare), 2 usage or setup error.
#   scripts/nightly.sh [STATE_DIR]   (default: $HOME/flashbench-nightly; keeps baselines and history.sqlite)
# Needs: build/flashbench (cmake build), flashbench-report (pip install ./reports).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${1:-${HOME}/flashbench-nightly}
FB=${FLASHBENCH:-build/flashbench}
[[ -x $FB ]] || { echo "nightly.sh: $FB not found; build first (cmake -B build && cmake --build build)" >&2; exit 2; }
# flashbench-report from pip, or straight from the checkout where nothing can be installed (an offline GPU runner).
report() {
  if command -v flashbench-report >/dev/null; then flashbench-report "$@"
  else PYTHONPATH="$PWD/reports${PYTHONPATH:+:$PYTHONPATH}" python3 -m flashbench_reports "$@"; fi
}
report --help >/dev/null 2>&1 || { echo "nightly.sh: flashbench-report not usable; pip install ./reports" >&2; exit 2; }
SPEC=${FLASHBENCH_NIGHTLY_SPEC:-sweeps/nightly.yaml}
SHA=$(git rev-parse HEAD 2>/dev/null) || SHA=unknown
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$STATE/runs" "$STATE/baselines"
RUN="$STATE/runs/nightly-$STAMP-${SHA:0:12}.json"

"$FB" run "$SPEC" -o "$RUN"
SLUG=$(python3 -c 'import json,sys; print(((json.load(open(sys.argv[1])).get("context") or {}).get("device") or {}).get("slug") or "unknown")' "$RUN")
BASE="$STATE/baselines/$SLUG.json"
OUT="$STATE/reports/$STAMP"
mkdir -p "$OUT"

report history ingest "$RUN" --db "$STATE/history.sqlite" --git-sha "$SHA"
report html "$RUN" -o "$OUT/html"
report history plot --db "$STATE/history.sqlite" -o "$OUT/history"

status=0
if [[ -f $BASE ]]; then
  report compare "$BASE" "$RUN" -o "$OUT/compare.md" || status=$?
else
  echo "nightly.sh: no baseline for $SLUG yet; this run becomes it"
fi
# Only a clean run moves the baseline, so a regression keeps failing until it is fixed or accepted
# (accept by copying the run over $BASE by hand).
[[ $status -eq 0 ]] && cp "$RUN" "$BASE"
echo "nightly.sh: results $RUN, reports $OUT"
exit $status
