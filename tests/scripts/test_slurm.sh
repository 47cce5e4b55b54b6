#!/usr/bin/env bash
# scripts/slurm/ under a real Slurm: a single-node cluster on this machine (munged, slurmctld and slurmd from
# Debian's munge and slurm-wlm, in a temporary folder, on free ports, with a node that declares 4 GPUs as a generic
# resource so that the shards' --gres=gpu:1 is honoured) runs scripts/slurm/submit.sh with the fake worker as a
# 4-shard job array and its merge job. The merged file must hold what a single-process run of the same spec holds:
# the same points in the same order, with the same statuses, reasons and (fake, deterministic) times. The spec
# includes a point that crashes, so the shard that holds it exits 1, which must not stop the merge.
#   tests/scripts/test_slurm.sh FLASHBENCH_BIN
# Needs root (slurmd starts jobs as their user) and the programs of slurm-wlm and munge (scripts/deps.sh test
# installs them); without them it prints "test_slurm: SKIPPED" and the reason. Every daemon it starts is stopped on
# exit, by its process id.
set -uo pipefail
fb=${1:?usage: test_slurm.sh FLASHBENCH_BIN}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
skip() { echo "test_slurm: SKIPPED: $*"; exit 0; }
fail() { echo "test_slurm: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root (slurmd runs the jobs as their owner)"
for c in munged slurmctld slurmd sbatch squeue scontrol sinfo python3; do
  command -v "$c" >/dev/null 2>&1 ||
    skip "$c not found: apt-get install slurm-wlm munge (scripts/deps.sh test does it where there is network)"
done

t=$(mktemp -d /tmp/fb-slurm.XXXXXX)
chmod 700 "$t"
pids=()
jobs_submitted=""
cleanup() {
  local p
  # Jobs still queued or running when the test gives up: cancelled through this cluster's controller (SLURM_CONF).
  [ -n "$jobs_submitted" ] && scancel $jobs_submitted 2>/dev/null && sleep 1
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  if [ "${keep:-0}" = 1 ]; then echo "test_slurm: logs kept in $t"; else rm -rf "$t"; fi
}
trap cleanup EXIT

# munged on its own key and socket. It refuses a key others can read; --force lets it run as root.
dd if=/dev/urandom of="$t/munge.key" bs=1024 count=1 status=none && chmod 400 "$t/munge.key"
munged --force --foreground --key-file="$t/munge.key" --socket="$t/munge.sock" --pid-file="$t/munged.pid" \
  --log-file="$t/munged.log" --seed-file="$t/munged.seed" >"$t/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$t/munge.sock" ] && break; sleep 0.1; done
[ -S "$t/munge.sock" ] || { keep=1; cat "$t/munged.out" "$t/munged.log" 2>/dev/null; fail "munged did not start"; }

read -r ctl_port node_port < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
host=$(hostname -s)
mkdir -p "$t/state" "$t/spool" "$t/jobs" "$t/out"
cat >"$t/slurm.conf" <<EOF
ClusterName=fbtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$node_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$t/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$t/state
SlurmdSpoolDir=$t/spool
SlurmctldPidFile=$t/slurmctld.pid
SlurmdPidFile=$t/slurmd.pid
SlurmctldLogFile=$t/slurmctld.log
SlurmdLogFile=$t/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
GresTypes=gpu
MinJobAge=600
NodeName=fbnode NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=32 RealMemory=1000 Gres=gpu:4 State=UNKNOWN
PartitionName=fb Nodes=fbnode Default=YES MaxTime=INFINITE State=UP
EOF
# Slurm drops a GPU without a device file: four empty files stand in (task/none confines no device).
touch "$t"/gpu0 "$t"/gpu1 "$t"/gpu2 "$t"/gpu3
echo "NodeName=fbnode Name=gpu File=$t/gpu[0-3]" >"$t/gres.conf"
export SLURM_CONF="$t/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" >"$t/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N fbnode -f "$SLURM_CONF" >"$t/slurmd.out" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 150); do
  state=$(sinfo -h -n fbnode -o %T 2>/dev/null | head -1)
  [ "$state" = idle ] && break
  sleep 0.2
done
if [ "$state" != idle ]; then
  keep=1
  tail -n 20 "$t/slurmctld.log" "$t/slurmd.log" "$t/slurmctld.out" "$t/slurmd.out" 2>/dev/null
  fail "the node did not come up idle within 30 s (state '$state')"
fi
echo "test_slurm: single-node Slurm up ($(slurmctld -V), controller port $ctl_port)"

