#!/usr/bin/env bash
# Issue 36 deliverable 1 on one GPU: the tree the device tool sends (the lead's main, "before") and
# this branch shipped beside it as an ignored folder ("after", $AFTER, default build-house-loop/src).
# Modes (one device call each; each fits the 600 s limit):
#   ab     both trees built; `cpkv bench` at cp 1 in (before, after) pairs, interleaved, three pairs on
#          each of two bundled traces; bench/bench_ab.py per variant on compose per layer, the key
#          both write (before: the in-process compose; after: the built-in plugin's
#          CPKV_PART_COMPOSE), and on 'with fill'; then `cpkv mutants --backend cuda` (after).
#   tests  the after tree built; its gpu suite (ctest -L gpu, the torch conformance test left out:
#          not this change's) and the refusal of --exchange inprocess.
# Everything lands under $OUT (at most 8 files: the bench JSONs are one tarball).
# Usage, from the root of the tree the device tool sends (carry .deps and build-house-loop):
#   bash build-house-loop/src/scripts/house-loop-visit.sh ab|tests
set -uo pipefail
mode="${1:-ab}"
before="$(pwd)"
after="$before/${AFTER:-build-house-loop/src}"
OUT="${OUT:-$before/out}"
mkdir -p "$OUT/json"
exec > >(tee -a "$OUT/visit.log") 2>&1
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
echo "== $(date -u +%FT%TZ) house-loop visit ($mode): before $before, after $after"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv || true
export NCCL_NVLS_ENABLE=0
if ! ls /usr/lib/x86_64-linux-gnu/cmake/rapidcheck >/dev/null 2>&1; then
  mkdir -p /tmp/rc && for deb in "$before"/.deps/librapidcheck-dev_*.deb; do dpkg -x "$deb" /tmp/rc; done
  export CMAKE_PREFIX_PATH="/tmp/rc/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
fi
py_args=()
if python3 -c "import torch, pybind11" >/dev/null 2>&1; then
  py_args=(-DPython3_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)")
fi
configure() {  # source, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 "${py_args[@]}" > "$2.configure.log" 2>&1 \
    || { tail -30 "$2.configure.log"; return 1; }
}
configure "$after" /tmp/b-after || exit 1
if [[ "$mode" == ab ]]; then
  configure "$before" /tmp/b-before || exit 1
  # Both CLIs at once, part of the cores each (-k 0: every error is seen).
  cmake --build /tmp/b-before -j 8 --target cpkv > /tmp/b-before.build.log 2>&1 &
  pid_before=$!
  cmake --build /tmp/b-after -j 8 --target cpkv -- -k 0 > /tmp/b-after.build.log 2>&1
  status_after=$?
  wait "$pid_before"
  echo "builds: before exit $?, after exit $status_after, $(elapsed) s"
else
  cmake --build /tmp/b-after -j 16 -- -k 0 > /tmp/b-after.build.log 2>&1
  echo "build (after, every target): exit $?, $(elapsed) s"
fi
grep -hE "error|FAILED" /tmp/b-*.build.log | head -60 > "$OUT/build-errors.log"
[[ -s "$OUT/build-errors.log" ]] && cat "$OUT/build-errors.log"
[[ -x /tmp/b-after/cli/cpkv ]] || exit 1
if [[ "$mode" == tests ]]; then
  timeout 20 /tmp/b-after/cli/cpkv replay "$before/traces/samples/tiny.jsonl" --backend cuda --exchange inprocess
  echo "--exchange inprocess (after): exit $? (2 expected, one line)"
  (cd /tmp/b-after && timeout $(( 560 - $(elapsed) )) ctest -L gpu -E conformance_gpu --output-on-failure --timeout 200 -j 1) > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests (after): exit $? ($(elapsed) s)"
  grep -E "tests passed|Failed|\*\*\*|Not Run|Total Test|Test +#" "$OUT/gpu-tests.log" | tail -60
  echo "== done in $(elapsed) s"
  exit 0
fi
[[ -x /tmp/b-before/cli/cpkv ]] || exit 1
pair() {  # trace, run
  for side in before after; do
    timeout 100 "/tmp/b-$side/cli/cpkv" bench "$before/traces/samples/$1.jsonl" --backend cuda --cp 1 --layers 4 --reps 30 \
      --json "$OUT/json/$side-$1-$2.json" > "$OUT/json/$side-$1-$2.txt" 2>&1
    echo "bench $side $1 $2: exit $? ($(elapsed) s)"
  done
}
compare() {  # trace, key
  python3 "$after/bench/bench_ab.py" --a "$OUT"/json/before-$1-*.json --b "$OUT"/json/after-$1-*.json --label-a before --label-b after --key "$2" \
    | tee -a "$OUT/bench-ab.md"
  echo | tee -a "$OUT/bench-ab.md"
}
for i in 1 2 3; do
  for trace in seeds_batch mooncake_slice; do (( $(elapsed) < 480 )) && pair "$trace" "$i"; done
done
for trace in seeds_batch mooncake_slice; do
  compare "$trace" compose_us_per_layer_median
  compare "$trace" with_fill_us_per_layer_median
done
tar -czf "$OUT/bench-json.tgz" -C "$OUT" json && rm -rf "$OUT/json"
if (( $(elapsed) < 500 )); then
  timeout 80 /tmp/b-after/cli/cpkv mutants --backend cuda > "$OUT/gpu-mutants.txt" 2>&1
  echo "mutants --backend cuda (after): exit $? ($(elapsed) s)"; tail -20 "$OUT/gpu-mutants.txt"
fi
echo "== done in $(elapsed) s"
