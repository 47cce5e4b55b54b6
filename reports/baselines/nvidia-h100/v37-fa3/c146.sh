#!/usr/bin/env bash
# c146: v38 against v37 (HEAD) in one call (scripts/dev/fa3-ab-call.sh: both builds, FA3 gtests, two passes, cuDNN
# peers), then on the new build: `flashbench check` of every fa3 config and racecheck/synccheck on a causal and a
# non-causal small awkward shape (the causal and plain kernels).
set -u
bash scripts/dev/fa3-ab-call.sh out/old out/ab47.yaml 2>&1 | tail -45
L=/tmp/logs; t0=$(date +%s); ts() { echo "[+$(( $(date +%s) - t0 )) s] $*"; }
timeout 150 build/flashbench check --variant fa3_pipelined > $L/check.log 2>&1; ts "check rc $?: $(tail -1 $L/check.log)"
cfg="block_m=128,block_n=128,stages=2,consumer_wgs=2,pingpong=on,intra_wg_overlap=on,scheduler=dynamic"
timeout 60 bash scripts/sanitize.sh fa3_pipelined "$cfg" > $L/sanitize.log 2>&1; ts "sanitize causal rc $?"
timeout 60 bash scripts/sanitize.sh fa3_pipelined "$cfg" batch=1,heads_q=4,heads_kv=2,seqlen_q=200,seqlen_kv=333,head_dim=128,causal=false,dtype=bf16 >> $L/sanitize.log 2>&1; ts "sanitize plain rc $?"
cut -c1-200 $L/sanitize.log
tar czf $OUT/logs.tgz -C /tmp logs
