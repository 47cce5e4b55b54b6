#!/usr/bin/env bash
# compute-sanitizer racecheck and synccheck on one small awkward point (odd lengths, causal with seqlen_q !=
# seqlen_kv, GQA) of a variant at one config. The point runs in flashbench's worker process, which the sanitizer
# follows (--target-processes all). Exit status non-zero if either tool reports an error.
#   scripts/sanitize.sh VARIANT CONFIG [SHAPE]
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
v=${1:?usage: scripts/sanitize.sh VARIANT CONFIG [SHAPE]}
c=${2:?usage: scripts/sanitize.sh VARIANT CONFIG [SHAPE]}
shape=${3:-batch=1,heads_q=4,heads_kv=2,seqlen_q=200,seqlen_kv=333,head_dim=128,causal=true,dtype=bf16}
status=0
for tool in racecheck synccheck; do
  out=$(mktemp)
  compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 9 \
    "$FB_BUILD/flashbench" run --variant "$v" --shape "$shape" --config "$c" --no-counters --no-ceilings \
    --min-time 0 --timeout 0.001 -o "$out.json" >"$out" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out" | sort | uniq -c | tr '\n' ' ')
  st=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['benchmarks'][0].get('status'))" "$out.json" 2>/dev/null)
  echo "$tool $v [$c] $shape: exit $rc, point status ${st:-none}; $summary"
  if [ $rc -ne 0 ] || [ "$st" != ok ]; then status=1; grep -E "Race|Barrier|ERROR|Invalid" "$out" | head -8; fi
  rm -f "$out" "$out.json"
done
exit $status
