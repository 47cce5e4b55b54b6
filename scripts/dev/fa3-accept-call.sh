#!/usr/bin/env bash
# Issue #7's acceptance of fa3_pipelined in one GPU-machine call (kernels/fa3_pipelined/NOTES.md; c141, c146 ran it as
# copies): build; the FA3 gtests; `flashbench check` of every fa3 config on the awkward shapes; racecheck and synccheck
# on a small causal and a small non-causal shape (the causal and the non-causal kernel, v37); sweeps/fa3-accept.yaml;
# torch SDPA cuDNN on the same plan with the ceilings (a large bf16 GEMM, a device copy); the table of ours / cuDNN.
# About 7 minutes on an H100 (scripts/gpu-ci.sh does all of this and more, but needs more than one call's 10 minutes).
# Results and logs go to $OUT as res.tgz and logs.tgz. Run from the repository root:
#   bash scripts/dev/fa3-accept-call.sh [SPEC]
# FLASHBENCH_SOURCE_SHA=<commit, expanded where the command is written> names it in the results (scripts/env.sh): the
# GPU machine's copy of the tree carries another .git.
# QUEUE=back_to_back runs SPEC with timing.queue back_to_back (both harnesses; harness/include/flashbench/timing.hpp).
# ROUNDS=R: the peers step times fa3_pipelined too (peers.py --ours, each problem's config the sweep's fastest), in
# turn with cuDNN, R rounds, and the table pairs them round by round (scripts/peer_table.py on ab.json). A round of
# the 24 problems can take up to 24 x 2 x 1 s (power-capped points are noisy and run to the 1-s timeout): with the
# ~6 minutes before it, ROUNDS=3 fits one 10-minute call, 5 did not (c153 of session 30). NOTES.md, session 30.
# INTERLEAVE=sample times ours and cuDNN in one loop, sample by sample in turn (peers.py --interleave; default round).
# TOP=K: the peers step times each problem's K fastest configs (peers.py --ours-top; by their fastest sample), and the
# table chooses one on round 0 and reports the later rounds. SKIP_TESTS=1 leaves out the gtests, check and sanitize
# (for a call on a tree whose tests passed in an earlier call).
set -u
spec=${1:-sweeps/fa3-accept.yaml}
if [ -n "${QUEUE:-}" ]; then
  sed "s/^timing:/timing:\n  queue: $QUEUE/" "$spec" > /tmp/spec-queue.yaml && spec=/tmp/spec-queue.yaml
fi
out=${OUT:?set OUT to the folder the results go to}
L=/tmp/logs; mkdir -p $L /tmp/res
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,power.limit --format=csv > $L/gpu.txt 2>&1
python3 -c 'import torch; print("torch", torch.__version__)' >> $L/gpu.txt 2>&1
( source scripts/env.sh; fb_configure && fb_build --target flashbench test_kernels flashbench_capi ) > $L/build.log 2>&1
ts "build: $(ls build/flashbench 2>&1)"
grep -E 'C75|spill|error' $L/build.log | head -5
FB=build/flashbench
if [ -z "${SKIP_TESTS:-}" ]; then
timeout 200 build/tests/test_kernels --gtest_filter='*Fa3*:*Capi*:*Timer*' > $L/gtest.log 2>&1; ts "gtest rc $?: $(tail -1 $L/gtest.log)"
timeout 200 $FB check --variant fa3_pipelined > $L/check.log 2>&1; ts "check rc $?: $(tail -1 $L/check.log)"
cfg="block_m=128,block_n=128,stages=2,consumer_wgs=2,pingpong=on,intra_wg_overlap=on,scheduler=dynamic"
shape="batch=1,heads_q=4,heads_kv=2,seqlen_q=200,seqlen_kv=333,head_dim=128,dtype=bf16"
for causal in true false; do
  timeout 90 bash scripts/sanitize.sh fa3_pipelined "$cfg" "$shape,causal=$causal" >> $L/sanitize.log 2>&1
  ts "sanitize causal=$causal rc $?"
done
fi
$FB run "$spec" -o /tmp/res/acc.json > $L/acc.log 2>&1; ts "sweep rc $?: $(tail -1 $L/acc.log)"
if [ -n "${ROUNDS:-}" ]; then
  $FB plan "$spec" > /tmp/res/plan.json && timeout 230 python3 scripts/peers.py --problems /tmp/res/plan.json \
    --peers torch_cudnn --ceilings --timeout 1 --ours fa3_pipelined --ours-best /tmp/res/acc.json --rounds "$ROUNDS" \
    --interleave "${INTERLEAVE:-round}" --ours-top "${TOP:-1}" \
    -o /tmp/res/ab.json > $L/peers.log 2>&1; ts "interleaved peers rc $?"
  python3 scripts/peer_table.py /tmp/res/ab.json --variant fa3_pipelined > $L/table.txt 2>&1
else
  $FB plan "$spec" > /tmp/res/plan.json && timeout 200 python3 scripts/peers.py --problems /tmp/res/plan.json \
    --peers torch_cudnn --ceilings --timeout 2 -o /tmp/res/peers.json > $L/peers.log 2>&1; ts "peers rc $?"
  python3 scripts/peer_table.py /tmp/res/acc.json /tmp/res/peers.json --variant fa3_pipelined > $L/table.txt 2>&1
fi
tar czf "$out"/res.tgz -C /tmp res
tar czf "$out"/logs.tgz -C /tmp logs
cut -c1-140 $L/table.txt
ts done
