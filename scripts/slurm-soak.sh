#!/usr/bin/env bash
# The soak (`cpkv soak`), the mutation suite (`cpkv mutants`) or the explorer (`cpkv explore`)
# spread over a Slurm array job, one shard per array task, then `cpkv merge` folding the shard files
# into the unsharded run's rows (docs/sharding.md).
#
#   scripts/slurm-soak.sh submit --shards N [--suite S] [SUITE OPTIONS] [--out DIR] [--cpkv PATH] [-- SBATCH_ARGS...]
#       submits the array (--array=0-(N-1)) and a merge job that runs after it (afterany), prints both ids
#   scripts/slurm-soak.sh shard [--suite S] [SUITE OPTIONS] [--out DIR] [--cpkv PATH]
#       inside an array task: cpkv S --shard $((SLURM_ARRAY_TASK_ID+1))/$SLURM_ARRAY_TASK_COUNT SUITE OPTIONS
#       --out DIR/counterexamples --json DIR/S-K-of-N.json --junit DIR/S-K-of-N.xml (the report on the job's stdout)
#   scripts/slurm-soak.sh merge --shards N [--suite S] [--out DIR] [--cpkv PATH]
#       cpkv merge DIR/S-*-of-N.json --junit DIR/S-merged.xml: the merged rows on stdout
#
# S (--suite) is soak (the default), mutants or explore. SUITE OPTIONS, passed on to cpkv as given:
#   soak:    --seed S (required: every shard draws the same seeds) [--seeds M] [--minutes T] [--cases C]
#   mutants: [--seed S] [--cases C] [--every-property]
#   explore: [--cp-max C] [--layers-max L] [--variant V] [--seconds-max T] [--shape-layers L] [--no-shapes] [--check-reduction]
# DIR must be on a file system every node sees (default: ./cpkv-shards-$SLURM_JOB_ID, or, for submit,
# ./cpkv-shards-<time>-<pid>: never a fixed path that concurrent runs share). Every shard must see
# the same suite options (submit passes them on). A soak's --minutes bounds each task; submit asks
# Slurm for that plus 10 minutes (--time) unless SBATCH_ARGS name a --time. Exit status: cpkv's (0
# passed, 1 a row failed, 2 bad input); 2, with one line, on bad arguments here (submit also has
# cpkv check the suite options' values before it submits anything).
#SBATCH --job-name=cpkv-soak
#SBATCH --time=01:00:00
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=2
set -euo pipefail

root="${CPKV_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"  # sbatch runs a copy of the script: CPKV_ROOT names the checkout
cpkv="$root/build/cli/cpkv"
where="slurm-soak.sh"
bad() { echo "$where: $*" >&2; exit 2; }
mode="${1:-}"
case "$mode" in
  submit|shard|merge) where="slurm-soak.sh $mode"; shift ;;
  *) bad "the first argument is submit, shard or merge, got '$mode'" ;;
esac
suite="soak" shards="" out="" seed="" minutes="" seeds="" run_args=() given=() sbatch_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --) shift; sbatch_args=("$@"); break ;;
    --every-property|--no-shapes|--check-reduction) run_args+=("$1"); given+=("$1"); shift; continue ;;
  esac
  [[ "$1" == --* ]] || bad "unknown argument '$1' (see the usage at the top of scripts/slurm-soak.sh)"
  [[ $# -ge 2 ]] || bad "$1 needs a value"
  case "$1" in
    --suite) suite="$2" ;;
    --shards) shards="$2" ;;
    --out) out="$2" ;;
    --cpkv) cpkv="$2" ;;
    --seed|--seeds|--minutes|--cases|--cp-max|--layers-max|--variant|--seconds-max|--shape-layers)
      run_args+=("$1" "$2"); given+=("$1")
      case "$1" in --seed) seed="$2" ;; --seeds) seeds="$2" ;; --minutes) minutes="$2" ;; esac ;;
    *) bad "unknown argument '$1' (see the usage at the top of scripts/slurm-soak.sh)" ;;
  esac
  shift 2
done
# The options each suite takes (with a value, or a flag).
case "$suite" in
  soak) takes=" --seed --seeds --minutes --cases " ;;
  mutants) takes=" --seed --cases --every-property " ;;
  explore) takes=" --cp-max --layers-max --variant --seconds-max --shape-layers --no-shapes --check-reduction " ;;
  *) bad "--suite is soak, mutants or explore, got '$suite'" ;;
