#!/usr/bin/env bash
# Checks what flashbench needs by capability (a command on PATH, a package that CMake's find_package finds), never
# by Debian package name: a GPU runner may have cmake from pip or a tarball and the libraries under /usr/local.
# Only what is missing is installed (apt as root, pip); where that cannot happen (no network, not root) it says what
# is missing and goes on when the build still can.
#   scripts/deps.sh [build|test]
#     build (default): what scripts/run.sh needs to build and run flashbench
#     test:            also what scripts/test.sh needs (GoogleTest, the reports' Python packages) and the optional
#                      tools of some tests (chromium, Google Benchmark's compare.py, cuobjdump, Slurm); a test
#                      whose tool is missing reports SKIPPED
# Exit status: 0 when everything required is there (optional tools may be missing: each is named), 2 when the build
# cannot go on (each missing piece is named with the Debian package that provides it).
# FLASHBENCH_CMAKE_ARGS (as in scripts/env.sh) reaches the probe too, e.g. -DCMAKE_PREFIX_PATH=/opt/libs;
# FLASHBENCH_SKIP_PY=1 (as in scripts/test.sh) leaves the Python packages out.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
profile=${1:-build}
case "$profile" in
  build | test) ;;
  *) echo "deps.sh: unknown profile '$profile'; use 'build' (scripts/run.sh) or 'test' (scripts/test.sh)" >&2; exit 2 ;;
esac

say() { echo "deps: $*"; }
is_root() { [ "$(id -u)" = 0 ]; }

# The capabilities: name|Debian package|required (build, test or optional-test)|what it is for.
# Libraries are checked by find_package in a probe project (the same call the build makes); commands on PATH.
caps=(
  "cmake|cmake|build|configuring the build (3.24 or newer; pip install cmake where the distribution's is older)"
  "c++|g++|build|the host compiler"
  "make|make|build|CMake's default generator"
  "benchmark|libbenchmark-dev|build|Google Benchmark (find_package(benchmark))"
  "yaml-cpp|libyaml-cpp-dev|build|sweep specs (find_package(yaml-cpp))"
  "nlohmann_json|nlohmann-json3-dev|build|results files (find_package(nlohmann_json 3.10))"
  "CLI11|libcli11-dev|build|the command line (find_package(CLI11))"
  "GTest|libgtest-dev|test|the C++ tests (find_package(GTest))"
  "chromium|chromium|optional|the HTML report's rendering test"
  "compare.py|libbenchmark-tools|optional|the test that Google Benchmark's compare.py reads our files"
  "slurm|slurm-wlm munge|optional|the Slurm test (tests/scripts/test_slurm.sh)"
)

cmake_ok() {
  command -v cmake >/dev/null 2>&1 || return 1
  local v
  v=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [ -n "$v" ] && set -- $v && { [ "$1" -gt 3 ] || { [ "$1" -eq 3 ] && [ "$2" -ge 24 ]; }; }
}

# find_package for every library at once (a few seconds): prints "name found" lines.
probe_libs() {
  local dir
  dir=$(mktemp -d) || return 1
  cat >"$dir/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.24)
project(flashbench_deps_probe LANGUAGES CXX)
foreach(p benchmark yaml-cpp CLI11 GTest)
  find_package(${p} QUIET)
  if(${p}_FOUND)
    message(STATUS "probe: ${p} found")
  endif()
endforeach()
find_package(nlohmann_json 3.10 QUIET)
if(nlohmann_json_FOUND)
  message(STATUS "probe: nlohmann_json found")
endif()
EOF
  # shellcheck disable=SC2086 # FLASHBENCH_CMAKE_ARGS is a list of arguments
  cmake -S "$dir" -B "$dir/build" ${FLASHBENCH_CMAKE_ARGS:-} 2>/dev/null | sed -n 's/^-- probe: \(.*\) found$/\1/p'
  rm -rf "$dir"
}

found_libs=""
have() { # capability name -> 0 when present
  case "$1" in
    cmake) cmake_ok ;;
    c++) command -v "${CXX:-c++}" >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 ;;
    make) [ -n "${CMAKE_GENERATOR:-}" ] || command -v make >/dev/null 2>&1 ;;
    chromium) command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
              command -v google-chrome >/dev/null 2>&1 || command -v google-chrome-stable >/dev/null 2>&1 ;;
    compare.py) [ -f /usr/share/benchmark/compare.py ] ;;
    slurm) for c in slurmctld slurmd sbatch squeue munged; do command -v "$c" >/dev/null 2>&1 || return 1; done ;;
    *) grep -qx -- "$1" <<<"$found_libs" ;;
  esac
}

wanted() { # requirement class -> 0 when this profile checks it
  case "$1" in build) return 0 ;; test | optional) [ "$profile" = test ] ;; esac
}

lib_caps=" benchmark yaml-cpp nlohmann_json CLI11 GTest "
check_all() { # fills missing_required / missing_optional (capability names)
  missing_required=() missing_optional=()
  found_libs="" probed=0
  if cmake_ok && have c++; then found_libs=$(probe_libs) && probed=1; fi
  local c name req
  for c in "${caps[@]}"; do
    IFS='|' read -r name _ req _ <<<"$c"
    wanted "$req" || continue
    # Without cmake or a compiler the libraries cannot be probed yet: they are checked once those are installed.
    [[ $probed = 0 && $lib_caps == *" $name "* ]] && continue
    have "$name" && continue
    if [ "$req" = optional ]; then missing_optional+=("$name"); else missing_required+=("$name"); fi
  done
}

