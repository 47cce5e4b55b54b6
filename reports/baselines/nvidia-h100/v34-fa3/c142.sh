#!/usr/bin/env bash
# c142: v36 (code size) against HEAD's kernel: two builds, FA3 gtests on the new one, A/B two passes, peers
set -u
R=$(pwd); L=/tmp/logs; mkdir -p $L
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,power.limit --format=csv > $L/gpu.txt 2>&1
mkdir -p /tmp/old && tar --exclude=./build --exclude=./out --exclude=./reports/baselines -cf - . | tar -xf - -C /tmp/old
cp out/old/fa3_pipelined.cuh out/old/wgmma_ops.cuh /tmp/old/kernels/fa3_pipelined/
( source scripts/env.sh; fb_configure && fb_build --target flashbench test_kernels ) > $L/build-new.log 2>&1 &
( cd /tmp/old && source scripts/env.sh && FB_BUILD=/tmp/old/build && fb_configure && fb_build --target flashbench ) > $L/build-old.log 2>&1 &
wait
ts "builds: new $(ls build/flashbench 2>&1) old $(ls /tmp/old/build/flashbench 2>&1)"
grep -E 'C75|spill|error' $L/build-new.log | head -5
NEW=build/flashbench; OLD=/tmp/old/build/flashbench
timeout 200 build/tests/test_kernels --gtest_filter='*Fa3*' > $L/gtest.log 2>&1; ts "gtest rc $?: $(tail -3 $L/gtest.log | tr '\n' ' ')"
for p in 0 1; do
  $OLD run out/ab44.yaml -o /tmp/a$p.json > $L/run-a$p.log 2>&1; ts "old pass $p rc $?"
  $NEW run out/ab44.yaml -o /tmp/b$p.json > $L/run-b$p.log 2>&1; ts "new pass $p rc $?"
done
for p in 0 1; do python3 scripts/dev/fa3_ab.py --files /tmp/a$p.json /tmp/b$p.json > $L/ab$p.txt 2>&1; tail -2 $L/ab$p.txt; done
$NEW plan out/ab44.yaml > /tmp/plan.json && timeout 170 python3 scripts/peers.py --problems /tmp/plan.json --peers torch_cudnn --timeout 2 -o /tmp/peers.json > $L/peers.log 2>&1; ts "peers rc $?"
mkdir -p /tmp/res && cp /tmp/a?.json /tmp/b?.json /tmp/peers.json /tmp/res/ 2>/dev/null
tar czf $OUT/res.tgz -C /tmp res
tar czf $OUT/logs.tgz -C /tmp logs
cat $L/ab0.txt
ts done
