#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the C++ suites through CTest (GPU tests report SKIPPED
# without a device) and the reports package through pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
FLASHBENCH_EXTRA_PKGS="chromium ${FLASHBENCH_EXTRA_PKGS:-}" bash "$FB_ROOT/scripts/deps.sh"
start=$(date +%s)
fb_configure
fb_build
echo "build: $(( $(date +%s) - start )) s"
(cd "$FB_BUILD" && ctest --output-on-failure -j "$FB_JOBS" ${CTEST_ARGS:-})
if [ "${FLASHBENCH_SKIP_PY:-0}" != 1 ]; then
  python3 -m pytest -q "$FB_ROOT/reports/tests"
fi
