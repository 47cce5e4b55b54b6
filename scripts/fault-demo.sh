#!/usr/bin/env bash
# Fault isolation and resume, on a GPU, with real kernels (builds nothing; uses $FB_BUILD/flashbench).
#   scripts/fault-demo.sh OUTDIR
# 1. A 50-point sweep: naive (2 configs), the test-only variant's three faulty configs (an illegal access, a trap,
#    a kernel that spins forever), then 45 FA1 configs. Each fault costs only its own point: the worker is lost
#    (a sticky error ends it; the hang is killed at timing.point_timeout_s) and a fresh one takes the rest.
# 2. The same sweep without the faulty configs (47 points): the 47 must have the same points and statuses.
# 3. kill -9 in the middle of a sweep, then --resume: no finished point is re-run (each run draws a new input
#    seed, so a re-run would show a new seed) and none is lost.
# Exit status 0 when all three hold. FAULT_DEMO_ARGS adds flags to every run (to try the script without a GPU:
# FAULT_DEMO_ARGS="--fake-worker --fake-delay-ms 100").
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out=${1:?usage: scripts/fault-demo.sh OUTDIR}
fb="$FB_BUILD/flashbench"
extra=(${FAULT_DEMO_ARGS:-})
[ -x "$fb" ] || { echo "fault-demo: $fb not found; build first (scripts/run.sh or cmake --build build)"; exit 2; }
mkdir -p "$out"
export FLASHBENCH_TEST_VARIANTS=1

# Light timing: this is about surviving faults, not about precise numbers. The spin costs point_timeout_s.
timing='timing: {min_samples: 5, max_noise: 0.02, min_time_s: 0.05, timeout_s: 1, point_timeout_s: 20}'
problem='  - {batch: 1, heads: 4, seqlen: 512, head_dim: 64, dtype: bf16}'
fa1_configs() { # the first $1 FA1 configs in axis order
  python3 - "$1" <<'PY'
import itertools, sys
n = int(sys.argv[1])
combos = itertools.product([16, 32, 64], [16, 32, 64], [0, 1, 4, 16], [128, 256])
for bm, bn, t, th in itertools.islice(combos, n):
    print(f"      - {{block_m: {bm}, block_n: {bn}, q_tiles_per_cta: {t}, threads: {th}}}")
PY
}
make_spec() { # $1 = with faults (1/0), $2 = timing line
  echo "name: fault-demo"; echo "$2"; echo "problems:"; echo "$problem"; echo "variants:"
  echo "  naive:"; echo "    configs: [{softmax_threads: 128}, {softmax_threads: 256}]"
  [ "$1" = 1 ] && { echo "  test_faults:"; echo "    configs: [{fault: illegal_access}, {fault: trap}, {fault: spin}]"; }
  echo "  fa1_kv_outer:"; echo "    configs:"; fa1_configs 45
}
make_spec 1 "$timing" >"$out/faulty.yaml"
make_spec 0 "$timing" >"$out/clean.yaml"

echo "== 1. 50-point sweep with three faulty kernels inside"
t0=$(date +%s)
"$fb" run "$out/faulty.yaml" --no-ceilings --no-counters "${extra[@]}" -o "$out/faulty.json" >"$out/faulty.log" 2>&1
echo "   exit code $? (1 expected: some points crashed or timed out), $(( $(date +%s) - t0 )) s; log: $out/faulty.log"
echo "== 2. the same sweep without them (47 points)"
t0=$(date +%s)
"$fb" run "$out/clean.yaml" --no-ceilings --no-counters "${extra[@]}" -o "$out/clean.json" >"$out/clean.log" 2>&1
echo "   exit code $? (0 expected), $(( $(date +%s) - t0 )) s"

