#!/usr/bin/env bash
# Same-call A/B of two fa3_pipelined builds on the GPU machine (kernels/fa3_pipelined/NOTES.md, v33 onwards): the
# working tree's kernel (B) against the kernel files in OLD_DIR (A: fa3_pipelined.cuh, wgmma_ops.cuh and any other file
# of kernels/fa3_pipelined placed there, e.g. from `git show HEAD:kernels/fa3_pipelined/...`), built side by side from
# the same tree. Then: the FA3 gtests on B; SPEC
# run twice by each build in turn and compared per pass by scripts/dev/fa3_ab.py; torch SDPA cuDNN on SPEC's plan; and,
# given NCU_SPEC (one point), ncu source counters, warp states, speed of light and the instruction cache's counters of
# both builds on it, and the instruction cache's counters of torch SDPA cuDNN on PEER_PROBE (scripts/dev/peer_probe.py's
# arguments, default "128 512 0 cudnn": the shape of one128.yaml). NCU_SKIP=n profiles each build's (n+1)-th fa3 launch
# instead of its first (whose instruction fetches all miss: v37), and ncu leaves the caches as the launches before left
# them (--cache-control none) for every profile, the peer's too.
# Results, logs and ncu pages go to $OUT as res.tgz, logs.tgz (and ncu.tgz). Run from the repository root:
#   bash scripts/dev/fa3-ab-call.sh OLD_DIR SPEC [NCU_SPEC]
# FLASHBENCH_SOURCE_SHA=<commit, expanded where the command is written> names it in the results (scripts/env.sh): the
# GPU machine's copy of the tree carries another .git.
set -u
old_dir=${1:?usage: fa3-ab-call.sh OLD_DIR SPEC [NCU_SPEC]}
spec=${2:?usage: fa3-ab-call.sh OLD_DIR SPEC [NCU_SPEC]}
ncu_spec=${3:-}
out=${OUT:?set OUT to the folder the results go to}
L=/tmp/logs; mkdir -p $L
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,power.limit --format=csv > $L/gpu.txt 2>&1
mkdir -p /tmp/old && tar --exclude=./build --exclude=./out --exclude=./reports/baselines -cf - . | tar -xf - -C /tmp/old
cp "$old_dir"/* /tmp/old/kernels/fa3_pipelined/
( source scripts/env.sh; fb_configure && fb_build --target flashbench test_kernels ) > $L/build-new.log 2>&1 &
( cd /tmp/old && source scripts/env.sh && FB_BUILD=/tmp/old/build && fb_configure && fb_build --target flashbench ) > $L/build-old.log 2>&1 &
wait
ts "builds: new $(ls build/flashbench 2>&1) old $(ls /tmp/old/build/flashbench 2>&1)"
grep -E 'C75|spill|error' $L/build-new.log | head -5
NEW=build/flashbench; OLD=/tmp/old/build/flashbench
timeout 200 build/tests/test_kernels --gtest_filter='*Fa3*' > $L/gtest.log 2>&1; ts "gtest rc $?: $(tail -3 $L/gtest.log | tr '\n' ' ')"
for p in 0 1; do
  $OLD run "$spec" -o /tmp/a$p.json > $L/run-a$p.log 2>&1; ts "old pass $p rc $?"
  $NEW run "$spec" -o /tmp/b$p.json > $L/run-b$p.log 2>&1; ts "new pass $p rc $?"
done
for p in 0 1; do python3 scripts/dev/fa3_ab.py --files /tmp/a$p.json /tmp/b$p.json > $L/ab$p.txt 2>&1; tail -2 $L/ab$p.txt; done
$NEW plan "$spec" > /tmp/plan.json && timeout 170 python3 scripts/peers.py --problems /tmp/plan.json --peers torch_cudnn --timeout 2 -o /tmp/peers.json > $L/peers.log 2>&1; ts "peers rc $?"
# The instruction cache (ICC per SM; a miss that is not covered by a pending one goes to the GPC's cache, GCC).
icc=sm__icc_requests.sum,sm__icc_requests_lookup_hit.sum,sm__icc_requests_lookup_miss.sum,sm__icc_requests_lookup_miss_tag_miss.sum
if [ -n "$ncu_spec" ]; then
  timeout 100 ncu --clock-control none --cache-control none --metrics $icc --nvtx --nvtx-include "probe/" -c 1 python3 scripts/dev/peer_probe.py ${PEER_PROBE:-128 512 0 cudnn} > /tmp/icc-cudnn.txt 2>&1
  ts "ncu cudnn icc rc $?"
  for w in new old; do
    fb=$NEW; [ $w = old ] && fb=$OLD
    timeout 100 ncu --clock-control none --section SourceCounters --section WarpStateStats --section SpeedOfLight --metrics $icc --cache-control none --launch-skip ${NCU_SKIP:-0} -k regex:fa3_kernel -c 1 -o /tmp/ncu-$w $fb run "$ncu_spec" -o /tmp/one-$w.json > $L/ncu-$w.log 2>&1
    ncu -i /tmp/ncu-$w.ncu-rep --page source --csv --print-source sass > /tmp/sass-$w.csv 2>>$L/ncu-$w.log
    ncu -i /tmp/ncu-$w.ncu-rep --page details > /tmp/details-$w.txt 2>>$L/ncu-$w.log
    ts "ncu $w done"
  done
  grep -h -E 'icc_requests|fa3_kernel|cudnn' /tmp/details-new.txt /tmp/details-old.txt /tmp/icc-cudnn.txt
  tar czf "$out"/ncu.tgz -C /tmp sass-new.csv sass-old.csv details-new.txt details-old.txt icc-cudnn.txt
fi
mkdir -p /tmp/res && cp /tmp/a?.json /tmp/b?.json /tmp/peers.json /tmp/res/ 2>/dev/null
tar czf "$out"/res.tgz -C /tmp res
tar czf "$out"/logs.tgz -C /tmp logs
cat $L/ab0.txt
ts done
