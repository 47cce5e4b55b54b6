#!/usr/bin/env bash
# Session 32, c170: where fa3_fp8 v2's time goes at d128 N8192 non-causal (710 TF/s against the e4m3 GEMM's 1279 in
# c169), beside fa3_pipelined bf16 on the same shape: ncu speed of light, compute workload (pipe utilization),
# warp states, instruction mix, and fa3_fp8's SASS hot spots (source counters). One launch each (the 4th), caches
# flushed before it, clocks left alone.
set -u
L=$OUT; t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( source scripts/env.sh; fb_configure && fb_build --target flashbench ) > /tmp/build.log 2>&1
ts "build $(ls build/flashbench 2>&1)"
for dt in e4m3 bf16; do
  v=fa3_fp8; cfg="{stages: 2, intra_wg_overlap: on, pingpong: off}"; k=fa3_fp8_kernel
  if [ $dt = bf16 ]; then
    v=fa3_pipelined; k=fa3_kernel
    cfg="{block_m: 128, block_n: 128, stages: 2, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on, scheduler: dynamic}"
  fi
  cat > /tmp/one-$dt.yaml <<Y
name: c170
timing: {min_samples: 3, max_noise: 1, min_time_s: 0, timeout_s: 0.2}
problems:
  - {name: p, tokens: 16384, hidden: 2048, seqlen: [8192], head_dim: 128, causal: false, dtype: $dt}
variants:
  $v:
    configs:
      - $cfg
Y
  m=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum,sm__cycles_active.avg,gpu__time_duration.sum
  timeout 200 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section InstructionStats --section SourceCounters --metrics $m --launch-skip 3 -k regex:$k -c 1 -o /tmp/$dt \
    build/flashbench run /tmp/one-$dt.yaml --no-counters -o /tmp/one-$dt.json > /tmp/ncu-$dt.log 2>&1
  ts "ncu $dt rc $?"
  ncu -i /tmp/$dt.ncu-rep --page details > /tmp/details-$dt.txt 2>&1
  ncu -i /tmp/$dt.ncu-rep --page raw --csv --metrics $m > /tmp/raw-$dt.csv 2>&1
done
ncu -i /tmp/e4m3.ncu-rep --page source --csv --print-source sass > /tmp/sass-e4m3.csv 2>&1
python3 scripts/dev/ncu_sass_hot.py /tmp/sass-e4m3.csv --top 0.5 > /tmp/hot-e4m3.txt 2>&1
for dt in e4m3 bf16; do echo "== $dt"; python3 - /tmp/raw-$dt.csv <<'P'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(r for r in rows if "gpu__time_duration.sum" in r)
vals = rows[rows.index(hdr) + 2]
for h, v in zip(hdr, vals):
    if "__" in h: print(f"  {h}: {v}")
P
grep -E "Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall" /tmp/details-$dt.txt | head -12; done
head -40 /tmp/hot-e4m3.txt
tar czf $L/c170.tgz -C /tmp details-e4m3.txt details-bf16.txt raw-e4m3.csv raw-bf16.csv sass-e4m3.csv hot-e4m3.txt ncu-e4m3.log ncu-bf16.log
