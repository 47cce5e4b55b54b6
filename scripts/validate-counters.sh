#!/usr/bin/env bash
# Checks flashbench's CUPTI counters against Nsight Compute on the same launches: a copy kernel, naive and
# fa1_kv_outer at N = 4096. ncu runs with --clock-control none (clocks as found) and --cache-control all (cold
# caches, as flashbench's profile pass). Prints DRAM read+write bytes and achieved/theoretical occupancy side by side.
#   scripts/validate-counters.sh OUTDIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out=${1:?OUTDIR}; mkdir -p "$out"
fb="$FB_BUILD/flashbench"
metrics=dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__cycles_active.sum,gpu__time_duration.sum,sm__maximum_warps_per_active_cycle_pct,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__occupancy_limit_warps,launch__occupancy_limit_blocks
ncu_common=(--clock-control none --cache-control all --metrics "$metrics" --csv)
shape=tokens=16384,hidden=2048,seqlen=4096,head_dim=128,dtype=bf16

"$fb" probe --copy-kernel -o "$out/copy.json" >/dev/null
ncu "${ncu_common[@]}" -k regex:copy_probe --launch-skip 5 --launch-count 1 \
  "$fb" probe --copy-kernel --no-counters >"$out/ncu_copy.csv" 2>"$out/ncu_copy.err"
for v in naive fa1_kv_outer; do
  "$fb" run --variant $v --shape $shape --no-ceilings --timeout 2 -o "$out/$v.json" >"$out/$v.log"
  range=$("$fb" ncu-cmd --variant $v --shape $shape | sed -E "s/.*--nvtx-include '([^']*)'.*/\1/;q")
  n=24 # several calls' worth; the table sums one call (the repeating kernel sequence)
  ncu "${ncu_common[@]}" --nvtx --nvtx-include "$range" --launch-count $n \
    "$fb" run --variant $v --shape $shape --no-ceilings --no-counters --timeout 2 -o "$out/${v}_ncu_run.json" \
    >"$out/ncu_$v.csv" 2>"$out/ncu_$v.err"
done
python3 - "$out" <<'PY'
import csv, json, sys
out = sys.argv[1]
def ncu(path):
    rows = list(csv.reader(l for l in open(path) if l.startswith('"')))
    h = rows[0]; ik, im, iv, iu = (h.index(x) for x in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
    per = {}
    for r in rows[1:]:
        v = float(r[iv].replace(",", "")) if r[iv] not in ("", "n/a") else float("nan")
        if r[iu] in ("Kbyte", "KB"): v *= 1e3
        if r[iu] in ("Mbyte", "MB"): v *= 1e6
        if r[iu] in ("Gbyte", "GB"): v *= 1e9
        per.setdefault(r[0], {"name": r[ik]})[r[im]] = v
    # The timer's stream-hold kernel runs inside the point's NVTX range too (it gates each timed sample); it is not
    # part of the variant, and flashbench's counter pass does not launch it.
    ks = [per[i] for i in sorted(per, key=int) if "hold_stream" not in per[i]["name"]]
    # One call of the variant = the shortest repeating sequence of kernel names.
    names = [k["name"] for k in ks]
    for p in range(1, len(names) + 1):
        if all(names[i] == names[i % p] for i in range(len(names))):
            return ks[:p]
    return ks
def ours_point(path):
    b = json.load(open(path))["benchmarks"][0]
    return b.get("counters") or {}, b.get("occupancy") or {}, b.get("counters_reason")
rows = []
cp = json.load(open(f"{out}/copy.json"))["copy_kernel"]
k = ncu(f"{out}/ncu_copy.csv")
rows.append(("copy_probe", cp["counters"], cp["occupancy"], k))
for v in ("naive", "fa1_kv_outer"):
    c, o, why = ours_point(f"{out}/{v}.json")
    if why: print(v, "counters unavailable:", why)
    rows.append((v, c, o, ncu(f"{out}/ncu_{v}.csv")))
print(f"{'kernel':14} {'ours DRAM GB':>12} {'ncu DRAM GB':>12} {'diff %':>7} {'ours ach.occ':>12} {'ncu ach.occ':>11} {'ours theo':>9} {'ncu theo':>8} limiter")
for name, c, o, ks in rows:
    nb = sum(x.get("dram__bytes_read.sum", 0) + x.get("dram__bytes_write.sum", 0) for x in ks)
    ob = c.get("dram_bytes", float("nan"))
    print(f"   {name}: {len(ks)} kernel(s) per call in ncu: " + ", ".join(k['name'][:40] for k in ks))
    # Achieved occupancy over several kernels (naive: one CUPTI range holds all four) is the active-cycle-weighted
    # mean of the per-kernel values: warps_active.sum / (cycles_active.sum * max warps), summed over kernels.
    w = [x.get("sm__cycles_active.sum", 0) for x in ks]
    nocc = (sum(x.get("sm__warps_active.avg.pct_of_peak_sustained_active", 0) * wi for x, wi in zip(ks, w)) / sum(w)
            if sum(w) else float("nan"))
    if len(ks) > 1:
        print("   per kernel (achieved %, active cycles, us): " + "; ".join(
            f"{k['name'][:28]} {k.get('sm__warps_active.avg.pct_of_peak_sustained_active', float('nan')):.2f} "
            f"{k.get('sm__cycles_active.sum', 0):.3g} {k.get('gpu__time_duration.sum', 0) / 1e3:.1f}" for k in ks))
    # Theoretical occupancy: ours describes one of our own kernels (naive: the softmax; its GEMMs are cuBLAS's).
    kk = next((x for x in ks if o.get("kernel") and o["kernel"] in x["name"]), ks[0])
    print(f"{name:14} {ob/1e9:12.4f} {nb/1e9:12.4f} {100*(ob/nb-1) if nb else float('nan'):+7.2f} "
          f"{c.get('achieved_occupancy_pct', float('nan')):12.2f} {nocc:11.2f} {o.get('theoretical_pct', float('nan')):9.2f} "
          f"{kk.get('sm__maximum_warps_per_active_cycle_pct', float('nan')):8.2f} {o.get('limiter','')}")
    print("   ncu limits (blocks/SM) of", kk["name"][:40], ": regs", kk.get("launch__occupancy_limit_registers"), "smem", kk.get("launch__occupancy_limit_shared_mem"),
          "warps", kk.get("launch__occupancy_limit_warps"), "blocks", kk.get("launch__occupancy_limit_blocks"), "| ours", o.get("kernel", ""), o.get("blocks_by_limit"))
PY
