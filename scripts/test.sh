#!/usr/bin/env bash
# Checks what the build and the tests need (installing only what is missing, where it can), builds, and runs every
# test: the C++ suites and the scripts' tests through CTest (GPU tests report SKIPPED without a device) and the
# reports package through pytest. Set FLASHBENCH_SKIP_PY=1 to leave pytest out.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash "$FB_ROOT/scripts/deps.sh" test
start=$(date +%s)
fb_configure -DFLASHBENCH_BUILD_TESTS=ON
fb_build
echo "build: $(( $(date +%s) - start )) s"
(cd "$FB_BUILD" && ctest --output-on-failure -j "$FB_JOBS" ${CTEST_ARGS:-})
if [ "${FLASHBENCH_SKIP_PY:-0}" != 1 ]; then
  if ! python3 -c 'import matplotlib, numpy, pytest' >/dev/null 2>&1; then
    echo "test.sh: the reports' tests did NOT run: python3 with matplotlib, numpy and pytest is missing (see deps above)" >&2
    exit 1
  fi
  python3 -m pytest -q "$FB_ROOT/reports/tests"
fi
