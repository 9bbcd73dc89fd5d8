#!/usr/bin/env bash
# The GPU half of docs/reliability.d/signals.md: signals and a stopped rank against
# `cpkv replay --backend cuda`, on the GPU machine (the lead runs it; no GPU where it was written).
# Every case is bounded; every rank it leaves behind is killed by pid; findings go to
# $OUT/gpu-reliability.md (a table) and $OUT/rel-<case>.{out,err} (the raw output).
# Usage (device tool): scripts/gpu-reliability.sh [BUILD_DIR]   (default: build-gpu, built if missing)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
build="${1:-$root/build-gpu}"
export NCCL_NVLS_ENABLE=0
if [[ ! -x "$build/cli/cpkv" ]]; then
  if ! ls /usr/lib/x86_64-linux-gnu/cmake/rapidcheck >/dev/null 2>&1; then
    mkdir -p /tmp/rc && for deb in "$root"/.deps/librapidcheck-dev_*.deb; do dpkg -x "$deb" /tmp/rc; done
    export CMAKE_PREFIX_PATH="/tmp/rc/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  fi
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 || exit 1
  cmake --build "$build" -j "$(nproc)" --target cpkv > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head; exit 1; }
fi
cpkv="$build/cli/cpkv"
nvidia-smi -L > /dev/null 2>&1 || { echo "gpu-reliability: no GPU here (nvidia-smi -L failed): nothing to measure"; exit 1; }
seeds="$root/traces/samples/seeds_batch.jsonl"   # cp 8: on 2 GPUs, 4 ranks a GPU, IPC sums (device barriers)
report="$OUT/gpu-reliability.md"
nvidia-smi --query-gpu=index,name --format=csv,noheader > "$OUT/gpu-reliability-gpus.txt" 2>&1 || true

# A cp-2 trace that runs long (the tiny sample, 64 layers, 3000 batches: about 30 s): one rank a GPU, NCCL
# all-reduces for v2 (a collective), device barriers for staging_direct.
long2="$OUT/long-cp2.jsonl"
python3 - "$root/traces/samples/tiny.jsonl" "$long2" <<'EOF' || long2=""
import json, sys
lines = open(sys.argv[1]).read().splitlines()
header = json.loads(lines[0]); header["layers"] = {"count": 64, "pattern": "F" * 64}
batches = [json.loads(l) for l in lines[1:]]
with open(sys.argv[2], "w") as out:
    out.write(json.dumps(header) + "\n")
    for b in range(3000):
        batch = dict(batches[b % len(batches)]); batch["batch"] = b; out.write(json.dumps(batch) + "\n")
EOF

