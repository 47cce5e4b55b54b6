#!/usr/bin/env bash
# Nightly regression gate, paired: this build (the candidate) against the last build that passed on this GPU model
# (the reference), timed on the same GPU, interleaved sample by sample (scripts/nightly_paired.py). Host-to-host
# drift of a pool of runners cancels: both builds run on the one machine the job landed on.
#   scripts/nightly.sh [STATE_DIR]   (default: $HOME/flashbench-nightly)
# STATE_DIR keeps reference/<gpu-slug>/ (flashbench, libflashbench_capi.so, BUILD_ID), runs/, reports/ and
# history.sqlite. Settings (environment):
#   FLASHBENCH_BUILD        the candidate build folder (default build/): cmake --build build --target flashbench
#                           flashbench_capi
#   FLASHBENCH_NIGHTLY_SPEC the spec (default sweeps/nightly.yaml)
#   FLASHBENCH_REF_COMMIT   where this GPU model has no reference yet: build one at this commit (a git worktree
#                           under STATE_DIR, the same cmake flags as the candidate's build). Without it the first
#                           night checks the candidate alone (flashbench run) and, if it passes, keeps it as the
#                           reference.
# Exit status: 0 pass, 1 regression or a point that now fails, 2 usage or setup error. A regression keeps the old
# reference, so the gate stays red until the change is fixed or accepted (accept: delete reference/<slug>/).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${1:-${HOME}/flashbench-nightly}
BUILD=${FLASHBENCH_BUILD:-build}
SPEC=${FLASHBENCH_NIGHTLY_SPEC:-sweeps/nightly.yaml}
die() { echo "nightly.sh: $*" >&2; exit 2; }
for f in flashbench libflashbench_capi.so; do
  [[ -e $BUILD/$f ]] || die "$BUILD/$f not found; build it (cmake --build $BUILD --target flashbench flashbench_capi)"
done
report() {  # flashbench-report from pip, or straight from the checkout (an offline GPU runner)
  if command -v flashbench-report >/dev/null; then flashbench-report "$@"
  else PYTHONPATH="$PWD/reports${PYTHONPATH:+:$PYTHONPATH}" python3 -m flashbench_reports "$@"; fi
}
SHA=$(git rev-parse HEAD 2>/dev/null) || SHA=unknown
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
# The GPU model names the reference, as it names tuning tables: lower case, non-alphanumerics folded to '-'.
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader -i "${CUDA_VISIBLE_DEVICES%%,*}" 2>/dev/null | head -1) ||
  GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) || die "nvidia-smi found no GPU"
SLUG=$(python3 -c 'import re,sys; print(re.sub(r"[^a-z0-9]+", "-", sys.argv[1].lower()).strip("-"))' "$GPU")
REF="$STATE/reference/$SLUG"
mkdir -p "$STATE/runs" "$STATE/reports/$STAMP" "$STATE/reference"
OUT="$STATE/reports/$STAMP"
RUN="$STATE/runs/nightly-$STAMP-${SHA:0:12}.json"
echo "$SHA" >"$BUILD/BUILD_ID"

install_reference() {  # the candidate becomes the reference of this GPU model: the last build that passed
  rm -rf "$REF.new" && mkdir -p "$REF.new"
  cp "$BUILD/flashbench" "$BUILD/libflashbench_capi.so" "$BUILD/BUILD_ID" "$REF.new/"
  rm -rf "$REF" && mv "$REF.new" "$REF"
  echo "nightly.sh: $SHA is now the reference for $SLUG"
}

if [[ ! -d $REF && -n ${FLASHBENCH_REF_COMMIT:-} ]]; then
  src="$STATE/src-ref"
  git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
  git worktree add --detach "$src" "$FLASHBENCH_REF_COMMIT" >/dev/null
  flags=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release ${flags:+-DCMAKE_CUDA_ARCHITECTURES=$flags} >/dev/null
  cmake --build "$src/build" -j"$(nproc)" --target flashbench flashbench_capi >/dev/null
  mkdir -p "$REF" && cp "$src/build/flashbench" "$src/build/libflashbench_capi.so" "$REF/"
  git -C "$src" rev-parse HEAD >"$REF/BUILD_ID"
  echo "nightly.sh: built the reference for $SLUG at $(cat "$REF/BUILD_ID")"
fi

status=0
if [[ -d $REF ]]; then
  python3 scripts/nightly_paired.py --ref "$REF" --cand "$BUILD" --spec "$SPEC" -o "$RUN" || status=$?
  [[ $status -le 1 ]] || exit "$status"
else
  echo "nightly.sh: no reference build for $SLUG yet; checking this build alone (it becomes the reference if it passes)"
  "$BUILD/flashbench" run "$SPEC" -o "$RUN" || status=$?
fi
report history ingest "$RUN" --db "$STATE/history.sqlite" --git-sha "$SHA"
report history plot --db "$STATE/history.sqlite" -o "$OUT/history" >/dev/null
[[ $status -eq 0 ]] && install_reference
echo "nightly.sh: results $RUN, history $OUT/history/index.html, exit $status"
exit "$status"
