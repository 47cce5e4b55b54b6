#!/usr/bin/env bash
# Does the L2 flush explain the causal d128 N512 kernel's 2 us more under peers.py than under flashbench (c154)?
# The same point under both timers with flush read (default), flush write, and no flush (cold: false).
set -u
L=$OUT; t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( source scripts/env.sh; fb_configure && fb_build --target flashbench flashbench_capi ) > /tmp/build.log 2>&1
ts "build $(ls build/libflashbench_capi.so 2>&1)"
cfg=block_m=128,block_n=128,stages=2,consumer_wgs=2,pingpong=on,intra_wg_overlap=on,scheduler=dynamic
for mode in "flush: read" "cold: false" "flush: write"; do
  tag=$(echo "$mode" | tr -d ' :')
  cat > /tmp/s.yaml <<Y
name: c155
timing: {queue: back_to_back, min_samples: 10, max_noise: 0.01, min_time_s: 0.2, timeout_s: 1, $mode}
problems:
  - {name: p, tokens: 16384, hidden: 2048, seqlen: 512, head_dim: 128, causal: [true, false], dtype: bf16}
variants:
  fa3_pipelined:
    configs:
      - {block_m: 128, block_n: 128, stages: 2, consumer_wgs: 2, pingpong: on, intra_wg_overlap: on, scheduler: dynamic}
Y
  build/flashbench plan /tmp/s.yaml > /tmp/plan.json
  build/flashbench run /tmp/s.yaml --no-counters --no-ceilings -o $L/fb-$tag.json > /tmp/fb.log 2>&1
  timeout 100 python3 scripts/peers.py --problems /tmp/plan.json --peers torch_cudnn --ours fa3_pipelined \
    --ours-config $cfg --rounds 3 -o $L/ab-$tag.json > /tmp/p.log 2>&1; ts "$tag rc $?"
  python3 - <<P
import json
for f in ('$L/fb-$tag.json', '$L/ab-$tag.json'):
    for r in json.load(open(f))['benchmarks']:
        print('$tag', 'fb   ' if 'fb-' in f else 'peers', r['variant'][:14], r['name'].split('/')[-1][:38], r.get('repetition_index'),
              round(r['median_us'], 2), round(r['min_us'], 2), r['sm_clock_mhz'])
P
done
