#!/usr/bin/env bash
# Session 31: why does fa3's causal d128 N512 run ~2% slower inside the torch process (peers.py --ours) than under
# flashbench's timer on an H100 (c154, c157-c159), but not on an H200 (c155)? At this shape the kernel is near the
# DRAM floor (268 MB in ~104 us: 86% of the copy ceiling) and its time barely moves with the SM clock, so the
# placement of its buffers is a suspect: torch's caching allocator carves tensors out of shared segments, flashbench
# cudaMallocs each. Same problems: flashbench run; peers.py with the caching allocator; peers.py with
# PYTORCH_NO_CUDA_MEMORY_CACHING=1 (a cudaMalloc per tensor); in turn, twice. Non-causal N512 as the control.
set -u
L=$OUT; t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( source scripts/env.sh; fb_configure && fb_build --target flashbench flashbench_capi ) > /tmp/build.log 2>&1
ts "build $(ls build/libflashbench_capi.so 2>&1)"
cat > /tmp/s.yaml <<'Y'
name: c160
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
for pass in 0 1; do
  build/flashbench run /tmp/s.yaml --no-counters --no-ceilings -o /tmp/fb$pass.json > /tmp/fb.log 2>&1; ts "fb rc $?"
  python3 -c "
import json
for r in json.load(open('/tmp/fb$pass.json'))['benchmarks']: print('flashbench', r['name'].split('/')[-1], round(r['median_us'],2), round(r['min_us'],2), r['sm_clock_mhz'])"
  for alloc in caching nocache; do
    env $([ $alloc = nocache ] && echo PYTORCH_NO_CUDA_MEMORY_CACHING=1) timeout 100 python3 scripts/peers.py \
      --problems /tmp/plan.json --peers torch_cudnn --ours fa3_pipelined --ours-config $cfg --rounds 3 \
      --interleave sample -o /tmp/ab-$alloc$pass.json > /tmp/p.log 2>&1; ts "$alloc rc $?"
    python3 -c "
import json
for r in json.load(open('/tmp/ab-$alloc$pass.json'))['benchmarks']: print('$alloc', r['variant'][:14], r['name'].split('/')[-1], r['repetition_index'], round(r['median_us'],2), round(r['min_us'],2), r['sm_clock_mhz'])"
  done
done
tar czf $L/c160.tgz -C /tmp fb0.json fb1.json ab-caching0.json ab-nocache0.json ab-caching1.json ab-nocache1.json
