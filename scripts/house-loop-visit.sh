#!/usr/bin/env bash
# Issue 36 deliverable 1 on one GPU, in one device call: the tree the device tool sends (the lead's
# main, "before") and this branch shipped beside it as an ignored folder ("after", $AFTER, default
# build-house-loop/src) are both built; the bench at cp 1 runs interleaved before/after on two
# bundled traces (bench/bench_ab.py compares compose per layer, the key both write: before the
# in-process compose, after the built-in plugin's CPKV_PART_COMPOSE); then the after build's gpu
# tests (ctest -L gpu) and `cpkv mutants --backend cuda`. Everything lands under $OUT (at most 8
# files: the bench JSONs are one tarball).
# Usage, from the root of the tree the device tool sends (carry .deps and build-house-loop):
#   bash build-house-loop/src/scripts/house-loop-visit.sh
set -uo pipefail
before="$(pwd)"
after="$before/${AFTER:-build-house-loop/src}"
OUT="${OUT:-$before/out}"
mkdir -p "$OUT/json"
exec > >(tee -a "$OUT/visit.log") 2>&1
start=$(date +%s)
echo "== $(date -u +%FT%TZ) house-loop visit: before $before, after $after"
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
configure "$before" /tmp/b-before || exit 1
configure "$after" /tmp/b-after || exit 1
# Both builds at once, half the cores each: before needs the CLI only, after everything (the gpu tests).
# -k 0: every error is seen, and what built runs (the bench needs the two CLIs only).
cmake --build /tmp/b-before -j 6 --target cpkv > /tmp/b-before.build.log 2>&1 &
pid_before=$!
cmake --build /tmp/b-after -j 10 -- -k 0 > /tmp/b-after.build.log 2>&1
status_after=$?
wait "$pid_before"
status_before=$?
grep -hE "error|Error|FAILED" /tmp/b-before.build.log /tmp/b-after.build.log | head -60 > "$OUT/build-errors.log"
echo "builds: before exit $status_before, after exit $status_after, $(( $(date +%s) - start )) s"
[[ $status_after == 0 ]] || cat "$OUT/build-errors.log"
[[ -x /tmp/b-before/cli/cpkv && -x /tmp/b-after/cli/cpkv ]] || { cat "$OUT/build-errors.log"; exit 1; }
elapsed() { echo $(( $(date +%s) - start )); }
# The bench at cp 1, interleaved (before, after) pairs on one trace; the A/B per variant.
pair() {  # trace, run
  for side in before after; do
    timeout 100 "/tmp/b-$side/cli/cpkv" bench "$before/traces/samples/$1.jsonl" --backend cuda --cp 1 --layers 4 --reps 30 \
      --json "$OUT/json/$side-$1-$2.json" > "$OUT/json/$side-$1-$2.txt" 2>&1
    echo "bench $side $1 $2: exit $? ($(elapsed) s)"
  done
}
compare() {  # trace
  python3 "$after/bench/bench_ab.py" --a "$OUT"/json/before-$1-*.json --b "$OUT"/json/after-$1-*.json --label-a before --label-b after \
    | tee -a "$OUT/bench-ab.md"
  echo | tee -a "$OUT/bench-ab.md"
}
pair seeds_batch 1
# The after build's gpu suite (the torch conformance harness's test left out: not this change's),
# then the rest where time is left (the device call's limit; each part is bounded).
(cd /tmp/b-after && timeout 170 ctest -L gpu -E conformance_gpu --output-on-failure --timeout 150 -j 1) > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests (after): exit $? ($(elapsed) s)"
grep -E "tests passed|Failed|\*\*\*|Not Run|Total Test|Test +#" "$OUT/gpu-tests.log" | tail -40
timeout 20 /tmp/b-after/cli/cpkv replay "$before/traces/samples/tiny.jsonl" --backend cuda --exchange inprocess; echo "--exchange inprocess (after): exit $?"
(( $(elapsed) < 330 )) && pair seeds_batch 2
compare seeds_batch
if (( $(elapsed) < 350 )); then pair mooncake_slice 1; compare mooncake_slice; fi
if (( $(elapsed) < 400 )); then
  timeout 60 /tmp/b-after/cli/cpkv mutants --backend cuda > "$OUT/gpu-mutants.txt" 2>&1
  echo "mutants --backend cuda (after): exit $? ($(elapsed) s)"; tail -20 "$OUT/gpu-mutants.txt"
fi
tar -czf "$OUT/bench-json.tgz" -C "$OUT" json && rm -rf "$OUT/json"
echo "== done in $(( $(date +%s) - start )) s"
