#!/usr/bin/env bash
# scripts/ptxas_guard.sh with stand-in compilers: a compile whose ptxas output says wgmma was serialised fails and
# leaves no object; a clean compile passes with its output; a failing compile keeps its own exit status.
set -uo pipefail
guard="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/ptxas_guard.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
cat >"$work/cc" <<'CC'
#!/usr/bin/env bash
# stand-in compiler: MODE=serial|clean|broken; writes the file after -o
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
echo "object" >"$out"
case "$MODE" in
  serial) echo "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the function 'k'" >&2 ;;
  broken) echo "error: something" >&2; exit 3 ;;
esac
exit 0
CC
chmod +x "$work/cc"
check() { # what, want_rc, want_object (yes/no), rc, object
  local got_obj=no
  [ -f "$work/k.o" ] && got_obj=yes
  if [ "$4" = "$2" ] && [ "$got_obj" = "$3" ]; then echo "ok   $1: exit $4, object $got_obj"
  else echo "FAIL $1: exit $4 (want $2), object $got_obj (want $3)"; fail=1; fi
}
MODE=serial "$guard" "$work/cc" -c k.cu -o "$work/k.o" 2>"$work/err"; rc=$?
check "serialised wgmma" 1 no $rc
grep -q "ptxas_guard: ptxas serialised wgmma in k.cu" "$work/err" || { echo "FAIL: no guard message"; cat "$work/err"; fail=1; }
grep -q "(C7512)" "$work/err" || { echo "FAIL: the compiler's own lines were not passed on"; fail=1; }
rm -f "$work/k.o"
MODE=clean "$guard" "$work/cc" -c k.cu -o "$work/k.o" 2>"$work/err"; rc=$?
check "clean compile" 0 yes $rc
rm -f "$work/k.o"
MODE=broken "$guard" "$work/cc" -c k.cu -o "$work/k.o" 2>"$work/err"; rc=$?
check "failing compile" 3 yes $rc
exit $fail
