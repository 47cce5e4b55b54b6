#!/usr/bin/env bash
# Why is fa3's causal d128 N512 3 us slower under peers.py (graph replay) than under flashbench's timer? Same
# problems, three ways: flashbench run; peers.py --ours with graphs; peers.py --ours --eager. cuDNN in both.
set -u
L=$OUT; t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( source scripts/env.sh; fb_configure && fb_build --target flashbench flashbench_capi ) > /tmp/build.log 2>&1
ts "build $(ls build/libflashbench_capi.so 2>&1)"
cat > /tmp/s.yaml <<'Y'
name: c154
timing: {queue: back_to_back, min_samples: 10, max_noise: 0.01, min_time_s: 0.2, timeout_s: 1}
problems:
  - {name: p, tokens: 16384, hidden: 2048, seqlen: [512, 4096], head_dim: 128, causal: [true, false], dtype: bf16}
variants:
  fa3_pipelined:
    configs:
      - {block_m: 128, block_n: 128, stages: 2, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on, scheduler: dynamic}
Y
build/flashbench plan /tmp/s.yaml > /tmp/plan.json
for pass in 0 1; do
  build/flashbench run /tmp/s.yaml --no-counters --no-ceilings -o /tmp/fb$pass.json > /tmp/fb.log 2>&1; ts "fb rc $?"
  python3 -c "
import json
for r in json.load(open('/tmp/fb$pass.json'))['benchmarks']: print('flashbench', r['name'].split('/')[-1], round(r['median_us'],2), r['sm_clock_mhz'])"
  for mode in graph eager; do
    timeout 100 python3 scripts/peers.py --problems /tmp/plan.json --peers torch_cudnn --ours fa3_pipelined \
      --ours-config block_m=128,block_n=128,stages=2,consumer_wgs=2,pingpong=on,intra_wg_overlap=on,scheduler=dynamic \
      --rounds 3 $([ $mode = eager ] && echo --eager) -o $L/ab-$mode$pass.json > /tmp/p.log 2>&1; ts "$mode rc $?"
    python3 -c "
import json
for r in json.load(open('$L/ab-$mode$pass.json'))['benchmarks']: print('$mode', r['variant'][:14], r['name'].split('/')[-1], r['repetition_index'], round(r['median_us'],2), round(r['min_us'],2), r['sm_clock_mhz'], r['launch'][:30])"
  done
done
