#!/usr/bin/env bash
# The autotuner on a GPU (builds nothing; uses $FB_BUILD/flashbench).
#   scripts/tune-demo.sh OUTDIR [SPEC]
# Tunes the six shapes of SPEC (default sweeps/tune/fa2.yaml; with fa1_kv_outer instead when fa2_q_outer is not in
# the catalog) with the exhaustive strategy and with successive halving (budget 30% of the candidates, counted in
# full-fidelity measurements), and a seeded random search at the same budget for reference. For every shape it
# prints the exhaustive best, the halving winner's time *as measured by the exhaustive run* (same measurement, so
# no run-to-run noise in the comparison), the ratio, and the evaluations and sampling seconds each used. Then it
# reruns the halving search to show that it is served from the cache.
# Exit status 0 when halving is within 2% of the exhaustive best with <= 30% of its evaluations on every shape.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out=${1:?usage: scripts/tune-demo.sh OUTDIR [SPEC]}
spec=${2:-$FB_ROOT/sweeps/tune/fa2.yaml}
fb="$FB_BUILD/flashbench"
extra=(${TUNE_DEMO_ARGS:-}) # e.g. --fake-worker to try the script without a GPU
[ -x "$fb" ] || { echo "tune-demo: $fb not found; build first"; exit 2; }
mkdir -p "$out"
if ! "$fb" list | grep -qx fa2_q_outer; then
  sed 's/variants: \[fa2_q_outer\]/variants: [fa1_kv_outer]/' "$spec" >"$out/spec.yaml"
  spec="$out/spec.yaml"
  echo "tune-demo: fa2_q_outer is not in the catalog; tuning fa1_kv_outer"
fi
tune() { # strategy, extra args...
  local s=$1; shift
  local t0=$(date +%s%N)
  "$fb" tune "$spec" --strategy "$s" -o "$out/table-$s.json" --cache "$out/cache-$s.jsonl" \
      --report "$out/report-$s.json" "${extra[@]}" "$@" >"$out/tune-$s.log" 2>&1
  local rc=$?
  echo "== $s: exit $rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms wall; table $out/table-$s.json"
  cat "$out/tune-$s.log" | grep -vE '^  ' # the per-shape table (per-config failure lines are in the log)
}
if [ -n "${TUNE_DEMO_REUSE:-}" ] && [ -f "$out/report-random.json" ]; then
  echo "tune-demo: TUNE_DEMO_REUSE set: using the reports already in $out"
else
  rm -f "$out"/cache-*.jsonl
  tune exhaustive
  tune halving --budget 0.3
  tune random --budget 0.3 --seed 1
fi

# The table above compares the halving winner's time from the *exhaustive* run with the exhaustive best, i.e. two
# measurements taken minutes apart; a clock dip during one of them (the H200 drops from 1980 MHz under its power
# cap) moves a config by 1-3%. Where the two winners differ, measure both again back to back, alternating A B A B A
# B, and compare the medians of those: that is the like-for-like answer to "how far is halving's pick from the
# exhaustive best".
python3 - "$out" >"$out/confirm.tsv" <<'PY'
import json, sys
d = sys.argv[1]
ex = json.load(open(f"{d}/report-exhaustive.json"))["results"]
hv = json.load(open(f"{d}/report-halving.json"))["results"]
for e, h in zip(ex, hv):
    if "winner" not in e or "winner" not in h or e["winner"]["config"] == h["winner"]["config"]:
        continue
    p = e["problem"]
    shape = ",".join(f"{k}={str(p[k]).lower()}" for k in
                     ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim", "causal", "dtype"))
    print(e["problem_key"], e["variant"], shape, e["winner"]["config"], h["winner"]["config"], sep="\t")
PY
: >"$out/confirm.log"
while IFS=$'\t' read -r key variant shape exc hvc; do
  for round in 1 2 3; do
    for tag in exh hv; do
      cfg=$exc; [ $tag = hv ] && cfg=$hvc
      "$fb" run --variant "$variant" --shape "$shape" --config "$cfg" --no-counters --no-ceilings \
          -o "$out/confirm-$key-$tag-$round.json" "${extra[@]}" >>"$out/confirm.log" 2>&1
    done
  done
done <"$out/confirm.tsv"

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
    import glob, statistics
    def remeasured(tag):
        ts = [json.load(open(f))["benchmarks"][0] for f in sorted(glob.glob(f"{d}/confirm-{ex['problem_key']}-{tag}-*.json"))]
        ts = [b["median_us"] for b in ts if b.get("status", "ok") == "ok"]
        return statistics.median(ts) if ts else None
    a, b = remeasured("exh"), remeasured("hv")
    confirm = ""
    if a and b:
        confirm = f"; cross-run ratio {hv_t / best:.3f}; back to back (3 alternating runs each): exhaustive best {a:.1f} us, halving pick {b:.1f} us, ratio {b / a:.3f}"
        ratio = b / a  # the like-for-like comparison replaces the cross-run one
    ok = ratio <= 1.02 and evals <= 0.30 + 1e-9
    ok_all &= ok
    print(f"{ex['problem_key']:46s} {ex['candidates']:5d} {best:11.1f} {ratio:11.3f} "
          f"{hv['evaluations']:5.1f}/{ex['evaluations']:<5.0f} {hv['measure_seconds']:6.1f}/{ex['measure_seconds']:<6.1f} "
          f"{rd_t / best:10.3f}  {'PASS' if ok else 'FAIL'}")
    print(f"{'':46s} exhaustive best {min(times, key=times.get)}; halving picked {hv['winner']['config']}"
          f" (runner-up margin {ex.get('runner_up', {}).get('margin', 0) * 100:+.1f}% in the exhaustive run){confirm}")
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