status=0
python3 - "$out/faulty.json" "$out/clean.json" <<'PY' || status=1
import json, sys
faulty = json.load(open(sys.argv[1])); clean = json.load(open(sys.argv[2]))
f = {r["name"]: r for r in faulty["benchmarks"]}; c = {r["name"]: r for r in clean["benchmarks"]}
assert len(f) == len(faulty["benchmarks"]) and len(c) == len(clean["benchmarks"]), "duplicate points"
print(f"   faulty sweep: {len(f)} points, {faulty['context'].get('workers_started')} workers started")
ok = True
for name, r in f.items():
    if r["variant"] == "test_faults":
        print(f"   {r['config']['fault']:15s} -> {r['status']:8s} {r['reason'][:150]}")
        ok &= r["status"] in ("crashed", "timeout")
others = {n: r["status"] for n, r in f.items() if r["variant"] != "test_faults"}
same = others == {n: r["status"] for n, r in c.items()}
n_ok = sum(s == "ok" for s in others.values())
print(f"   other points: {len(others)} (ok {n_ok}); same points and statuses as the clean run: {same}")
if same:
    ratios = sorted(f[n]["median_us"] / c[n]["median_us"] for n in others if others[n] == "ok")
    if ratios:
        print(f"   median time faulty/clean over ok points: min {ratios[0]:.3f}, median {ratios[len(ratios)//2]:.3f}, "
              f"max {ratios[-1]:.3f} (separate measurements: expect noise, not a shift)")
ok &= same and len(f) == 50 and len(others) == 47
print("   RESULT fault isolation:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY

echo "== 3. kill -9 in the middle of a sweep, then --resume"
make_spec 0 'timing: {min_samples: 10, max_noise: 0.01, min_time_s: 0.3, timeout_s: 2, point_timeout_s: 30}' >"$out/resume.yaml"
rm -f "$out/resume.json" "$out/resume.json.partial.jsonl"
"$fb" run "$out/resume.yaml" --no-ceilings --no-counters "${extra[@]}" -o "$out/resume.json" >"$out/resume-1.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  lines=$(cat "$out/resume.json.partial.jsonl" 2>/dev/null | wc -l)
  [ "$lines" -ge 15 ] && break
  sleep 0.2
done
workers=$(pgrep -P "$pid" | tr '\n' ' ')
kill -9 "$pid"; wait "$pid" 2>/dev/null
sleep 2
left="" # workers die with their parent (PR_SET_PDEATHSIG); a zombie awaiting its reaper counts as gone
for w in $workers; do
  st=$(ps -o stat= -p "$w" 2>/dev/null | tr -d ' ')
  [ -n "$st" ] && [ "${st#Z}" = "$st" ] && left="$left $w"
done
cp "$out/resume.json.partial.jsonl" "$out/before-kill.jsonl"
echo "   killed the sweep (pid $pid) with $(wc -l <"$out/before-kill.jsonl") records in the partial log;" \
     "workers ${workers:-none} -> still alive: ${left:-none}"
"$fb" run "$out/resume.yaml" --no-ceilings --no-counters "${extra[@]}" --resume -o "$out/resume.json" >"$out/resume-2.log" 2>&1
echo "   resumed run exit code $?: $(grep -E '^resume:|points to run' "$out/resume-2.log" | tr '\n' ' ')"
python3 - "$out/before-kill.jsonl" "$out/resume.json" "$left" <<'PY' || status=1
import json, sys
before = []
for line in open(sys.argv[1]):
    try: before.append(json.loads(line))
    except ValueError: pass  # the line kill -9 cut short
final = json.load(open(sys.argv[2]))["benchmarks"]
names = [r["name"] for r in final]
by = {r["name"]: r for r in final}
rerun = [r["name"] for r in before if by.get(r["name"], {}).get("seed") != r["seed"]]
lost = [r["name"] for r in before if r["name"] not in by]
print(f"   finished before the kill: {len(before)}; final file: {len(final)} points, {len(set(names))} distinct;"
      f" re-run: {len(rerun)}; lost: {len(lost)}")
ok = len(final) == 47 and len(set(names)) == 47 and not rerun and not lost and not sys.argv[3].strip()
print("   RESULT kill -9 + resume:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
echo "fault-demo: $([ $status = 0 ] && echo PASS || echo FAIL); files in $out"
exit $status
