#!/usr/bin/env bash
# Session 31: where the H100's causal d128 N512 time goes against cuDNN's. The point is DRAM-bound on an H100 (268 MB
# in ~104 us, 86% of the copy rate; the same time at 1798 and 1980 MHz: NOTES.md, c160), so compare the memory side:
# ncu's speed of light and memory workload analysis, DRAM bytes, L2 hit rates, of our kernel (v41, bm128 bn128
# stages 2 dynamic; its 4th launch) and of cuDNN's (scripts/dev/peer_probe.py). Caches flushed before each profiled
# launch (ncu's default cache control, as both timers flush), clocks left alone.
set -u
L=$OUT; t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( source scripts/env.sh; fb_configure && fb_build --target flashbench ) > /tmp/build.log 2>&1
ts "build $(ls build/flashbench 2>&1)"
cat > /tmp/one.yaml <<'Y'
name: c164
timing: {min_samples: 3, max_noise: 1, min_time_s: 0, timeout_s: 0.2}
problems:
  - {name: p, tokens: 16384, hidden: 2048, seqlen: [512], head_dim: 128, causal: true, dtype: bf16}
variants:
  fa3_pipelined:
    configs:
      - {block_m: 128, block_n: 128, stages: 2, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on, scheduler: dynamic}
Y
m=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__cycles_active.avg,gpc__cycles_elapsed.max
timeout 150 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --metrics $m \
  --launch-skip 3 -k regex:fa3_kernel -c 1 -o /tmp/ours build/flashbench run /tmp/one.yaml --no-counters -o /tmp/one.json > /tmp/ncu-ours.log 2>&1
ts "ncu ours rc $?"
timeout 150 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --metrics $m \
  --nvtx --nvtx-include "probe/" -c 1 -o /tmp/cudnn python3 scripts/dev/peer_probe.py 128 512 1 cudnn > /tmp/ncu-cudnn.log 2>&1
ts "ncu cudnn rc $?"
for w in ours cudnn; do ncu -i /tmp/$w.ncu-rep --page details > /tmp/details-$w.txt 2>&1; done
grep -h -E 'fa3_kernel|cudnn|sm90|Duration|DRAM Throughput|dram__bytes|lts__t_sector_hit|L2 Hit|Memory Throughput|L1/TEX Hit|Mem Busy|Max Bandwidth|Elapsed Cycles|SM Frequency|DRAM Frequency' /tmp/details-ours.txt /tmp/details-cudnn.txt | head -60
tar czf $L/c164.tgz -C /tmp details-ours.txt details-cudnn.txt ncu-ours.log ncu-cudnn.log ours.ncu-rep cudnn.ncu-rep
