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
cmake --build /tmp/b-before -j 6 --target cpkv > /tmp/b-before.build.log 2>&1 &
pid_before=$!
cmake --build /tmp/b-after -j 10 > /tmp/b-after.build.log 2>&1
status_after=$?
wait "$pid_before"
status_before=$?
grep -hE "error|Error" /tmp/b-before.build.log /tmp/b-after.build.log | head -40 > "$OUT/build-errors.log"
echo "builds: before exit $status_before, after exit $status_after, $(( $(date +%s) - start )) s"
[[ $status_before == 0 && $status_after == 0 ]] || { cat "$OUT/build-errors.log"; exit 1; }
elapsed() { echo $(( $(date +%s) - start )); }
# The bench at cp 1, interleaved: before, after, before, after on one trace, the A/B per variant.
ab() {  # trace
  for i in 1 2; do
    for side in before after; do
      timeout 120 "/tmp/b-$side/cli/cpkv" bench "$before/traces/samples/$1.jsonl" --backend cuda --cp 1 --layers 4 --reps 30 \
        --json "$OUT/json/$side-$1-$i.json" > "$OUT/json/$side-$1-$i.txt" 2>&1
      echo "bench $side $1 $i: exit $? ($(elapsed) s)"
    done
  done
  python3 "$after/bench/bench_ab.py" --a "$OUT"/json/before-$1-*.json --b "$OUT"/json/after-$1-*.json --label-a before --label-b after \
    | tee -a "$OUT/bench-ab.md"
  echo | tee -a "$OUT/bench-ab.md"
}
ab seeds_batch
# The after build's gpu suite and the GPU planted bugs, then the second trace where time is left
# (the device call's limit is 600 s; each part is bounded).
(cd /tmp/b-after && timeout 240 ctest -L gpu --output-on-failure --timeout 200 -j 1) > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests (after): exit $? ($(elapsed) s)"
grep -E "tests passed|Failed|\*\*\*|Not Run|Total Test" "$OUT/gpu-tests.log" | tail -30
timeout 20 /tmp/b-after/cli/cpkv replay "$before/traces/samples/tiny.jsonl" --backend cuda --exchange inprocess; echo "--exchange inprocess (after): exit $?"
if (( $(elapsed) < 380 )); then
  timeout 100 /tmp/b-after/cli/cpkv mutants --backend cuda > "$OUT/gpu-mutants.txt" 2>&1
  echo "mutants --backend cuda (after): exit $? ($(elapsed) s)"; tail -20 "$OUT/gpu-mutants.txt"
fi
(( $(elapsed) < 420 )) && ab mooncake_slice
tar -czf "$OUT/bench-json.tgz" -C "$OUT" json && rm -rf "$OUT/json"
echo "== done in $(( $(date +%s) - start )) s"