now() { echo "${EPOCHREALTIME/./}"; }              # microseconds
ms_since() { echo $(( ($(now) - $1) / 1000 )); }
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) && [[ "$s" != Z* ]]; }
regions_of() { ls /dev/shm 2>/dev/null | grep -c "^cpkv\.$1\." || true; }
gpu_pids() { nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ' | tr '\n' ' '; }

echo "| case | command | action | exit | signal to exit (ms) | stop to report (ms) | region at +1 s | ranks alive after exit | GPU processes of the run after exit | report names the stopped rank |" > "$report"
echo "|---|---|---|---|---|---|---|---|---|---|" >> "$report"

# case NAME ACTION DELAY_S LIMIT_S -- cpkv args. ACTION: TERM | INT-group | KILL | STOP-rank.
run_case() {
  [[ -n "${CASES:-}" && ! "$1" =~ $CASES ]] && return 0  # CASES=REGEX runs only the cases it matches
  local name=$1 action=$2 delay=$3 limit=$4; shift 5
  local out="$OUT/rel-$name.out" err="$OUT/rel-$name.err"
  setsid "$cpkv" "$@" > "$out" 2> "$err" &
  local pid=$!
  sleep "$delay"
  local ranks; ranks=$(pgrep -P "$pid" | tr '\n' ' ')
  local target="" t0; t0=$(now)
  case $action in
    TERM) kill -TERM "$pid" ;;
    INT-group) kill -INT -- "-$pid" ;;
    KILL) kill -KILL "$pid" ;;
    STOP-rank) target=$(echo "$ranks" | awk '{print $2}'); kill -STOP "$target" ;;
  esac
  local region_1s="?" reported="-"
  # A stopped rank: its report (stdout, flushed as each variant ends) comes within the window; with
  # --variant all the process then goes on with the remaining variants, so the exit comes later.
  while alive "$pid" && (( $(ms_since "$t0") < limit * 1000 )); do
    if [[ "$region_1s" == "?" ]] && (( $(ms_since "$t0") >= 1000 )); then region_1s=$(regions_of "$pid"); fi
    if [[ -n "$target" && "$reported" == "-" ]] && grep -q "(pid $target) made no progress" "$out"; then reported=$(ms_since "$t0"); fi
    sleep 0.05
  done
  local took; took=$(ms_since "$t0")
  [[ "$region_1s" == "?" ]] && region_1s=$(regions_of "$pid")
  local rc="HUNG>${limit}s"
  if alive "$pid"; then kill -KILL "$pid"; fi
  wait "$pid"; local status=$?
  [[ "$took" -lt $(( limit * 1000 )) ]] && rc=$status
  sleep 1  # a killed rank's GPU context takes a moment to go
  local left="" r
  for r in $ranks; do alive "$r" && left+="$r "; done
  local on_gpu="" g
  for g in $(gpu_pids); do [[ " $ranks " == *" $g "* ]] && on_gpu+="$g "; done
  local named="-"
  if [[ -n "$target" ]]; then
    grep -q "(pid $target) made no progress" "$out" && named="yes (pid $target)" || named="NO (pid $target)"
  fi
  echo "| $name | \`cpkv $*\` | $action after ${delay} s | $rc | $took | $reported | $region_1s | ${left:-none} | ${on_gpu:-none} | $named |" >> "$report"
  for r in $ranks; do kill -KILL "$r" 2>/dev/null; done  # nothing of this case may outlive it
  ls /dev/shm 2>/dev/null | grep "^cpkv\.$pid\." | while read -r n; do rm -f "/dev/shm/$n"; done
  echo "$name: exit $rc after $took ms; stop to report ${reported} ms; ranks left: ${left:-none}; stopped rank named: $named"
}

run_case seeds-sigterm TERM 8 60 -- replay "$seeds" --backend cuda --layers all --variant all
run_case seeds-ctrl-c INT-group 8 60 -- replay "$seeds" --backend cuda --layers all --variant all
run_case seeds-parent-sigkill KILL 8 20 -- replay "$seeds" --backend cuda --layers all --variant all
run_case seeds-stop-rank-default STOP-rank 6 90 -- replay "$seeds" --backend cuda --layers all --variant all
run_case seeds-stop-rank-10s STOP-rank 6 60 -- replay "$seeds" --backend cuda --layers all --variant all --stuck-ms-max 10000
if [[ -n "$long2" ]]; then
  run_case cp2-stop-rank-barrier STOP-rank 6 60 -- replay "$long2" --backend cuda --layers all --variant staging_direct --stuck-ms-max 10000
  run_case cp2-stop-rank-nccl STOP-rank 6 60 -- replay "$long2" --backend cuda --layers all --variant v2 --stuck-ms-max 10000
  run_case cp2-sigterm TERM 6 60 -- replay "$long2" --backend cuda --layers all --variant v2
fi
{
  echo
  echo "Expected: exit 143 (SIGTERM) / 130 (Ctrl-C) with one stderr line, region 0 at +1 s, no rank alive, no GPU process;"
  echo "parent SIGKILL: ranks gone (death signal), the region swept by the next run; a stopped rank: the report naming the"
  echo "stopped pid within --stuck-ms-max (30 s default) of the stop plus the kill and reap of its group (stop to report);"
  echo "exit 1 once the remaining variants ran (--variant all: signal to exit = stop to report + the later variants)."
  echo "GPUs: $(tr '\n' ';' < "$OUT/gpu-reliability-gpus.txt")"
} >> "$report"
cat "$report"
