#!/usr/bin/env bash
# Cross-checks flashbench's timing of one point: two separate runs (their medians should agree within 1%) and
# Nsight Compute's gpu__time_duration for the same kernel (--clock-control none: clocks as found; --cache-control
# all: caches flushed before each launch, as flashbench's cold samples are). Prints a table; files go to OUTDIR.
#   scripts/validate-timing.sh OUTDIR VARIANT SHAPE KERNEL_REGEX [CONFIG]
# e.g. scripts/validate-timing.sh /tmp/v fa1_kv_outer batch=2,heads_q=16,heads_kv=4,seqlen_q=1000,seqlen_kv=1537,head_dim=128,dtype=bf16 fa1_kv_outer_kernel
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out=${1:?OUTDIR}; variant=${2:?VARIANT}; shape=${3:?SHAPE}; kernel=${4:?KERNEL_REGEX}; config=${5:-default}
fb="$FB_BUILD/flashbench"
mkdir -p "$out"
for i in 1 2; do
  "$fb" run --variant "$variant" --shape "$shape" --config "$config" --no-ceilings -o "$out/run$i.json" >"$out/run$i.log"
done
ncu --clock-control none --cache-control all -k "regex:$kernel" --launch-skip 10 --launch-count 50 \
    --metrics gpu__time_duration.sum --csv \
    "$fb" run --variant "$variant" --shape "$shape" --config "$config" --no-ceilings --timeout 10 \
    -o "$out/ncu_run.json" >"$out/ncu.csv" 2>"$out/ncu.err"
python3 - "$out" <<'PY'
import csv, json, statistics, sys
out = sys.argv[1]
med = [json.load(open(f"{out}/run{i}.json"))["benchmarks"][0]["median_us"] for i in (1, 2)]
rows = [r for r in csv.reader(l for l in open(f"{out}/ncu.csv") if l.startswith('"'))]
hdr = rows[0]; iu = hdr.index("Metric Unit"); iv = hdr.index("Metric Value")
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
ncu = [float(r[iv].replace(",", "")) * scale[r[iu]] for r in rows[1:] if r[hdr.index("Metric Name")] == "gpu__time_duration.sum"]
n = statistics.median(ncu)
print(f"flashbench run 1 median: {med[0]:.2f} us")
print(f"flashbench run 2 median: {med[1]:.2f} us   (run2/run1 - 1 = {100*(med[1]/med[0]-1):+.2f}%)")
print(f"ncu gpu__time_duration median of {len(ncu)} launches: {n:.2f} us   (flashbench/ncu - 1 = {100*(med[0]/n-1):+.2f}%)")
PY