field() { # capability name, field index (1: package, 3: purpose)
  local c name pkg req what
  for c in "${caps[@]}"; do
    IFS='|' read -r name pkg req what <<<"$c"
    [ "$name" = "$1" ] || continue
    case "$2" in 1) echo "$pkg" ;; 3) echo "$what" ;; esac
  done
}

install_missing() { # installs the packages of what check_all found missing; 1 when nothing could be tried
  local todo=("${missing_required[@]}" "${missing_optional[@]}") pkgs=() n p to=()
  ((${#todo[@]})) || return 1
  for n in "${todo[@]}"; do
    say "missing: $n, for $(field "$n" 3) (Debian: $(field "$n" 1))"
    read -ra p <<<"$(field "$n" 1)"
    pkgs+=("${p[@]}")
  done
  if ! command -v apt-get >/dev/null 2>&1; then
    say "no apt-get here: install ${pkgs[*]} (or their equivalents) yourself"
    return 1
  elif ! is_root; then
    say "not root: nothing installed; run: sudo apt-get install -y --no-install-recommends ${pkgs[*]}"
    return 1
  fi
  say "installing ${pkgs[*]} (apt)"
  # Bounded: without network apt fails at once, but a half-working resolver can retry for minutes.
  command -v timeout >/dev/null 2>&1 && to=(timeout 600)
  if ! DEBIAN_FRONTEND=noninteractive "${to[@]}" apt-get update -qq >/dev/null 2>&1 ||
     ! DEBIAN_FRONTEND=noninteractive "${to[@]}" apt-get install -y -qq --no-install-recommends "${pkgs[@]}" \
       >/dev/null 2>&1; then
    # One at a time, so that one package unknown to this release (chromium on Ubuntu) does not block the others.
    for p in "${pkgs[@]}"; do
      DEBIAN_FRONTEND=noninteractive "${to[@]}" apt-get install -y -qq --no-install-recommends "$p" >/dev/null 2>&1 ||
        say "could not install $p (no network, or no such package in this release)"
    done
  fi
}

check_all
if install_missing; then
  was_probed=$probed
  check_all
  # The libraries are probed only once cmake and a compiler are there: a second round for what that reveals.
  if [ "$was_probed" = 0 ] && [ "$probed" = 1 ] && install_missing; then check_all; fi
fi

# The CUDA toolkit is not a Debian package here: it must already be installed. env.sh puts /usr/local/cuda/bin on
# PATH; another install needs its bin folder on PATH.
cuda_ok=1
if ! command -v nvcc >/dev/null 2>&1; then
  say "missing: nvcc (the CUDA toolkit, 12.0 or newer): install it from NVIDIA and put its bin folder on PATH"
  cuda_ok=0
fi

if [ "$profile" = test ]; then
  # cuobjdump (and the nvdisasm it runs) for the SASS test (tests/CMakeLists.txt: fa3_sass); some CUDA installs
  # leave them out. NVIDIA's pip wheels carry both (the test finds them there); without them it reports SKIPPED.
  cuobjdump_ok() {
    command -v cuobjdump >/dev/null 2>&1 || python3 -c 'import glob, nvidia, sys
sys.exit(not any(glob.glob(p + "/cu*/bin/cuobjdump") for p in nvidia.__path__))' >/dev/null 2>&1
  }
  if ! cuobjdump_ok; then
    say "missing: cuobjdump, for the SASS test; installing nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (pip)"
    python3 -m pip install -q --retries 1 --timeout 20 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >/dev/null 2>&1 ||
      say "could not install them (pip); the SASS test will report SKIPPED"
  fi
  # The reports package's tests run from the checkout (reports/tests/conftest.py); they need its dependencies.
  py_ok() { python3 -c 'import matplotlib, numpy, pytest' >/dev/null 2>&1; }
  if [ "${FLASHBENCH_SKIP_PY:-0}" = 1 ]; then
    : # scripts/test.sh leaves pytest out
  elif ! command -v python3 >/dev/null 2>&1; then
    say "missing: python3, for the reports' tests (Debian: python3); scripts/test.sh will say they did not run"
  elif ! py_ok; then
    say "missing: matplotlib, numpy or pytest, for the reports' tests; installing reports[test] (pip)"
    python3 -m pip install -q --retries 1 --timeout 20 -e "$FB_ROOT/reports[test]" >/dev/null 2>&1 ||
      say "could not install it (pip): scripts/test.sh will say the reports' tests did not run"
  fi
fi

if ((${#missing_optional[@]})); then
  say "still missing (optional): ${missing_optional[*]}: the tests that need them report SKIPPED"
fi
if ((${#missing_required[@]})) || ((!cuda_ok)); then
  list="${missing_required[*]}"; ((cuda_ok)) || list="${list:+$list }nvcc"
  say "error: the build cannot go on without: $list (see above)"
  exit 2
fi
say "ok: what the $profile requires is here"
