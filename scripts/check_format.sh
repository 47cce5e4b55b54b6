#!/usr/bin/env bash
# Checks that every tracked C++/CUDA file is formatted by .clang-format (clang-format --dry-run --Werror). CI runs
# it after the tests (.ci/run). The tree is formatted with Debian's clang-format 14; another major version may lay
# out a few constructs differently, so elsewhere a mismatch in version is reported and the check skipped.
#   scripts/check_format.sh          check; exit 1 and name the files that differ
#   scripts/check_format.sh --fix    format them in place
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
want=14
if ! command -v clang-format >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang-format >/dev/null 2>&1 || true
  fi
fi
command -v clang-format >/dev/null 2>&1 || { echo "check_format: SKIPPED: no clang-format (apt-get install clang-format)"; exit 0; }
have=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [ "$have" != "$want" ]; then
  echo "check_format: SKIPPED: clang-format $have here; the tree is formatted with clang-format $want"
  exit 0
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh' 2>/dev/null)
[ ${#files[@]} -gt 0 ] || { echo "check_format: no C++ files found (not a git checkout?)"; exit 2; }
if [ "${1:-}" = --fix ]; then clang-format -i "${files[@]}"; exit 0; fi
bad=()
for f in "${files[@]}"; do clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f"); done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} of ${#files[@]} files differ from .clang-format: ${bad[*]}"
  echo "check_format: run scripts/check_format.sh --fix"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
