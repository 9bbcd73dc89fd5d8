#!/usr/bin/env bash
# N consecutive conformance runs of cpkv's reference implementations over a list of cases, counting
# outcomes: the measurement behind issue 35's "100 consecutive passing runs, no false liveness failure".
#   scripts/conformance-repeat.sh [-n RUNS] [-s BASE_SEED] [-t RUN_S_MAX] [-o LOG_DIR] [CASE ...]
# A CASE is TRACE:RANKS:LAYERS:IMPL (IMPL a module:Class); the default list is below. Run i uses
# case i mod (number of cases) and seed BASE_SEED + i, both printed on its line, so any run can be
# replayed alone. Each run is bounded by RUN_S_MAX seconds (timeout(1), then SIGKILL 10 s later);
# a run that passes the bound counts as "timeout". The output of a run that did not pass is kept in
# LOG_DIR (default: a new folder under /tmp). PYTHONPATH must reach the built package (build/python).
# Exit status: 0 when every run passed, 1 otherwise, 2 on a bad argument.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=100
base_seed=$(( (RANDOM << 15) | RANDOM ))
run_s_max=600
log_dir=""
usage() { echo "usage: $0 [-n RUNS] [-s BASE_SEED] [-t RUN_S_MAX] [-o LOG_DIR] [TRACE:RANKS:LAYERS:IMPL ...]" >&2; exit 2; }
while getopts "n:s:t:o:" opt; do
  case "$opt" in
    n) runs="$OPTARG" ;;
    s) base_seed="$OPTARG" ;;
    t) run_s_max="$OPTARG" ;;
    o) log_dir="$OPTARG" ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
for number in "$runs" "$base_seed" "$run_s_max"; do
  [[ "$number" =~ ^[0-9]+$ ]] || { echo "conformance-repeat: '$number' is not a non-negative integer" >&2; exit 2; }
done
samples="$root/traces/samples"
reference="cpkv.conformance.reference"
cases=("$@")
if ((${#cases[@]} == 0)); then
  # Three cheap cases for each cp-8 case: the cp-8 runs (8 ranks on a small machine) are the ones
  # whose late reports once read as a false death (issue 35, item 7a).
  cases=("$samples/tiny.jsonl:2:2:$reference:StagingDirect"
         "$samples/seeds_batch.jsonl:8:2:$reference:StagingDirect"
         "$samples/tiny.jsonl:2:2:$reference:V2"
         "$samples/tiny.jsonl:2:1:$reference:StagingDirect"
         "$samples/seeds_batch.jsonl:8:2:$reference:V2"
         "$samples/tiny.jsonl:2:2:$reference:V2")
fi
log_dir="${log_dir:-$(mktemp -d /tmp/cpkv-conformance-repeat.XXXXXX)}"
mkdir -p "$log_dir" || exit 2
python="${PYTHON:-python3}"
echo "conformance-repeat: $runs runs, base seed $base_seed, bound ${run_s_max} s a run, ${#cases[@]} cases, logs in $log_dir"
echo "conformance-repeat: $(date -u +%FT%TZ) on $(hostname), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

passed=0 failed=0 liveness=0 timed_out=0
for ((i = 0; i < runs; ++i)); do
  IFS=: read -r trace ranks layers module class <<<"${cases[i % ${#cases[@]}]}"
  seed=$((base_seed + i))
  log="$log_dir/run-$i.log"
  started=$SECONDS
  timeout -k 10 "$run_s_max" "$python" -m cpkv.conformance "$trace" --impl "$module:$class" --ranks "$ranks" \
    --layers "$layers" --seed "$seed" >"$log" 2>&1
  status=$?
  line="run $i: $(basename "$trace") ranks $ranks layers $layers $class seed $seed: exit $status, $((SECONDS - started)) s"
  if ((status == 0)); then
    passed=$((passed + 1))
    rm -f "$log"
  elif ((status == 124 || status == 137)); then
    timed_out=$((timed_out + 1))
    line+=" (past the ${run_s_max} s bound; $log)"
  else
    failed=$((failed + 1))
    grep -qiE "liveness|died|never returned|no rank moved" "$log" && liveness=$((liveness + 1))
    line+=" ($log)"
  fi
  echo "$line"
  ((status == 0)) || sed 's/^/    /' "$log" | tail -n 40
done
echo "conformance-repeat: $passed passed, $failed failed ($liveness of them liveness), $timed_out past the bound, of $runs; load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
((passed == runs))
