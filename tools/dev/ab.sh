#!/usr/bin/env bash
# Same-call A/B of two source trees on a GPU machine: builds A (OLD_TREE) and B (this tree) side by side, then runs
# SPEC with A and B in turn, PASSES times each (A B B A A B ... so neither side always runs first), and compares
# the passes with tools/dev/ab_compare.py. Results go to OUTDIR/{a,b}N.json and OUTDIR/ab.txt.
#   tools/dev/ab.sh OLD_TREE SPEC OUTDIR [PASSES]
# The SPEC must name configs both builds know (explicit configs: a default may differ between the two).
set -uo pipefail
old=$(cd "${1:?usage: tools/dev/ab.sh OLD_TREE SPEC OUTDIR [PASSES]}" && pwd)
spec=$(realpath "${2:?SPEC}"); out=$(mkdir -p "${3:?OUTDIR}" && cd "$3" && pwd); passes=${4:-2}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# Both sides build for sm_90 only unless FLASHBENCH_CMAKE_ARGS says otherwise; B builds in this tree's build folder
# (scripts/env.sh), so a build made there before with the same arguments is reused. AB_A_SHA stamps A's results.
args="${FLASHBENCH_CMAKE_ARGS:--DCMAKE_CUDA_ARCHITECTURES=90-real}"
( cd "$old" && source scripts/env.sh && FB_BUILD=/tmp/ab-a && FLASHBENCH_SOURCE_SHA="${AB_A_SHA:-}" \
  FLASHBENCH_CMAKE_ARGS="$args -DFLASHBENCH_BUILD_TESTS=OFF" fb_configure && fb_build --target flashbench ) \
  >"$out/build-a.log" 2>&1 &
( source "$here/scripts/env.sh" && FLASHBENCH_CMAKE_ARGS="$args" fb_configure && fb_build --target flashbench && \
  ln -sfn "$FB_BUILD" /tmp/ab-b ) >"$out/build-b.log" 2>&1 &
wait
for s in a b; do [ -x /tmp/ab-$s/flashbench ] || { echo "ab.sh: build $s failed"; tail -20 "$out/build-$s.log"; exit 1; }; done
order=""
for ((i = 0; i < passes; i++)); do ((i % 2)) && order+="b$i a$i " || order+="a$i b$i "; done
for run in $order; do
  side=${run:0:1}
  /tmp/ab-$side/flashbench run "$spec" --no-counters -o "$out/$run.json" >"$out/run-$run.log" 2>&1
  echo "ab.sh: $run exit $?"
done
python3 "$here/tools/dev/ab_compare.py" --a "$out"/a*.json --b "$out"/b*.json | tee "$out/ab.txt"
