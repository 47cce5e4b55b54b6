#!/usr/bin/env bash
# Interleaved acceptance: fa3_pipelined (config per problem: c152's fastest) against cuDNN, same process and timer,
# 3 rounds, back_to_back; d128 first, then d64, each written on its own.
set -u
L=$OUT; t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( source scripts/env.sh; fb_configure && fb_build --target flashbench flashbench_capi ) > /tmp/build.log 2>&1
ts "build $(ls build/libflashbench_capi.so 2>&1)"; grep -E 'error' /tmp/build.log | head -3
sed "s/^timing:/timing:\n  queue: back_to_back/" sweeps/fa3-accept.yaml > /tmp/spec.yaml
build/flashbench plan /tmp/spec.yaml > /tmp/plan.json
for d in 128 64; do
  python3 -c "import json,sys; p=json.load(open('/tmp/plan.json')); p['problems']=[x for x in p['problems'] if x['head_dim']==$d]; json.dump(p,open('/tmp/plan$d.json','w'))"
  timeout 240 python3 scripts/peers.py --problems /tmp/plan$d.json --peers torch_cudnn --timeout 1 \
    --ours fa3_pipelined --ours-best out/c152-acc.json --rounds 3 $([ $d = 128 ] && echo --ceilings) \
    -o $L/ab$d.json > $L/peers$d.log 2>&1
  ts "d$d rc $?"; tail -2 $L/peers$d.log
  python3 scripts/peer_table.py $L/ab$d.json --variant fa3_pipelined 2>&1 | cut -c1-165
done
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,power.limit --format=csv > $L/gpu.txt 2>&1
