#!/usr/bin/env bash
# Shows that sharding loses and duplicates nothing: runs SPEC whole, then as two shards, merges the shards, and
# compares the sets of point names and statuses (timings differ run to run; the points must not).
#   scripts/shard-demo.sh OUTDIR [SPEC]     (set GPUS=0,1 to also run the spec with one worker per GPU)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out=${1:?usage: scripts/shard-demo.sh OUTDIR [SPEC]}
spec=${2:-$FB_ROOT/sweeps/quick.yaml}
fb="$FB_BUILD/flashbench"
mkdir -p "$out"
quick=(--no-counters --no-ceilings --min-time 0.02 --timeout 0.3 ${SHARD_DEMO_ARGS:-}) # e.g. --fake-worker on a CPU
"$fb" run "$spec" "${quick[@]}" -o "$out/whole.json" >"$out/shard-demo.log" 2>&1 || echo "whole run: exit $?"
"$fb" run "$spec" "${quick[@]}" --shard 0/2 -o "$out/s0.json" >>"$out/shard-demo.log" 2>&1 || echo "shard 0: exit $?"
"$fb" run "$spec" "${quick[@]}" --shard 1/2 -o "$out/s1.json" >>"$out/shard-demo.log" 2>&1 || echo "shard 1: exit $?"
"$fb" merge "$out/s0.json" "$out/s1.json" -o "$out/merged.json" >>"$out/shard-demo.log" 2>&1 || echo "merge: exit $?"
files=(whole merged)
if [ -n "${GPUS:-}" ]; then
  "$fb" run "$spec" "${quick[@]}" --gpus "$GPUS" -o "$out/gpus.json" >>"$out/shard-demo.log" 2>&1 || echo "--gpus: exit $?"
  files+=(gpus)
fi
python3 - "$out" "${files[@]}" <<'PY'
import collections, json, sys
out, names = sys.argv[1], sys.argv[2:]
def points(f):
    b = json.load(open(f"{out}/{f}.json"))["benchmarks"]
    return [(x["name"], x.get("status", "ok")) for x in b]
ref = points(names[0])
ok = True
for f in names:
    p = points(f)
    dup = [k for k, c in collections.Counter(n for n, _ in p).items() if c > 1]
    same = sorted(p) == sorted(ref)
    print(f"{f:7s}: {len(p)} points, {len(set(n for n, _ in p))} distinct, {len(dup)} duplicated, "
          f"statuses {dict(collections.Counter(s for _, s in p))}, same set and statuses as whole: {same}")
    ok &= same and not dup
for s in ("s0", "s1"):
    print(f"{s}: {len(points(s))} points")
print("RESULT shards + merge give the whole run's points, no duplicates:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
