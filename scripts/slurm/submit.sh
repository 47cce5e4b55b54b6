#!/usr/bin/env bash
# Runs a sweep as a Slurm job array of SHARDS one-GPU tasks, then merges the shard files into OUTDIR/all.json.
#   scripts/slurm/submit.sh SPEC OUTDIR SHARDS [sbatch args...] [-- flashbench run args...]
# e.g. scripts/slurm/submit.sh sweeps/nightly.yaml runs/n1 4 --partition=h100 --account=perf -- --no-counters
# Run it on a login node, with flashbench built on a filesystem the compute nodes share: build/flashbench of this
# checkout, or FLASHBENCH_BIN. The jobs' logs go to the folder it is run from. sbatch args go to both jobs (the
# shards and the merge); flashbench run args to every shard.
set -euo pipefail
usage="usage: scripts/slurm/submit.sh SPEC OUTDIR SHARDS [sbatch args...] [-- flashbench run args...]"
spec=${1:?$usage}
outdir=${2:?$usage}
shards=${3:?$usage}
shift 3
sbatch_args=()
while (($#)) && [ "$1" != -- ]; do sbatch_args+=("$1"); shift; done
(($#)) && shift # the --; what is left goes to flashbench run
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export FLASHBENCH_ROOT=${FLASHBENCH_ROOT:-$(cd "$here/../.." && pwd)}
export FLASHBENCH_BIN=${FLASHBENCH_BIN:-${FLASHBENCH_BUILD_DIR:-$FLASHBENCH_ROOT/build}/flashbench}
die() { echo "submit.sh: $*" >&2; exit 2; }
[[ $shards =~ ^[1-9][0-9]*$ ]] || die "SHARDS must be a positive integer, not '$shards'; $usage"
[ -f "$spec" ] || die "no sweep spec at '$spec'; give a path to a spec (they live in sweeps/)"
[ -x "$FLASHBENCH_BIN" ] || die "no flashbench at $FLASHBENCH_BIN; build it first (scripts/run.sh does, or cmake --build build --target flashbench) or set FLASHBENCH_BIN"
command -v sbatch >/dev/null 2>&1 || die "sbatch not found: run this on a Slurm login node"
# Absolute paths: the jobs may start in another folder (sbatch --chdir among the args).
spec=$(cd "$(dirname "$spec")" && pwd)/$(basename "$spec")
mkdir -p "$outdir" || die "cannot create OUTDIR '$outdir'"
outdir=$(cd "$outdir" && pwd)
array=$(sbatch --parsable --export=ALL --array=0-$((shards - 1)) "${sbatch_args[@]}" \
          "$here/sweep-shards.sbatch" "$spec" "$outdir" "$shards" "$@")
array=${array%%;*} # --parsable prints "id" or "id;cluster"
# afterany: a shard that ends in error still lets the merge run, which then names the missing shard.
merge=$(sbatch --parsable --export=ALL --dependency=afterany:"$array" "${sbatch_args[@]}" \
          "$here/merge.sbatch" "$outdir" "$shards")
merge=${merge%%;*}
echo "submitted shards as job $array and the merge as job $merge; results: $outdir/all.json"
