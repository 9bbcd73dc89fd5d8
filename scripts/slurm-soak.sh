#!/usr/bin/env bash
# The simulator's mutation suite (`cpkv mutants`) spread over a Slurm array job, one shard per array
# task, then `cpkv merge` folding the shard files into the one table (docs/sharding.md).
#
#   scripts/slurm-soak.sh submit --shards N [--seed S] [--cases C] [--out DIR] [--cpkv PATH] [-- SBATCH_ARGS...]
#       submits the array (--array=0-(N-1)) and a merge job that runs after it (afterany), prints both ids
#   scripts/slurm-soak.sh shard [--seed S] [--cases C] [--out DIR] [--cpkv PATH]
#       inside an array task: cpkv mutants --shard $((SLURM_ARRAY_TASK_ID+1))/$SLURM_ARRAY_TASK_COUNT
#       --json DIR/shard-K-of-N.json --junit DIR/shard-K-of-N.xml (the table on the job's stdout)
#   scripts/slurm-soak.sh merge --shards N [--out DIR] [--cpkv PATH]
#       cpkv merge DIR/shard-*-of-N.json --junit DIR/merged.xml: the table on stdout
#
# DIR must be on a file system every node sees (default: ./cpkv-shards-$SLURM_JOB_ID, or, for submit,
# ./cpkv-shards-<time>-<pid>: never a fixed path that concurrent runs share). Every shard must see
# the same --seed and --cases (submit passes them on). Exit status: cpkv's (0 all caught, 1 a row
# failed, 2 bad input); 2 on bad arguments here.
#SBATCH --job-name=cpkv-mutants
#SBATCH --time=01:00:00
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=2
set -euo pipefail

root="${CPKV_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"  # sbatch runs a copy of the script: CPKV_ROOT names the checkout
cpkv="$root/build/cli/cpkv"
mode="${1:-}"
[[ $# -gt 0 ]] && shift
shards="" out="" run_args=() sbatch_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shards) shards="$2"; shift 2 ;;
    --seed|--cases) run_args+=("$1" "$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --cpkv) cpkv="$2"; shift 2 ;;
    --) shift; sbatch_args=("$@"); break ;;
    *) echo "slurm-soak.sh: unknown argument '$1' (see the usage at the top of scripts/slurm-soak.sh)" >&2; exit 2 ;;
  esac
done
whole() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

case "$mode" in
  submit)
    whole "$shards" || { echo "slurm-soak.sh submit: --shards N (a whole number >= 1) is required, got '$shards'" >&2; exit 2; }
    out="$(realpath -m "${out:-cpkv-shards-$(date +%Y%m%d-%H%M%S)-$$}")"
    mkdir -p "$out"
    common=(--cpkv "$cpkv" --out "$out")
    array_id="$(CPKV_ROOT="$root" sbatch --parsable --array="0-$((shards - 1))" --output="$out/shard-%a.log" "${sbatch_args[@]}" \
                "$0" shard "${common[@]}" "${run_args[@]}")"
    merge_id="$(CPKV_ROOT="$root" sbatch --parsable --dependency="afterany:${array_id%%;*}" --output="$out/merged.txt" "${sbatch_args[@]}" \
                "$0" merge --shards "$shards" "${common[@]}")"
    echo "slurm-soak.sh: array job $array_id ($shards shards), merge job $merge_id; results in $out (merged.txt, merged.xml)"
    ;;
  shard)
    task="${SLURM_ARRAY_TASK_ID:-}" count="${SLURM_ARRAY_TASK_COUNT:-}"
    if ! whole "$count" || ! [[ "$task" =~ ^[0-9]+$ ]] || ((task >= count)); then
      echo "slurm-soak.sh shard: needs SLURM_ARRAY_TASK_ID in 0..SLURM_ARRAY_TASK_COUNT-1 (an --array=0-(N-1) task), got '$task' of '$count'" >&2; exit 2
    fi
    if [[ -n "${SLURM_ARRAY_TASK_MIN:-}" && ( "$SLURM_ARRAY_TASK_MIN" != 0 || "${SLURM_ARRAY_TASK_MAX:-}" != $((count - 1)) ) ]]; then
      echo "slurm-soak.sh shard: the array must be 0-$((count - 1)) without a step (is $SLURM_ARRAY_TASK_MIN-${SLURM_ARRAY_TASK_MAX:-?})" >&2; exit 2
    fi
    out="${out:-cpkv-shards-${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-$$}}}"
    mkdir -p "$out"
    k=$((task + 1))
    exec "$cpkv" mutants --shard "$k/$count" "${run_args[@]}" --json "$out/shard-$k-of-$count.json" --junit "$out/shard-$k-of-$count.xml"
    ;;
  merge)
    whole "$shards" || { echo "slurm-soak.sh merge: --shards N (a whole number >= 1) is required, got '$shards'" >&2; exit 2; }
    out="${out:-cpkv-shards-${SLURM_JOB_ID:-$$}}"
    files=()
    for ((k = 1; k <= shards; ++k)); do files+=("$out/shard-$k-of-$shards.json"); done
    # A shard that failed to write its file is named by cpkv merge (one line, exit 2).
    exec "$cpkv" merge "${files[@]}" --junit "$out/merged.xml"
    ;;
  *) echo "slurm-soak.sh: the first argument is submit, shard or merge, got '$mode'" >&2; exit 2 ;;
esac
