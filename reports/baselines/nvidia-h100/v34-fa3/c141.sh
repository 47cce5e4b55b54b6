#!/usr/bin/env bash
# c141: acceptance of fa3_pipelined v34 (HEAD) on one GPU-machine call: build, FA3 gtests, `flashbench check` of every
# fa3 config on the awkward shapes, racecheck/synccheck, sweeps/fa3-accept.yaml, peers (torch SDPA cuDNN) + ceilings.
set -u
R=$(pwd); L=/tmp/logs; mkdir -p $L
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,power.limit --format=csv > $L/gpu.txt 2>&1
python3 -c 'import torch; print("torch", torch.__version__)' >> $L/gpu.txt 2>&1
( source scripts/env.sh; fb_configure && fb_build --target flashbench test_kernels ) > $L/build.log 2>&1
ts "build: $(ls build/flashbench 2>&1)"
grep -E 'C75|spill|error' $L/build.log | head -5
FB=build/flashbench
timeout 200 build/tests/test_kernels --gtest_filter='*Fa3*' > $L/gtest.log 2>&1; ts "gtest rc $?: $(tail -3 $L/gtest.log | tr '\n' ' ')"
timeout 200 $FB check --variant fa3_pipelined > $L/check.log 2>&1; ts "check rc $?: $(tail -1 $L/check.log)"
timeout 120 bash scripts/sanitize.sh fa3_pipelined "block_m=128,block_n=128,stages=2,consumer_wgs=2,pingpong=on,intra_wg_overlap=on,scheduler=dynamic" > $L/sanitize.log 2>&1; ts "sanitize rc $?"; cat $L/sanitize.log | cut -c1-60
$FB run sweeps/fa3-accept.yaml -o /tmp/acc.json > $L/acc.log 2>&1; ts "accept rc $?: $(tail -1 $L/acc.log)"
$FB plan sweeps/fa3-accept.yaml > /tmp/plan.json && timeout 200 python3 scripts/peers.py --problems /tmp/plan.json --peers torch_cudnn --ceilings --timeout 2 -o /tmp/peers.json > $L/peers.log 2>&1; ts "peers rc $?"
python3 scripts/peer_table.py /tmp/acc.json /tmp/peers.json --variant fa3_pipelined > $L/table.txt 2>&1
mkdir -p /tmp/res && cp /tmp/acc.json /tmp/peers.json /tmp/plan.json /tmp/res/ 2>/dev/null
tar czf $OUT/res.tgz -C /tmp res
tar czf $OUT/logs.tgz -C /tmp logs
cut -c1-140 $L/table.txt
ts done