esac
for option in "${given[@]}"; do
  [[ "$takes" == *" $option "* ]] || bad "$option is not an option of --suite $suite (it takes${takes% })"
done
if [[ "$mode" != merge && "$suite" == soak && -z "$seed" ]]; then bad "--suite soak needs --seed S (every shard must draw the same seeds)"; fi
whole() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

case "$mode" in
  submit)
    whole "$shards" || bad "--shards N (a whole number >= 1) is required, got '$shards'"
    if [[ -n "$seeds" ]] && whole "$seeds" && ((shards > seeds)); then bad "--shards $shards is more than --seeds $seeds (a shard would have no seed)"; fi
    time_args=()
    if [[ "$suite" == soak && -n "$minutes" ]] && [[ " ${sbatch_args[*]} " != *" --time"* && " ${sbatch_args[*]} " != *" -t"* ]]; then
      [[ "$minutes" =~ ^[0-9]+([.][0-9]+)?$ ]] || bad "--minutes is a number of minutes, got '$minutes'"
      time_args=(--time="$(awk -v m="$minutes" 'BEGIN { t = int(m); if (t < m) t += 1; print t + 10 }')")  # whole minutes, 10 to spare
    fi
    # cpkv checks the options' values as it parses them, --help included, and then stops: a bad value
    # is its one line and exit 2 here, not N queued tasks that each fail.
    [[ -x "$cpkv" ]] || bad "--cpkv $cpkv: no such executable (build cpkv, or name it with --cpkv PATH)"
    "$cpkv" "$suite" "${run_args[@]}" --help > /dev/null || exit 2
    out="$(realpath -m "${out:-cpkv-shards-$(date +%Y%m%d-%H%M%S)-$$}")"
    mkdir -p "$out"
    common=(--suite "$suite" --cpkv "$cpkv" --out "$out")
    array_id="$(CPKV_ROOT="$root" sbatch --parsable --job-name="cpkv-$suite" --array="0-$((shards - 1))" --output="$out/$suite-%a.log" \
                "${time_args[@]}" "${sbatch_args[@]}" "$0" shard "${common[@]}" "${run_args[@]}")"
    merge_id="$(CPKV_ROOT="$root" sbatch --parsable --job-name="cpkv-$suite-merge" --dependency="afterany:${array_id%%;*}" \
                --output="$out/$suite-merged.txt" "${sbatch_args[@]}" "$0" merge --shards "$shards" "${common[@]}")"
    echo "slurm-soak.sh: array job $array_id ($shards shards of cpkv $suite), merge job $merge_id; results in $out ($suite-merged.txt, $suite-merged.xml)"
    ;;
  shard)
    task="${SLURM_ARRAY_TASK_ID:-}" count="${SLURM_ARRAY_TASK_COUNT:-}"
    if ! whole "$count" || ! [[ "$task" =~ ^[0-9]+$ ]] || ((task >= count)); then
      bad "needs SLURM_ARRAY_TASK_ID in 0..SLURM_ARRAY_TASK_COUNT-1 (an --array=0-(N-1) task), got '$task' of '$count'"
    fi
    if [[ -n "${SLURM_ARRAY_TASK_MIN:-}" && ( "$SLURM_ARRAY_TASK_MIN" != 0 || "${SLURM_ARRAY_TASK_MAX:-}" != $((count - 1)) ) ]]; then
      bad "the array must be 0-$((count - 1)) without a step (is $SLURM_ARRAY_TASK_MIN-${SLURM_ARRAY_TASK_MAX:-?})"
    fi
    out="${out:-cpkv-shards-${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-$$}}}"
    mkdir -p "$out"  # cpkv makes DIR/counterexamples (0700) in it, or checks the one another task made
    k=$((task + 1))
    exec "$cpkv" "$suite" --shard "$k/$count" "${run_args[@]}" --out "$out/counterexamples" \
         --json "$out/$suite-$k-of-$count.json" --junit "$out/$suite-$k-of-$count.xml"
    ;;
  merge)
    whole "$shards" || bad "--shards N (a whole number >= 1) is required, got '$shards'"
    out="${out:-cpkv-shards-${SLURM_JOB_ID:-$$}}"
    files=()
    for ((k = 1; k <= shards; ++k)); do files+=("$out/$suite-$k-of-$shards.json"); done
    # A shard that failed to write its file is named by cpkv merge (one line, exit 2).
    exec "$cpkv" merge "${files[@]}" --junit "$out/$suite-merged.xml"
    ;;
esac
