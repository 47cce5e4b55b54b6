# Sourced by the other scripts: puts the CUDA toolkit on PATH and picks the build folder and job count.
export PATH="/usr/local/cuda/bin:$PATH"
FB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FB_BUILD="${FLASHBENCH_BUILD_DIR:-$FB_ROOT/build}"
FB_JOBS="${FLASHBENCH_JOBS:-$(nproc)}"
fb_configure() {
  cmake -S "$FB_ROOT" -B "$FB_BUILD" -DCMAKE_BUILD_TYPE=Release ${FLASHBENCH_CMAKE_ARGS:-} >/dev/null
}
fb_build() {
  cmake --build "$FB_BUILD" -j "$FB_JOBS" "$@"
}
