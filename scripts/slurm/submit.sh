#!/usr/bin/env bash
# Runs a sweep as a Slurm job array of SHARDS one-GPU tasks, then merges the shard files into OUTDIR/all.json.
#   scripts/slurm/submit.sh SPEC OUTDIR SHARDS [extra sbatch args, e.g. --partition=h100 --account=perf]
# Run it from the repository root on a login node, with flashbench built in build/ on a shared filesystem.
set -euo pipefail
spec=${1:?usage: scripts/slurm/submit.sh SPEC OUTDIR SHARDS [sbatch args...]}
outdir=${2:?OUTDIR}
shards=${3:?SHARDS}
shift 3
here=$(cd "$(dirname "$0")" && pwd)
export FLASHBENCH_ROOT=${FLASHBENCH_ROOT:-$(cd "$here/../.." && pwd)}
mkdir -p "$outdir"
array=$(sbatch --parsable --export=ALL --array=0-$((shards - 1)) "$@" "$here/sweep-shards.sbatch" "$spec" "$outdir" "$shards")
merge=$(sbatch --parsable --export=ALL --dependency=afterany:${array%%;*} "$@" "$here/merge.sbatch" "$outdir" "$shards")
echo "submitted shards as job $array and the merge as job $merge; results: $outdir/all.json"
