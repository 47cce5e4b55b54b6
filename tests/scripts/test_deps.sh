#!/usr/bin/env bash
# scripts/deps.sh as on an offline GPU runner whose tools were not installed from Debian packages: in a network
# namespace with no network (unshare -n), with a dpkg that knows no package and an apt-get that records its
# arguments and fails as apt does offline.
#   1. build: everything the build needs is here (this test runs after the build): exit 0, nothing named missing,
#      neither dpkg nor apt-get asked.
#   2. test: exit 0 (an optional tool may be missing: then it is named, and only its package is asked for).
#   3. a library truly missing (find_package(yaml-cpp) disabled through FLASHBENCH_CMAKE_ARGS): exit 2, one line
#      names yaml-cpp and libyaml-cpp-dev; apt-get was tried for it alone (as root) or the line says what to run.
# Without unshare, or without the right to use it, it prints "test_deps: SKIPPED" and why.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
skip() { echo "test_deps: SKIPPED: $*"; exit 0; }
failed=0
fail() { echo "test_deps: FAIL: $*"; failed=1; }

command -v unshare >/dev/null 2>&1 || skip "unshare not found (util-linux)"
if unshare -n true 2>/dev/null; then ns=(unshare -n)
elif unshare -rn true 2>/dev/null; then ns=(unshare -rn) # a user namespace: root inside, no network
else skip "unshare -n is not permitted here (needs root or user namespaces)"; fi

t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
mkdir "$t/bin"
for c in dpkg dpkg-query apt-get apt; do
  printf '#!/bin/sh\necho "%s $*" >>"%s/calls"\n[ "%s" = dpkg ] || [ "%s" = dpkg-query ] && exit 1\nexit 100\n' \
    "$c" "$t" "$c" "$c" >"$t/bin/$c"
  chmod +x "$t/bin/$c"
done

deps() { # profile, then env assignments; output in $t/out, exit status returned
  local profile=$1; shift
  : >"$t/calls"
  env PATH="$t/bin:$PATH" "$@" "${ns[@]}" bash "$root/scripts/deps.sh" "$profile" >"$t/out" 2>&1
}
show() { sed 's/^/    /' "$t/out"; [ -s "$t/calls" ] && sed 's/^/    called: /' "$t/calls"; }

# Offline for real: nothing can be resolved inside.
"${ns[@]}" python3 -c 'import socket; socket.getaddrinfo("deb.debian.org", 80)' >/dev/null 2>&1 &&
  fail "the namespace still resolves names: the offline cases below would not be offline"

deps build; rc=$?
if [ $rc != 0 ] || grep -q "missing" "$t/out" || [ -s "$t/calls" ]; then
  fail "build profile offline, everything present: exit $rc (want 0, nothing missing, no dpkg/apt-get call)"; show
else echo "test_deps: build profile offline, everything present: exit 0, nothing asked"; fi

deps test; rc=$?
if [ $rc != 0 ] || grep -q "^dpkg" "$t/calls"; then
  fail "test profile offline: exit $rc (want 0, and dpkg never asked)"; show
else
  echo "test_deps: test profile offline: exit 0$(grep -q missing "$t/out" && echo "; named missing: $(
    sed -n 's/^deps: missing: \([^,]*\),.*/\1/p' "$t/out" | tr '\n' ' ')")"
fi

deps build FLASHBENCH_CMAKE_ARGS="-DCMAKE_DISABLE_FIND_PACKAGE_yaml-cpp=TRUE"; rc=$?
want_line="deps: missing: yaml-cpp, for sweep specs (find_package(yaml-cpp)) (Debian: libyaml-cpp-dev)"
if [ $rc != 2 ] || ! grep -qxF "$want_line" "$t/out" || ! grep -q "error: the build cannot go on without: yaml-cpp" "$t/out"; then
  fail "yaml-cpp missing: exit $rc (want 2, the line '$want_line' and the error)"; show
elif [ "$(id -u)" = 0 ] || [ "${ns[*]}" = "unshare -rn" ]; then
  grep -qx "apt-get install -y -qq --no-install-recommends libyaml-cpp-dev" "$t/calls" &&
    grep -q "could not install libyaml-cpp-dev" "$t/out" ||
    { fail "as root, apt-get install libyaml-cpp-dev alone should be tried and its failure said"; show; }
else
  grep -q "sudo apt-get install -y --no-install-recommends libyaml-cpp-dev" "$t/out" ||
    { fail "not root: the message should say what to install"; show; }
fi
[ $failed = 0 ] && echo "test_deps: yaml-cpp missing: exit 2 with the package named" && echo "test_deps: PASS"
exit $failed
