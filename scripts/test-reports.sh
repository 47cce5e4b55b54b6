#!/usr/bin/env bash
# Installs what the reports/ tests need on a fresh Debian/Ubuntu machine and runs them (CPU only, < 2 min).
# Set SKIP_INSTALL=1 where the dependencies are already present.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
  if command -v apt-get >/dev/null; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq chromium libbenchmark-tools
  fi
  python3 -m pip install -q matplotlib numpy scipy pytest
  python3 -m pip install -q ./reports
fi
exec python3 -m pytest -q reports/tests "$@"
