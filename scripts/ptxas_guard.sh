#!/usr/bin/env bash
# Compiler launcher of the Hopper kernels (CUDA_COMPILER_LAUNCHER of kernels/fa3_pipelined, fa3_fp8 and fa3_bwd):
# runs the compile it is given and fails it when ptxas serialised wgmma instructions. ptxas reports that as an
# info line ("(C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to ..."), which
# -Xptxas --warning-as-error does not turn into an error, and a serialised kernel runs 10-15% slower (fa3_bwd,
# kernels/fa3_bwd/HISTORY.md). scripts/check_sass.py (CTest fa3_sass) checks the machine code for the same thing.
#   scripts/ptxas_guard.sh COMPILER ARGS...
set -uo pipefail
err=$(mktemp)
trap 'rm -f "$err"' EXIT
"$@" 2>"$err"
rc=$?
cat "$err" >&2
if [ $rc -eq 0 ] && grep -q "wgmma.mma_async instructions are serialized" "$err"; then
  src=$(printf '%s\n' "$@" | grep -E '\.cu$' | tail -n 1)
  echo "ptxas_guard: ptxas serialised wgmma in ${src:-this compile} (the info line above): free registers in the kernel it names, or that kernel loses 10-15%" >&2
  # No object left behind, so that the next build compiles it again rather than taking it as up to date.
  prev=""
  for a in "$@"; do
    [ "$prev" = "-o" ] && rm -f "$a"
    prev=$a
  done
  rc=1
fi
exit $rc
