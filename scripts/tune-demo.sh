#!/usr/bin/env bash
# The autotuner on a GPU (builds nothing; uses $FB_BUILD/flashbench).
#   scripts/tune-demo.sh OUTDIR [SPEC]
# Tunes the six shapes of SPEC (default sweeps/tune-fa2.yaml; with fa1_kv_outer instead when fa2_q_outer is not in
# the catalog) with the exhaustive strategy and with successive halving (budget 30% of the candidates, counted in
# full-fidelity measurements), and a seeded random search at the same budget for reference. For every shape it
# prints the exhaustive best, the halving winner's time *as measured by the exhaustive run* (same measurement, so
# no run-to-run noise in the comparison), the ratio, and the evaluations and sampling seconds each used. Then it
# reruns the halving search to show that it is served from the cache.
# Exit status 0 when halving is within 2% of the exhaustive best with <= 30% of its evaluations on every shape.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out=${1:?usage: scripts/tune-demo.sh OUTDIR [SPEC]}
spec=${2:-$FB_ROOT/sweeps/tune-fa2.yaml}
fb="$FB_BUILD/flashbench"
extra=(${TUNE_DEMO_ARGS:-}) # e.g. --fake-worker to try the script without a GPU
[ -x "$fb" ] || { echo "tune-demo: $fb not found; build first"; exit 2; }
mkdir -p "$out"
if ! "$fb" list | grep -qx fa2_q_outer; then
  sed 's/variants: \[fa2_q_outer\]/variants: [fa1_kv_outer]/' "$spec" >"$out/spec.yaml"
  spec="$out/spec.yaml"
  echo "tune-demo: fa2_q_outer is not in the catalog; tuning fa1_kv_outer"
fi
rm -f "$out"/cache-*.jsonl
tune() { # strategy, extra args...
  local s=$1; shift
  local t0=$(date +%s%N)
  "$fb" tune "$spec" --strategy "$s" -o "$out/table-$s.json" --cache "$out/cache-$s.jsonl" \
      --report "$out/report-$s.json" "${extra[@]}" "$@" >"$out/tune-$s.log" 2>&1
  local rc=$?
  echo "== $s: exit $rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms wall; table $out/table-$s.json"
  cat "$out/tune-$s.log" | grep -vE '^  ' # the per-shape table (per-config failure lines are in the log)
}
tune exhaustive
tune halving --budget 0.3
tune random --budget 0.3 --seed 1

python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
rep = {s: json.load(open(f"{d}/report-{s}.json")) for s in ("exhaustive", "halving", "random")}
def full(item):  # config -> median_us of the ok full-fidelity measurements
    return {m["config"]: m["median_us"] for m in item["measurements"] if m["fidelity"] == 1 and m["status"] == "ok"}
print()
print(f"{'shape':46s} {'cands':>5s} {'exh best us':>11s} {'halving/exh':>11s} {'evals':>11s} {'sampling s':>13s} "
      f"{'random/exh':>10s}  verdict")
ok_all = True
for ex, hv, rd in zip(rep["exhaustive"]["results"], rep["halving"]["results"], rep["random"]["results"]):
    assert ex["problem_key"] == hv["problem_key"] == rd["problem_key"]
    times = full(ex)
    if not times or "winner" not in hv:
        print(f"{ex['problem_key']:46s} no eligible config"); ok_all = False; continue
    best = min(times.values())
    hv_t = times.get(hv["winner"]["config"], float("inf"))
    rd_t = times.get(rd.get("winner", {}).get("config"), float("inf"))
    ratio, evals = hv_t / best, hv["evaluations"] / ex["evaluations"]
    ok = ratio <= 1.02 and evals <= 0.30 + 1e-9
    ok_all &= ok
    print(f"{ex['problem_key']:46s} {ex['candidates']:5d} {best:11.1f} {ratio:11.3f} "
          f"{hv['evaluations']:5.1f}/{ex['evaluations']:<5.0f} {hv['measure_seconds']:6.1f}/{ex['measure_seconds']:<6.1f} "
          f"{rd_t / best:10.3f}  {'PASS' if ok else 'FAIL'}")
    print(f"{'':46s} exhaustive best {min(times, key=times.get)}; halving picked {hv['winner']['config']}"
          f" (runner-up margin {ex.get('runner_up', {}).get('margin', 0) * 100:+.1f}% in the exhaustive run)")
print("RESULT halving within 2% of exhaustive with <= 30% of its evaluations on every shape:",
      "PASS" if ok_all else "FAIL")
sys.exit(0 if ok_all else 1)
PY
status=$?

echo "== rerun of the halving search with the same cache (nothing measured, no worker started):"
t0=$(date +%s%N)
"$fb" tune "$spec" --strategy halving --budget 0.3 -o "$out/table-halving.json" --cache "$out/cache-halving.jsonl" \
    "${extra[@]}" >"$out/tune-rerun.log" 2>&1
echo "   exit $?, $(( ($(date +%s%N) - t0) / 1000000 )) ms: $(grep -E 'measurements made' "$out/tune-rerun.log")"
slug=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['gpu']['slug'])" "$out/table-exhaustive.json" 2>/dev/null)
echo "To ship the exhaustive table for this GPU: cp $out/table-exhaustive.json $FB_ROOT/tuning/${slug:-<gpu-slug>}.json"
exit $status
