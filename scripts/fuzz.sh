#!/usr/bin/env bash
# Fuzzes the trace reader (whole files, and batch lines under a fixed header) and the Mooncake log
# reader with libFuzzer + ASan + UBSan (fuzz/README.md).
#
#   scripts/fuzz.sh MINUTES            a long run: MINUTES of wall time split between the targets,
#                                      one at a time; new inputs are kept in fuzz/corpus/TARGET/
#                                      (git-ignored), crashes in fuzz/artifacts/TARGET/
#   scripts/fuzz.sh --smoke SECONDS    the test suite's run (ctest cpkv.fuzz.smoke): every target for
#                                      SECONDS at once, from the seeds only, in a temporary folder
#
# Builds the targets first with clang in BUILD (default build-fuzz; CPKV_FUZZ_BUILD_DIR overrides).
# Prints, per target, executions, new inputs and crashes; exits 1 if any target crashed, leaked or
# hit undefined behaviour, 2 on a usage or build problem. The libFuzzer seed is printed; set
# CPKV_FUZZ_SEED to repeat a run's choices. CPKV_FUZZ_OPT overrides the optimization level.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
targets=(trace_file trace_batches mooncake)

usage() { echo "usage: scripts/fuzz.sh MINUTES | scripts/fuzz.sh --smoke SECONDS" >&2; exit 2; }
mode=long
if [[ ${1:-} == --smoke ]]; then mode=smoke; shift; fi
[[ $# -eq 1 && $1 =~ ^[0-9]+$ && $1 -ge 1 ]] || usage
if [[ $mode == long ]]; then
  seconds_per_target=$(( $1 * 60 / ${#targets[@]} ))
  (( seconds_per_target >= 1 )) || seconds_per_target=1
else
  seconds_per_target=$1
fi
seed="${CPKV_FUZZ_SEED:-$(( $(date +%s) % 1000000007 ))}"

# --- Build: a separate clang project (the main build is g++). The smoke build is -O0: it builds in
# half the time, which matters more than speed over a few seconds of fuzzing.
build="${CPKV_FUZZ_BUILD_DIR:-$root/build-fuzz}"
opt=-O1
[[ $mode == smoke ]] && opt=-O0
opt="${CPKV_FUZZ_OPT:-$opt}"
command -v clang++ >/dev/null || { echo "cpkv fuzz: clang++ not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2; exit 2; }
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
[[ -f $build/CMakeCache.txt ]] && generator=()  # the generator is fixed at the first configure
cmake -S "$root/fuzz" -B "$build" "${generator[@]}" "${launcher[@]}" -DCMAKE_CXX_COMPILER=clang++ \
  -DCPKV_FUZZ_OPT="$opt" >"$build.configure.log" 2>&1 || { cat "$build.configure.log" >&2; exit 2; }
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" >"$build.build.log" 2>&1 || { tail -40 "$build.build.log" >&2; exit 2; }

# --- Seeds: the samples and the first lines of the Mooncake log (the whole 1.1 MB log is too big
# for one input), plus the hand-written seeds of fuzz/seeds/.
work="$(mktemp -d "${TMPDIR:-/tmp}/cpkv-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do mkdir -p "$work/seeds/$t"; done
cp "$root"/traces/samples/*.jsonl "$work/seeds/trace_file/"
for f in "$root"/traces/samples/*.jsonl; do tail -n +2 "$f" >"$work/seeds/trace_batches/$(basename "$f")"; done
head -n 8 "$root/traces/data/mooncake/synthetic_trace.jsonl" >"$work/seeds/mooncake/synthetic_head.jsonl"
for t in "${targets[@]}"; do
  [[ -d $root/fuzz/seeds/$t ]] && cp "$root/fuzz/seeds/$t"/* "$work/seeds/$t/" 2>/dev/null || true
done

# --- Run. -max_len 16384: the seeds are at most 5 KB; room to grow without slow inputs.
run_target() {
  local t=$1 corpus=$2 artifacts=$3 log=$4
  mkdir -p "$corpus" "$artifacts"
  local dict=()
  [[ -f $root/fuzz/$t.dict ]] && dict=(-dict="$root/fuzz/$t.dict")
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    "$build/${t}_fuzz" "$corpus" "$work/seeds/$t" "${dict[@]}" -seed="$seed" -max_total_time="$seconds_per_target" \
    -max_len=16384 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1
}

echo "cpkv fuzz: seed $seed, $seconds_per_target s per target ($mode, $opt)"
declare -A status pids
if [[ $mode == smoke ]]; then
  for t in "${targets[@]}"; do
    run_target "$t" "$work/corpus/$t" "$work/artifacts/$t" "$work/$t.log" & pids[$t]=$!
  done
  for t in "${targets[@]}"; do if wait "${pids[$t]}"; then status[$t]=0; else status[$t]=$?; fi; done
  artifacts_root="$work/artifacts"
else
  for t in "${targets[@]}"; do
    if run_target "$t" "$root/fuzz/corpus/$t" "$root/fuzz/artifacts/$t" "$work/$t.log"; then status[$t]=0; else status[$t]=$?; fi
  done
  artifacts_root="$root/fuzz/artifacts"
fi

failed=0
for t in "${targets[@]}"; do
  log="$work/$t.log"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  added=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)
  crashes=$(find "$artifacts_root/$t" -type f 2>/dev/null | wc -l)
  printf 'cpkv fuzz: %-13s executions %s, new inputs %s, crash/leak/timeout artifacts %s, exit %s\n' \
    "$t" "${execs:-?}" "${added:-?}" "$crashes" "${status[$t]}"
  if [[ ${status[$t]} -ne 0 || ($mode == smoke && $crashes -ne 0) ]]; then
    failed=1
    echo "cpkv fuzz: $t FAILED; its log ends:" >&2
    grep -E "ERROR|runtime error|fuzz check failed|Test unit written|SUMMARY|==[0-9]+==" "$log" | head -20 >&2 || true
    tail -5 "$log" >&2
    [[ $mode == smoke ]] && cp -r "$artifacts_root/$t" "$build/smoke-artifacts-$t" 2>/dev/null &&
      echo "cpkv fuzz: artifacts kept in $build/smoke-artifacts-$t" >&2
  fi
done
if [[ $mode == long ]]; then
  echo "cpkv fuzz: corpus in fuzz/corpus/, crash artifacts (if any) in fuzz/artifacts/; reproduce one with build-fuzz/TARGET_fuzz FILE"
fi
exit "$failed"