# The spec: points that run, skip (head_dim 300 is supported by no variant), and crash (test_faults).
cat >"$t/spec.yaml" <<'EOF'
name: slurm-test
problems:
  - {batch: 1, heads: 2, seqlen: [64, 128, 256], head_dim: [64, 300]}
  - {batch: 2, heads_q: 8, heads_kv: 2, seqlen_q: 1, seqlen_kv: 1000, head_dim: 128}
variants:
  naive: default
  flash_decoding: default
  test_faults:
    configs: [{fault: none}, {fault: illegal_access}]
  fa1_kv_outer:
    configs: [{}, {block_m: 16, block_n: 64, q_tiles_per_cta: 1}]
EOF
export FLASHBENCH_TEST_VARIANTS=1 # registers test_faults; --export=ALL hands it to the jobs
fake=(--fake-worker --fake-delay-ms 1 --no-ceilings)
"$fb" run "$t/spec.yaml" "${fake[@]}" -o "$t/single.json" >"$t/single.log" 2>&1
rc=$?
[ $rc = 1 ] || { cat "$t/single.log"; fail "the single-process run exited $rc (expected 1: one point crashes)"; }

# Submitted from $t: the jobs' logs go there. The fake worker needs no GPU; the node's GRES stand in for GPUs.
sub=$(cd "$t/jobs" && FLASHBENCH_BIN="$fb" bash "$root/scripts/slurm/submit.sh" "$t/spec.yaml" "$t/out" 4 \
        -- "${fake[@]}" 2>&1) || fail "submit.sh failed: $sub"
echo "test_slurm: $sub"
array=$(sed -n 's/.*shards as job \([0-9]*\) .*/\1/p' <<<"$sub")
merge=$(sed -n 's/.*merge as job \([0-9]*\);.*/\1/p' <<<"$sub")
[ -n "$array" ] && [ -n "$merge" ] || fail "cannot read the job ids from: $sub"
jobs_submitted="$array $merge"
for _ in $(seq 600); do
  [ -z "$(squeue -h -j "$array,$merge" -o %i 2>/dev/null)" ] && break
  sleep 0.2
done
if [ -n "$(squeue -h -j "$array,$merge" -o %i 2>/dev/null)" ]; then
  keep=1; squeue; fail "the jobs did not finish within 120 s"
fi

job_state() { scontrol -o show job "$1" | tr ' ' '\n' | sed -n 's/^JobState=//p'; }
bad=0
for i in 0 1 2 3; do
  s=$(job_state "${array}_$i")
  echo "test_slurm: shard $i: $s"
  [ "$s" = COMPLETED ] || bad=1
done
s=$(job_state "$merge")
echo "test_slurm: merge: $s"
[ "$s" = COMPLETED ] || bad=1
if [ $bad = 1 ]; then
  keep=1
  tail -n 30 "$t"/jobs/*.log
  fail "a job did not complete"
fi
for i in 0 1 2 3; do
  [ -f "$t/jobs/flashbench-shard-${array}_$i.log" ] || fail "no log of shard $i in the submit folder"
done

python3 - "$t/single.json" "$t/out/all.json" <<'PY' || { keep=1; fail "the merged file differs from the single run"; }
import collections, json, sys
one, merged = (json.load(open(p)) for p in sys.argv[1:3])
def points(doc):
    return [(r["name"], r["status"], r.get("reason", ""), r.get("median_us")) for r in doc["benchmarks"]]
a, b = points(one), points(merged)
print("test_slurm: single run {} points {}, merged {} points from {} shards".format(
    len(a), dict(collections.Counter(p[1] for p in a)), len(b), len(merged["context"].get("merged_from") or [])))
ok = a == b
if not ok:
    for x, y in zip(a, b):
        if x != y:
            print("  first difference: single {} / merged {}".format(x, y))
            break
    print("  only in single: {}; only in merged: {}".format(sorted(set(a) - set(b))[:5], sorted(set(b) - set(a))[:5]))
statuses = {p[1] for p in a}
if not {"ok", "skipped", "crashed"} <= statuses:
    print("  the spec no longer gives ok, skipped and crashed points: {}".format(sorted(statuses)))
    ok = False
if one["context"].get("plan_hash") != merged["context"].get("plan_hash"):
    print("  plan_hash differs: {} / {}".format(one["context"].get("plan_hash"), merged["context"].get("plan_hash")))
    ok = False
sys.exit(0 if ok else 1)
PY
echo "test_slurm: PASS"
