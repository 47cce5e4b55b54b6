#!/usr/bin/env bash
# Installs what flashbench needs to build and test, from Debian packages and PyPI, only when it is missing.
# Safe to run repeatedly; on a machine without network (a GPU runner) it installs nothing and says what is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Debian packages: compiler tool chain and the C++ libraries found with find_package.
need_pkgs=()
for pkg in cmake g++ make libbenchmark-dev libgtest-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev \
           libbenchmark-tools ${FLASHBENCH_EXTRA_PKGS:-}; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_pkgs+=("$pkg")
done
if ((${#need_pkgs[@]})); then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "deps: installing ${need_pkgs[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
  else
    echo "deps: missing Debian packages (${need_pkgs[*]}); install them or make sure find_package can see them"
  fi
fi

# The CUDA toolkit is not a Debian package here: it must already be installed (nvcc on PATH or in /usr/local/cuda).
if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "deps: nvcc is in /usr/local/cuda/bin; add it to PATH (scripts do this themselves)"
  else
    echo "deps: error: no CUDA toolkit (nvcc) found; install CUDA 12 or 13 first" >&2
    exit 2
  fi
fi

# cuobjdump (and the nvdisasm it runs) for the SASS test (tests/CMakeLists.txt: fa3_sass); some CUDA installs
# leave them out. NVIDIA's pip wheels carry both (the test finds them there); without network it reports SKIPPED.
if ! command -v cuobjdump >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/cuobjdump ] &&
   ! python3 -c 'import glob, nvidia, sys; sys.exit(not any(glob.glob(p + "/cu*/bin/cuobjdump") for p in nvidia.__path__))' >/dev/null 2>&1; then
  echo "deps: installing cuobjdump and nvdisasm (pip: nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
  python3 -m pip install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm ||
    echo "deps: pip install failed; the SASS test will be skipped"
fi

# Python: the reports package and its test tools.
if [ "${FLASHBENCH_SKIP_PY:-0}" != 1 ]; then
  if ! python3 -c 'import flashbench_reports, matplotlib, pytest' >/dev/null 2>&1; then
    echo "deps: installing the reports package (pip)"
    python3 -m pip install -q -e "$here/reports[test]" || echo "deps: pip install failed; report tests will not run"
  fi
fi
