# Sourced by the other scripts: puts the CUDA toolkit on PATH and picks the build folder and job count.
export PATH="/usr/local/cuda/bin:$PATH"
FB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FB_BUILD="${FLASHBENCH_BUILD_DIR:-$FB_ROOT/build}"
FB_JOBS="${FLASHBENCH_JOBS:-$(nproc)}"
# FLASHBENCH_SOURCE_SHA names the source's commit where the tree's own .git cannot (a copy of the tree carrying
# another checkout's .git, e.g. the GPU machine's); scripts/peers.py reads the same variable.
# Unset, the cache forgets an earlier one, so that a build folder kept between runs does not name a stale commit.
# Arguments are more cmake options (before FLASHBENCH_CMAKE_ARGS, which wins).
fb_configure() {
  local sha="-UFLASHBENCH_SOURCE_SHA"
  [ -n "${FLASHBENCH_SOURCE_SHA:-}" ] && sha="-DFLASHBENCH_SOURCE_SHA=$FLASHBENCH_SOURCE_SHA"
  cmake -S "$FB_ROOT" -B "$FB_BUILD" -DCMAKE_BUILD_TYPE=Release "$sha" "$@" ${FLASHBENCH_CMAKE_ARGS:-} >/dev/null
}
fb_build() {
  cmake --build "$FB_BUILD" -j "$FB_JOBS" "$@"
}
