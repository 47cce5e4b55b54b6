#!/usr/bin/env bash
# Session 31: buffer placement and the torch-process gap at causal d128 N512 (scripts/dev/placement_probe.py): ours
# with torch's buffers, with 2-MiB-aligned copies of Q, K, V and aligned O, LSE, and with aligned inputs only, and
# cuDNN, sample by sample in one loop, 3 rounds; non-causal N512 as the control. Then flashbench's own timer.
set -u
L=$OUT; t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( source scripts/env.sh; fb_configure && fb_build --target flashbench flashbench_capi ) > /tmp/build.log 2>&1
ts "build $(ls build/libflashbench_capi.so 2>&1)"
cat > /tmp/s.yaml <<'Y'
name: c165
timing: {queue: back_to_back, min_samples: 10, max_noise: 0.01, min_time_s: 0.2, timeout_s: 1}
problems:
  - {name: p, tokens: 16384, hidden: 2048, seqlen: [512], head_dim: 128, causal: [true, false], dtype: bf16}
variants:
  fa3_pipelined:
    configs:
      - {block_m: 128, block_n: 128, stages: 2, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on, scheduler: dynamic}
Y
build/flashbench plan /tmp/s.yaml > /tmp/plan.json
cfg=block_m=128,block_n=128,stages=2,consumer_wgs=2,pingpong=on,intra_wg_overlap=on,scheduler=dynamic
timeout 200 python3 scripts/dev/placement_probe.py /tmp/plan.json build/libflashbench_capi.so fa3_pipelined $cfg 3 2>&1 | tee $L/probe.txt
ts "probe rc $?"
build/flashbench run /tmp/s.yaml --no-counters --no-ceilings -o /tmp/fb.json > /tmp/fb.log 2>&1; ts "fb rc $?"
python3 -c "
import json
for r in json.load(open('/tmp/fb.json'))['benchmarks']: print('flashbench', r['name'].split('/')[-1], round(r['median_us'],2), round(r['min_us'],2), r['sm_clock_mhz'])" | tee -a $L/probe.txt
