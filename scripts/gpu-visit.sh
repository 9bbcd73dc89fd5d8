#!/usr/bin/env bash
# One visit to the GPU machine (the `device` tool): build there, run the gpu-labelled tests, replay
# the bundled traces on the GPUs, and run the benchmarks; everything it reports lands under $OUT.
# Usage (device tool, carry .deps): scripts/gpu-visit.sh [tests|bench|all|check|verify|foreign|conformance|conformance2|plugin|fused|ab21|vmm|bench-plugin|abi24|abi24b|abi24c|tl26|unverified|verify26|verify26b|verify26c|perf|lean|quick|probe|benches|guards]
# (round, then round2 on the same machine: every gpu test and the GPU mutants; the closing-wait test against its patch,
#  the conformance harness's --time and overhead on CUDA, the bench at cp 1)
# (final: the plugin tests, mutants --exchange with the plain plugin, the built-in under --swarm, the GPU mutants)
# (fused: issue 24 item 2, cpkv's own fused compose as a plugin: its tests, every variant on every trace through
#  --exchange builtin and the .so, the GPU mutants through CPKV_EXCHANGE=builtin, memcheck over the .so)
# (plugin: issue 24's exchange plugin ABI: the plain example plugin, the harness's planted bugs, memcheck, then the gpu tests)
# (bench-plugin: `cpkv bench --exchange` with the plain plugin at cp 1 beside the built-in bench of the same visit, the A/B
#  per layer (bench/bench_ab.py --key-b), cp 2 time-sliced for the path's bytes only, and its gpu test; only its targets built)
# (quick: the gpu tests, the GPU mutants and the two benchmarks, the sweep printed; AB_ENV='VAR=VALUE' runs
#  the gpu tests and both benchmarks again under that environment)
# (benches: the seeds and Mooncake benchmarks alone, after a change to the bench's host code)
# (probe: the gather probe alone, bench/gather_probe.cu, built with nvcc, no project build)
# (perf: a functional smoke replay, the gpu tests, `cpkv mutants --backend cuda`, then the benchmark
#  of every bundled trace at cp 2: the whole performance visit in one call)
# (verify: the gpu tests and `cpkv mutants --backend cuda`)
# (foreign: verify and the conformance harness on CUDA ranks; conformance: the harness part alone)
# (conformance2: the harness's gpu test and CLI for the capture probe, its controls and --time's figures (link limit;
#  the built-in figure at cp 1, one rank per GPU); the Python extension built first, the CLI beside the tests)
# (check: the gpu tests and the seeds batch benchmark only, for a short visit)
# (abi24: issue 24's A/B, cpkv's own exchange in-process against the same code behind the ABI, cp 1)
# (ab21: issue 21's A/B, the bench at cp 1 of the tree against a6aacb7 shipped as ab-old/)
# (abi24b: issue 24 with the built-in plugin as the default: every gpu test, the GPU mutants through it and in process,
#  then the default bench at cp 1, which times cpkv's exchange in process and through the ABI in one run, twice per trace)
# (abi24c: the second, shorter visit: the bench-plugin and GPU timeline tests, the in-run ABI A/B, the GPU mutants both ways,
#  memcheck over the fused .so's produce_rows path)
# (tl26: the GPU timeline's bench case alone, with and without --timeline and --exchange inprocess, every output shown)
# (unverified: what session 2026-12-02c wrote after its device time was spent: the tl26 cases, the GPU timeline test, the
#  counters test, the closing-wait test and the bench-plugin tests both ways, the default bench at cp 1 once)
# (verify26: the mends of session 2026-12-03 (the plugin run's timeline, the counters test, the oversubscribed GPU
#  mutants on one GPU, the pool plan), the sparse pool's tests, then the closing-wait test on the tree, with the kernel's
#  closing wait shortened (docs/patches/closing-wait-skips-last-peer.patch: must fail both ways) and with that and the
#  plugin host dropping the slow reader (docs/patches/plugin-host-drops-reader-spin.patch: what the spin adds through the ABI))
# (verify26b: the GPU planted bugs oversubscribed on one GPU once a rank's own error text is in the report, and the barrier tests)
# (verify26c: after the review mends (the pool plan holds the memory kind and reservation): the sparse pool's tests, the
#  GPU mutants oversubscribed, the counters test, the fused plugin's mutants)
# (vmm: the production pool at cp 2 and 4 on one GPU, dense before / sparse after, and the sparse pool's tests)
# (guards: issue 35 items 1, 2, 4: the plugin host's guard regions, pool page hashes, counters beside the model's and named
#  device faults: the misbehaving plugins' tests and replays, then every gpu test (the dense layout's guards touch them all))
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
what="${1:-all}"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
log="$OUT/visit.log"
exec > >(tee -a "$log") 2>&1
echo "== $(date -u +%FT%TZ) gpu visit: $what"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv || true
nvidia-smi topo -m || true
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
if [[ "$what" == probe ]]; then
  # The gather probe alone (bench/gather_probe.cu, one file, no project build): --quick holds the
  # knobs the first full run found to make no difference (PROBE_ARGS= for the full sweep).
  /usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -std=c++17 -o /tmp/gather_probe "$root/bench/gather_probe.cu" || exit 1
  timeout 300 /tmp/gather_probe ${PROBE_ARGS---quick} > "$OUT/gather-probe.csv" 2> "$OUT/gather-probe.txt"
  status=$?
  echo "gather probe: exit $status"; cat "$OUT/gather-probe.txt"
  echo "== done in $(( $(date +%s) - start )) s"
  exit $status
fi
# RapidCheck is not in the GPU image: unpack the carried Debian package.
if ! ls /usr/lib/x86_64-linux-gnu/cmake/rapidcheck >/dev/null 2>&1; then
  mkdir -p /tmp/rc && for deb in "$root"/.deps/librapidcheck-dev_*.deb; do dpkg -x "$deb" /tmp/rc; done
  export CMAKE_PREFIX_PATH="/tmp/rc/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
fi
build="$root/build-gpu"
# The Python package (and the conformance harness) against the machine's own python3 with PyTorch,
# where it has one (Debian's /usr/bin/python3 there has no pybind11 and no torch).
py_args=()
if python3 -c "import torch, pybind11" >/dev/null 2>&1; then
  py_args=(-DPython3_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)")
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 "${py_args[@]}" > "$OUT/configure.log" 2>&1 \
  || { tail -40 "$OUT/configure.log"; exit 1; }
grep "cpkv:" "$OUT/configure.log"
# conformance2 needs only the Python extension first; the CLI (--time's built-in figure) builds beside its tests;
# bench-plugin builds only its own targets.
targets=()
[[ "$what" == conformance2 ]] && targets=(--target cpkv_python)
[[ "$what" == abi24 ]] && targets=(--target cpkv cpkv_python cpkv.tests.gpu_vmm)
[[ "$what" == tl26 ]] && targets=(--target cpkv)
[[ "$what" == abi24c ]] && targets=(--target cpkv cpkv_exchange_plain cpkv_exchange_fused cpkv_stub_exchange_ok cpkv.tests.gpu_bench_plugin cpkv.tests.gpu_plugin)
[[ "$what" == guards ]] && targets=(--target cpkv cpkv_exchange_plain cpkv_exchange_fused cpkv_stub_exchange_ok cpkv.tests.gpu_guard cpkv.tests.gpu_counters
                                   cpkv.tests.gpu_plugin cpkv.tests.gpu cpkv.tests.gpu_vmm cpkv.tests.gpu_bench_plugin)
[[ "$what" == bench-plugin ]] && targets=(--target cpkv cpkv_exchange_plain cpkv_stub_exchange_ok cpkv.tests.gpu_bench_plugin)
cmake --build "$build" -j "$(nproc)" "${targets[@]}" > "$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
cpkv="$build/cli/cpkv"
if [[ "$what" == foreign ]]; then
  # Issue 23's CUDA path and the house on one GPU: the gpu tests (the conformance harness's CUDA
  # test among them) and the GPU planted bugs; the harness's CLI on CUDA ranks follows.
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 300 -j 1) > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|passed|failed" "$OUT/gpu-tests.log" | tail -30
  timeout 240 "$cpkv" mutants --backend cuda > "$OUT/gpu-mutants.txt" 2>&1
  echo "mutants --backend cuda: exit $?"; cat "$OUT/gpu-mutants.txt"
fi
if [[ "$what" == foreign || "$what" == conformance ]]; then
  # (conformance: this part alone) the harness's CUDA test, then its CLI on CUDA ranks.
  if [[ "$what" == conformance ]]; then
    (cd "$build" && ctest -R cpkv.python.conformance_gpu --output-on-failure --timeout 300) > "$OUT/gpu-tests.log" 2>&1
    echo "conformance gpu test: exit $?"; grep -E "passed|failed|skipped|Error" "$OUT/gpu-tests.log" | tail -20
  fi
  export PYTHONPATH="$build/python"
  for args in "--impl cpkv.conformance.reference:StagingDirect" "--impl cpkv.conformance.reference:V2" \
              "--impl cpkv.conformance.reference:StagingDirect --mutant single_half" "--impl cpkv.conformance.reference:StagingDirect --swarm --seed 4"; do
    timeout 180 python3 -m cpkv.conformance "$root/traces/samples/tiny.jsonl" $args --ranks 2 --device cuda --window 10 >> "$OUT/conformance-cuda.txt" 2>&1
    echo "conformance cuda $args: exit $?" | tee -a "$OUT/conformance-cuda.txt"
  done
  tail -40 "$OUT/conformance-cuda.txt"
fi
if [[ "$what" == conformance2 ]]; then
  # Issue 23's capture probe in hook-free ranks with its controls, and --time's link limit and
  # built-in figure: the harness's gpu test, then the CLI on the controls (cp 1) and the references.
  nice cmake --build "$build" -j "$(nproc)" --target cpkv > "$OUT/build-cli.log" 2>&1 &
  cli_build=$!
  (cd "$build" && ctest -R cpkv.python.conformance_gpu --output-on-failure --timeout 200) > "$OUT/gpu-tests.log" 2>&1
  echo "conformance gpu test: exit $?"; grep -E "passed|failed|skipped|Error|assert" "$OUT/gpu-tests.log" | tail -20
  export PYTHONPATH="$build/python"
  sed 's/"cp":2/"cp":1/' "$root/traces/samples/tiny.jsonl" > "$OUT/tiny-cp1.jsonl"
  c2() { echo "== $*" >> "$OUT/conformance2.txt"; timeout 120 python3 -m cpkv.conformance "$@" --device cuda --window 10 >> "$OUT/conformance2.txt" 2>&1
         echo "conformance2 $*: exit $?" | tee -a "$OUT/conformance2.txt"; }
  c2 "$OUT/tiny-cp1.jsonl" --impl cpkv.conformance.controls:PrecomputedGather --ranks 1
  c2 "$OUT/tiny-cp1.jsonl" --impl cpkv.conformance.controls:SyncEachLayer --ranks 1
  c2 "$root/traces/samples/tiny.jsonl" --impl cpkv.conformance.reference:StagingDirect --ranks 2
  c2 "$root/traces/samples/tiny.jsonl" --impl cpkv.conformance.reference:StagingDirect --ranks 2 --time --json "$OUT/conformance2-time.json"
  wait "$cli_build"; echo "cli build (for the built-in figure): exit $?"
  c2 "$OUT/tiny-cp1.jsonl" --impl cpkv.conformance.controls:PrecomputedGather --ranks 1 --time
  c2 "$OUT/tiny-cp1.jsonl" --impl cpkv.conformance.reference:StagingDirect --ranks 1 --time
  grep -E "^==|graph|capturable|link limit|built-in|not of record|compose per layer|conformance2 .*exit" "$OUT/conformance2.txt"
fi
if [[ "$what" == guards ]]; then
  (cd "$build" && ctest -R 'GpuCounters|GpuGuard' --output-on-failure --timeout 300 -j 1) > "$OUT/guards-tests.log" 2>&1
  echo "guard tests: exit $?"; grep -E "Test +#|tests passed|Failure|Expected|Which is|exited with" "$OUT/guards-tests.log" | cut -c1-600 | tail -40
  # Each misbehaving plugin as a user sees it (tests/plugins/misbehaving_exchange.cu), and the fault under memcheck's eyes.
  for m in none past_dense pool counters fault; do
    timeout 120 "$cpkv" replay "$root/traces/samples/tiny.jsonl" --backend cuda --exchange "$build/tests/libcpkv_misbehaving_$m.so" \
      --variant staging_direct --layers 2 > "$OUT/guards-one.txt" 2>&1
    echo "replay misbehaving $m: exit $?" | tee -a "$OUT/guards-replays.txt"; cat "$OUT/guards-one.txt" >> "$OUT/guards-replays.txt"
    grep -E "wrote outside|counters|device fault|pass|FAIL|cpkv:" "$OUT/guards-one.txt" | cut -c1-500 | head -8
  done
  rm -f "$OUT/guards-one.txt"  # (only so many files come back from a visit)
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 300 -j 1) > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "Test +#|tests passed|Failure|Expected|Which is|exited with" "$OUT/gpu-tests.log" | cut -c1-400 | tail -40
fi
if [[ "$what" == verify ]]; then
  # The gpu tests (planted GPU bugs and the verify self-test among them), then the GPU mutation run.
  # VERIFY_JOBS: gpu tests run side by side on the one GPU (they are oversubscribed correctness runs,
  # never timed), bounded as a whole by VERIFY_S so the visit leaves its answer within one call.
  (cd "$build" && timeout "${VERIFY_S:-400}" ctest -L gpu --output-on-failure --timeout 300 -j "${VERIFY_JOBS:-1}") > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed" "$OUT/gpu-tests.log" | tail -30
  timeout 240 "$cpkv" mutants --backend cuda > "$OUT/gpu-mutants.txt" 2>&1
  echo "mutants --backend cuda: exit $?"; cat "$OUT/gpu-mutants.txt"
fi
if [[ "$what" == lean ]]; then
  # The benchmarks and the stopped-rank case only, for a visit with little device time left.
  for name in seeds_batch mooncake_slice; do
    timeout 150 "$cpkv" bench "$root/traces/samples/$name.jsonl" --backend cuda --cp 2 --layers 4 --reps 40 \
      --json "$OUT/bench-$name-cp2.json" --markdown "$OUT/bench-$name-cp2.md" | grep -E "^\| 0 \| (v2|staging_direct) |^Ceilings"
    echo "bench $name: exit $?"
  done
  OUT=/tmp/rel CASES="${REL_CASES:-seeds-stop-rank-10s}" timeout 150 "$root/scripts/gpu-reliability.sh" "$build" > /tmp/rel-run.log 2>&1
  echo "gpu-reliability: exit $?"; grep -E "^\| (case|seeds|cp2)" /tmp/rel/gpu-reliability.md
  grep -h "made no progress" /tmp/rel/rel-*.out /tmp/rel/rel-*.err 2>/dev/null | head -2 | cut -c1-400
fi
if [[ "$what" == perf ]]; then
  timeout 90 "$cpkv" replay "$root/traces/samples/tiny.jsonl" --backend cuda --layers 4 --stuck-ms-max 20000
  echo "smoke replay tiny: exit $?"
  timeout 120 "$cpkv" replay "$root/traces/samples/seeds_batch.jsonl" --backend cuda --layers 4 --stuck-ms-max 30000
  echo "smoke replay seeds cp 8 on 2 GPUs: exit $?"
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 200 -j 1) > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|\*\*\*" "$OUT/gpu-tests.log" | tail -30
  timeout 150 "$cpkv" mutants --backend cuda > "$OUT/gpu-mutants.txt" 2>&1
  echo "mutants --backend cuda: exit $?"; tail -20 "$OUT/gpu-mutants.txt"
  for name in seeds_batch mooncake_slice; do
    timeout 150 "$cpkv" bench "$root/traces/samples/$name.jsonl" --backend cuda --cp 2 --layers 4 --reps 60 \
      --json "$OUT/bench-$name-cp2.json" --markdown "$OUT/bench-$name-cp2.md"
    echo "bench $name: exit $?"
  done
  # The bulk-copy (TMA) gather beside the others in the ceilings' sweep (opt-in: an experiment).
  CPKV_BENCH_BULK=1 timeout 120 "$cpkv" bench "$root/traces/samples/seeds_batch.jsonl" --backend cuda --cp 2 --layers 4 --reps 10 \
    --variant staging_direct --json "$OUT/bench-bulk-sweep.json" | sed -n '/Scattered/,$p'
  echo "bench bulk sweep: exit $?"
  # The stopped-rank case of the reliability issue (cp 8 on 2 GPUs), stop to report.
  # (its raw files stay on the machine: only so many files come back from a visit)
  OUT=/tmp/rel CASES="${REL_CASES:-seeds-stop-rank-10s}" timeout 150 "$root/scripts/gpu-reliability.sh" "$build" > /tmp/rel-run.log 2>&1
  echo "gpu-reliability (${REL_CASES:-seeds-stop-rank-10s}): exit $?"; grep -E "^\| (case|seeds|cp2)" /tmp/rel/gpu-reliability.md
  grep -h "made no progress\|stopped" /tmp/rel/rel-*.out /tmp/rel/rel-*.err 2>/dev/null | head -3 | cut -c1-400
  cp /tmp/rel/gpu-reliability.md "$OUT/" 2>/dev/null
fi
# The seeds batch and the Mooncake slice at cp 2 under the environment VAR=VALUE... given after
# SUFFIX and ROWS (files bench-NAME-cp2SUFFIX.*), printing the table rows that match ROWS.
bench_pair() {
  local suffix="$1" rows="$2"
  shift 2
  for name in seeds_batch mooncake_slice; do
    env "$@" timeout 200 "$cpkv" bench "$root/traces/samples/$name.jsonl" --backend cuda --cp 2 --layers 4 --reps 60 \
      --json "$OUT/bench-$name-cp2$suffix.json" --markdown "$OUT/bench-$name-cp2$suffix.md" > "/tmp/bench-$name$suffix.txt" 2>&1
    echo "bench $name${*:+ under $*}: exit $?"
    grep -E "$rows" "/tmp/bench-$name$suffix.txt"
  done
}
if [[ "$what" == benches ]]; then
  # The two benchmarks alone (no tests): for a visit after a change to the bench's host code only.
  bench_pair "" "^\| [0-9] \| |^Ceilings"
fi
if [[ "$what" == quick ]]; then
  # The gpu tests and the GPU mutants (the bytes), then the two benchmarks with the gather sweep.
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 300 -j 1) > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "tests passed|Failed|\*\*\*" "$OUT/gpu-tests.log" | tail -8
  timeout 200 "$cpkv" mutants --backend cuda > "$OUT/gpu-mutants.txt" 2>&1
  echo "mutants --backend cuda: exit $?"; tail -4 "$OUT/gpu-mutants.txt"
  bench_pair "" "^\| [0-9] \| (v2|staging_direct|staging_publish) |^Ceilings"
  sed -n '/Scattered/,$p' /tmp/bench-seeds_batch.txt
  if [[ -n "${AB_ENV:-}" ]]; then  # the gpu tests and both benchmarks again under AB_ENV (VAR=VALUE ...), for an A/B
    (cd "$build" && env $AB_ENV ctest -L gpu --output-on-failure --timeout 300 -j 1) > "$OUT/gpu-tests-ab.log" 2>&1
    echo "gpu tests under $AB_ENV: exit $?"; grep -E "tests passed|Failed|\*\*\*" "$OUT/gpu-tests-ab.log" | tail -8
    # shellcheck disable=SC2086  # AB_ENV is a list of VAR=VALUE words
    bench_pair -ab "^\| [0-9] \| (v2|symm_dense|staging_direct|staging_publish) " $AB_ENV
    sed -n '/Scattered/,$p' /tmp/bench-seeds_batch-ab.txt
  fi
fi
if [[ "$what" == check ]]; then
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 600 -j 1) > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; tail -25 "$OUT/gpu-tests.log"
  timeout 200 "$cpkv" bench "$root/traces/samples/seeds_batch.jsonl" --backend cuda --cp 2 --layers 4 --reps 60 \
    --json "$OUT/bench-seeds_batch-cp2.json" --markdown "$OUT/bench-seeds_batch-cp2.md"
  echo "bench seeds_batch: exit $?"
fi
if [[ "$what" == round ]]; then
  # This round's GPU checks after the merges: every gpu test (cpkv's own exchange, the plugin's, the
  # conformance harness's syncs, capture and --time, the closing-wait test of issue 25 item 10) and
  # the GPU mutants. `round2` follows on the same machine.
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 300 -j 1) > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|Not Run" "$OUT/gpu-tests.log" | tail -30
  timeout 240 "$cpkv" mutants --backend cuda > "$OUT/gpu-mutants.txt" 2>&1
  echo "mutants --backend cuda: exit $?"; tail -14 "$OUT/gpu-mutants.txt"
fi
if [[ "$what" == final ]]; then
  # The last changes of the round: the plugin's gpu tests, `cpkv mutants --backend cuda --exchange`
  # with the plain plugin, cpkv's own exchange under --swarm's slow rank, and the GPU mutants.
  (cd "$build" && ctest -R "GpuPlugin|GpuFusedPlugin" --output-on-failure --timeout 300 -j 1) > "$OUT/gpu-plugin-tests.log" 2>&1
  echo "gpu plugin tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|Not Run" "$OUT/gpu-plugin-tests.log" | tail -6
  timeout 240 "$cpkv" mutants --backend cuda --exchange "$build/examples/libcpkv_exchange_plain.so" > "$OUT/gpu-mutants-plain.txt" 2>&1
  echo "mutants --backend cuda --exchange plain: exit $?"; cat "$OUT/gpu-mutants-plain.txt"
  timeout 240 "$cpkv" replay "$root/traces/samples/seeds_batch.jsonl" --backend cuda --layers 3 --swarm --seed 3 > "$OUT/builtin-swarm.txt" 2>&1
  echo "cpkv's own exchange, every variant, --swarm --seed 3: exit $?"; tail -10 "$OUT/builtin-swarm.txt"
  timeout 240 "$cpkv" mutants --backend cuda > "$OUT/gpu-mutants.txt" 2>&1
  echo "mutants --backend cuda: exit $?"; tail -5 "$OUT/gpu-mutants.txt"
fi
if [[ "$what" == round2 ]]; then
  # The closing-wait test against the shortened wait (docs/patches/closing-wait-skips-last-peer.patch):
  # it must pass on the tree and fail with the patch. Then the conformance harness's --time on CUDA,
  # its overhead benchmark, and the bench at cp 1 (one GPU: its markdown from the timing table).
  T=GpuBarrier.TheLaunchWaitsForAnIdleSlowReaderItReadsNothingFrom
  timeout 200 "$build/tests/cpkv.tests.gpu" --gtest_filter=$T > "$OUT/closing-wait-tree.txt" 2>&1
  echo "closing-wait test on the tree: exit $?"; tail -4 "$OUT/closing-wait-tree.txt"
  (cd "$root" && patch -p1 < docs/patches/closing-wait-skips-last-peer.patch) && cmake --build "$build" -j "$(nproc)" --target cpkv.tests.gpu > "$OUT/patched-build.log" 2>&1
  timeout 200 "$build/tests/cpkv.tests.gpu" --gtest_filter=$T > "$OUT/closing-wait-patched.txt" 2>&1
  echo "closing-wait test with the last peer skipped: exit $? (must fail)"; grep -E "Failure|FAILED|cp [0-9]" "$OUT/closing-wait-patched.txt" | head -8
  (cd "$root" && patch -R -p1 < docs/patches/closing-wait-skips-last-peer.patch) && cmake --build "$build" -j "$(nproc)" --target cpkv.tests.gpu > /dev/null 2>&1
  export PYTHONPATH="$build/python"
  timeout 120 python3 -m cpkv.conformance "$root/traces/samples/tiny.jsonl" --impl cpkv.conformance.reference:StagingDirect --ranks 2 --device cuda --window 10 \
    > "$OUT/conformance-cuda-checked.txt" 2>&1; echo "conformance cuda (checked): exit $?"; tail -12 "$OUT/conformance-cuda-checked.txt"
  timeout 120 python3 -m cpkv.conformance "$root/traces/samples/tiny.jsonl" --impl cpkv.conformance.reference:StagingDirect --ranks 2 --device cuda --window 10 --time \
    > "$OUT/conformance-cuda-time.txt" 2>&1; echo "conformance cuda --time: exit $?"; tail -8 "$OUT/conformance-cuda-time.txt"
  timeout 180 python3 "$root/bench/conformance_overhead.py" --device cuda --rounds 100 > "$OUT/conformance-overhead-cuda.txt" 2>&1
  echo "conformance overhead (cuda, oversubscribed: not a timing of record): exit $?"; tail -6 "$OUT/conformance-overhead-cuda.txt"
  timeout 120 "$cpkv" bench "$root/traces/samples/tiny.jsonl" --backend cuda --cp 1 --layers 2 --reps 5 --json "$OUT/bench-tiny-cp1.json" --markdown "$OUT/bench-tiny-cp1.md" > "$OUT/bench-tiny-cp1.txt" 2>&1
  echo "bench tiny cp 1: exit $?"; cat "$OUT/bench-tiny-cp1.md" 2>/dev/null | head -20
fi
if [[ "$what" == plugin ]]; then
  # Issue 24: the exchange plugin ABI on the GPU. The plugin's gpu test, the plain example on every
  # bundled trace (also oversubscribed cp 8), each planted bug of the harness, a plugin that fails,
  # the plain example under compute-sanitizer memcheck, then every gpu test and the GPU mutants
  # (cpkv's own exchange, unchanged by the ABI's host side).
  plain="$build/examples/libcpkv_exchange_plain.so"
  (cd "$build" && ctest -R "GpuPlugin|GpuFusedPlugin" --output-on-failure --timeout 300 -j 1) > "$OUT/gpu-plugin-tests.log" 2>&1
  echo "gpu plugin tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|Not Run" "$OUT/gpu-plugin-tests.log" | tail -10
  for args in "tiny.jsonl --layers 2" "tiny.jsonl --layers 2 --swarm --seed 5" "seeds_batch.jsonl --layers 3" "mooncake_slice.jsonl --layers 2" \
              "mooncake_slice.jsonl --layers 2 --mutant reused_plan" "mooncake_slice.jsonl --layers 2 --mutant stale_page_inverse" \
              "mooncake_slice.jsonl --layers 2 --mutant unzeroed_rows"; do
    echo "== cpkv replay $args --exchange plain" >> "$OUT/plugin-replays.txt"
    timeout 240 "$cpkv" replay "$root/traces/samples/"$args --backend cuda --exchange "$plain" >> "$OUT/plugin-replays.txt" 2>&1
    echo "plugin replay $args: exit $?" | tee -a "$OUT/plugin-replays.txt"
  done
  timeout 120 "$cpkv" replay "$root/traces/samples/tiny.jsonl" --backend cuda --variant staging_direct --exchange "$build/tests/libcpkv_stub_exchange_ok.so" > "$OUT/plugin-stub.txt" 2>&1
  echo "stub plugin (its setup fails): exit $?"; cat "$OUT/plugin-stub.txt"
  sanitizer=/usr/local/cuda/bin/compute-sanitizer
  timeout 300 "$sanitizer" --tool memcheck --target-processes all --error-exitcode 3 "$cpkv" replay "$root/traces/samples/tiny.jsonl" --backend cuda \
    --exchange "$plain" --layers 2 > "$OUT/plugin-memcheck.txt" 2>&1
  echo "plain plugin under compute-sanitizer memcheck: exit $?"; tail -8 "$OUT/plugin-memcheck.txt"
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 300 -j 1) > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|Not Run" "$OUT/gpu-tests.log" | tail -30
  timeout 240 "$cpkv" mutants --backend cuda > "$OUT/gpu-mutants.txt" 2>&1
  echo "mutants --backend cuda: exit $?"; tail -12 "$OUT/gpu-mutants.txt"
fi
if [[ "$what" == abi24b ]]; then
  # Issue 24, the built-in plugin as the default path (--backend cuda runs cpkv's fused compose
  # through the ABI unless --exchange inprocess): every gpu test, the GPU planted bugs through it and
  # in process, then the ABI's cost per layer at cp 1 (one GPU: no peer link; a timing of record for
  # what the ABI adds per layer, the calls and the context): the default bench times the in-process
  # exchange and, right after each variant, the same kernels through the ABI, both as replayed graphs.
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 400 -j 1) > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|Not Run|Total Test" "$OUT/gpu-tests.log" | tail -40
fi
if [[ "$what" == unverified ]]; then
  (cd "$build" && ctest -R "cpkv.python.timeline_gpu|GpuBackend.TheBuiltInPlugins|GpuBackend.TheInProcess|GpuBarrier|GpuBenchPlugin|GpuMutants" \
    --output-on-failure --timeout 300 -j 1) > "$OUT/unverified-tests.log" 2>&1
  echo "unverified gpu tests: exit $?"; grep -E "Test +#|tests passed|Failure|Expected|assert|Error" "$OUT/unverified-tests.log" | tail -40
fi
if [[ "$what" == verify26c ]]; then
  (cd "$build" && timeout 330 ctest -R "GpuVmm|GpuMutants.EveryGpuPlantedBugIsReportedOversubscribed|GpuBackend.TheBuiltInPlugins|GpuFusedPlugin" \
    --output-on-failure --timeout 200 -j 1) > "$OUT/verify26c-tests.log" 2>&1
  echo "verify26c gpu tests: exit $?"; grep -E "Test +#|tests passed|Failure|Expected|assert|Error|exited with" "$OUT/verify26c-tests.log" | cut -c1-400 | tail -30
fi
if [[ "$what" == verify26b ]]; then
  (cd "$build" && timeout 420 ctest -R "GpuMutants|GpuBarrier|cpkv.python.timeline_gpu" --output-on-failure --timeout 300 -j 1) > "$OUT/verify26b-tests.log" 2>&1
  echo "verify26b gpu tests: exit $?"; grep -E "Test +#|tests passed|Failure|Expected|assert|Error|exited with" "$OUT/verify26b-tests.log" | cut -c1-400 | tail -40
fi
if [[ "$what" == verify26 ]]; then
  (cd "$build" && timeout 280 ctest -R "cpkv.python.timeline_gpu|GpuBackend.TheBuiltInPlugins|GpuMutants|GpuVmm|FusedPlugin|GpuPluginStub" \
    --output-on-failure --timeout 200 -j 1) > "$OUT/verify26-tests.log" 2>&1
  echo "verify26 gpu tests: exit $?"; grep -E "Test +#|tests passed|Failure|Expected|assert|Error" "$OUT/verify26-tests.log" | tail -40
  T=GpuBarrier.TheLaunchWaitsForAnIdleSlowReaderItReadsNothingFrom
  timeout 100 "$build/tests/cpkv.tests.gpu" --gtest_filter=$T > "$OUT/closing-wait-tree.txt" 2>&1
  echo "closing-wait test on the tree: exit $?"; tail -3 "$OUT/closing-wait-tree.txt"
  for patches in closing-wait-skips-last-peer "closing-wait-skips-last-peer plugin-host-drops-reader-spin"; do
    for p in $patches; do (cd "$root" && patch -s -p1 < "docs/patches/$p.patch"); done
    if ! cmake --build "$build" -j "$(nproc)" --target cpkv.tests.gpu cpkv_exchange_fused > "$OUT/patched-build.log" 2>&1; then
      echo "the build with [$patches] failed: not run"; grep -E "error" "$OUT/patched-build.log" | head
      for p in $patches; do (cd "$root" && patch -s -R -p1 < "docs/patches/$p.patch"); done
      continue
    fi
    timeout 100 "$build/tests/cpkv.tests.gpu" --gtest_filter=$T > "$OUT/closing-wait-patched.txt" 2>&1
    echo "closing-wait test with [$patches]: exit $?; the failing cases (mode, cp, idle slow rank, variant), each with its count of failure lines:"
    grep -E "^(through the ABI|in process) cp" "$OUT/closing-wait-patched.txt" | cut -d: -f1 | sort | uniq -c
    for p in $patches; do (cd "$root" && patch -s -R -p1 < "docs/patches/$p.patch"); done
  done
fi
if [[ "$what" == tl26 || "$what" == unverified ]]; then
  tiny="$root/traces/samples/tiny.jsonl"
  cases=("--exchange inprocess --timeline $OUT/tl-a.json" "--exchange inprocess" "--timeline $OUT/tl-c.json" "--exchange inprocess --cp 1 --timeline $OUT/tl-d.json")
  [[ "${TL_ONE:-0}" == 1 ]] && cases=("--timeline $OUT/tl-c.json")  # the default bench: in process, then through the ABI
  for extra in "${cases[@]}"; do
    echo "== bench tiny --variant staging_direct --layers 2 --reps 3 --time-sliced $extra"
    timeout 120 "$cpkv" bench "$tiny" --variant staging_direct --layers 2 --reps 3 --time-sliced $extra 2>&1 | tail -25
    echo "exit ${PIPESTATUS[0]}"
  done
fi
if [[ "$what" == abi24c ]]; then
  (cd "$build" && ctest -R "GpuBenchPlugin|timeline_gpu|GpuPluginStub" --output-on-failure --timeout 200 -j 1) > "$OUT/gpu-tests-c.log" 2>&1
  echo "bench-plugin and timeline gpu tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|Not Run|Total Test|assert|Error" "$OUT/gpu-tests-c.log" | tail -30
fi
if [[ "$what" == abi24b || "$what" == abi24c ]]; then
  for name in seeds_batch mooncake_slice; do
    for i in 1 2; do
      timeout 200 "$cpkv" bench "$root/traces/samples/$name.jsonl" --backend cuda --cp 1 --layers 4 --reps 60 \
        --json "$OUT/abi24b-$name-$i.json" --markdown "$OUT/abi24b-$name-$i.md" > "$OUT/abi24b-$name-$i.txt" 2>&1
      echo "bench $name $i: exit $?"
    done
    python3 "$root/bench/abi_ratio.py" "$OUT"/abi24b-$name-*.json | tee "$OUT/abi24b-$name-ratio.md"
  done
  timeout 240 "$cpkv" mutants --backend cuda > "$OUT/gpu-mutants-builtin.txt" 2>&1
  echo "mutants --backend cuda (the built-in plugin, the default): exit $?"; tail -18 "$OUT/gpu-mutants-builtin.txt"
  timeout 240 "$cpkv" mutants --backend cuda --exchange inprocess > "$OUT/gpu-mutants-inprocess.txt" 2>&1
  echo "mutants --backend cuda --exchange inprocess: exit $?"; tail -14 "$OUT/gpu-mutants-inprocess.txt"
  timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --target-processes all --error-exitcode 3 "$cpkv" replay "$root/traces/samples/tiny.jsonl" \
    --backend cuda --variant all --exchange "$build/gpu/libcpkv_exchange_fused.so" --layers 2 > "$OUT/fused-memcheck.txt" 2>&1
  echo "fused .so (produce_rows) under compute-sanitizer memcheck (every variant, tiny): exit $?"; tail -4 "$OUT/fused-memcheck.txt"
fi
if [[ "$what" == ab21 ]]; then
  # Issue 21's A/B on one GPU: the bench at cp 1 (no oversubscription, so a timing of record for the
  # per-layer launch and host structure the refactor touched; peer links need two GPUs) of the tree
  # against the pre-refactor tree a6aacb7, shipped untracked as ab-old/ (git archive a6aacb7), built
  # the same way; old and new interleaved twice per trace, compared by bench/bench_ab.py.
  old="$root/ab-old"
  [[ -d "$old" ]] || { echo "ab21: $old is missing (git archive a6aacb7 | tar -x -C ab-old)"; exit 2; }
  cmake -S "$old" -B "$root/build-old" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure-old.log" 2>&1 \
    && cmake --build "$root/build-old" -j "$(nproc)" --target cpkv > "$OUT/build-old.log" 2>&1 \
    || { grep -E "error|Error" "$OUT/build-old.log" "$OUT/configure-old.log" | head -20; exit 1; }
  echo "old build: $(( $(date +%s) - start )) s"
  for name in seeds_batch mooncake_slice; do
    for i in 1 2; do
      for side in old new; do
        bin="$cpkv"; [[ $side == old ]] && bin="$root/build-old/cli/cpkv"
        timeout 150 "$bin" bench "$root/traces/samples/$name.jsonl" --backend cuda --cp 1 --layers 4 --reps 60 \
          --json "$OUT/ab21-$name-$side-$i.json" > "$OUT/ab21-$name-$side-$i.txt" 2>&1
        echo "bench $name $side $i: exit $?"
      done
    done
    python3 "$root/bench/bench_ab.py" --label-a a6aacb7 --label-b tree --a "$OUT"/ab21-$name-old-*.json --b "$OUT"/ab21-$name-new-*.json \
      > "$OUT/ab21-$name.md"; cat "$OUT/ab21-$name.md"
    python3 "$root/bench/bench_ab.py" --key with_fill_us_per_layer_median --label-a a6aacb7 --label-b tree \
      --a "$OUT"/ab21-$name-old-*.json --b "$OUT"/ab21-$name-new-*.json > "$OUT/ab21-$name-with-fill.md"; tail -10 "$OUT/ab21-$name-with-fill.md"
  done
fi
if [[ "$what" == fused ]]; then
  # Issue 24 item 2: cpkv's own fused compose as the first plugin (gpu/fused/), on one H200 with the
  # ranks oversubscribed (cp 2, 4, 8). The plugin gpu tests (the plain example, the fused .so and the
  # built-in on every bundled trace in every variant, also under --swarm; the harness's planted bugs;
  # `cpkv mutants --exchange` over the fused .so), then the CLI runs as a record: every variant on
  # every bundled trace through --exchange builtin and through the .so, the GPU mutants through the
  # built-in table (CPKV_EXCHANGE=builtin, the one-line switch), memcheck over the .so's tiny replay.
  fused="$build/gpu/libcpkv_exchange_fused.so"
  (cd "$build" && ctest -R "GpuPlugin|GpuFusedPlugin|FusedPlugin" --output-on-failure --timeout 400 -j 1) > "$OUT/fused-plugin-tests.log" 2>&1
  echo "fused plugin tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|Not Run" "$OUT/fused-plugin-tests.log" | tail -20
  for exchange in builtin "$fused"; do
    for args in "tiny.jsonl --layers 2" "tiny.jsonl --layers 2 --swarm --seed 5" "seeds_batch.jsonl --layers 3" "mooncake_slice.jsonl --layers 2"; do
      echo "== cpkv replay $args --variant all --exchange $exchange" >> "$OUT/fused-replays.txt"
      timeout 240 "$cpkv" replay "$root/traces/samples/"$args --variant all --backend cuda --exchange "$exchange" >> "$OUT/fused-replays.txt" 2>&1
      echo "fused replay $args ($exchange): exit $?" | tee -a "$OUT/fused-replays.txt"
    done
  done
  CPKV_EXCHANGE=builtin timeout 240 "$cpkv" mutants --backend cuda > "$OUT/fused-mutants-builtin.txt" 2>&1
  echo "CPKV_EXCHANGE=builtin mutants --backend cuda: exit $?"; tail -22 "$OUT/fused-mutants-builtin.txt"
  timeout 300 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --target-processes all --error-exitcode 3 "$cpkv" replay "$root/traces/samples/tiny.jsonl" \
    --backend cuda --variant all --exchange "$fused" --layers 2 > "$OUT/fused-memcheck.txt" 2>&1
  echo "fused .so under compute-sanitizer memcheck (every variant, tiny): exit $?"; tail -8 "$OUT/fused-memcheck.txt"
  if [[ "${FUSED_ALL:-0}" == 1 ]]; then
    # cpkv's own gpu backend tests through the built-in plugin (the one-line switch; longer).
    (cd "$build" && CPKV_EXCHANGE=builtin ctest -R "GpuBackend|GpuMutants" --output-on-failure --timeout 400 -j 1) > "$OUT/fused-backend-tests.log" 2>&1
    echo "CPKV_EXCHANGE=builtin gpu backend tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|Not Run" "$OUT/fused-backend-tests.log" | tail -20
  fi
fi
if [[ "$what" == vmm ]]; then
  # Issue 26 item 4, one H200: the production pool (65,536 pages, 61 layers; batches 1784-1785 of the
  # Mooncake sample) at cp 2 and 4 on GPU 0 alone. Before: the whole pool per rank (the cudaMalloc
  # path, CPKV_POOL_MEMORY=dense) is refused up front with its need beside the free memory (it died
  # in cudaMalloc before); after: the sparse pool, every variant byte-exact. Then the gpu_vmm tests.
  export CUDA_VISIBLE_DEVICES=0
  for cp in 2 4; do
    "$cpkv" import mooncake "$root/traces/data/mooncake/synthetic_trace.jsonl" -o "$OUT/mooncake-prod-cp$cp.jsonl" --cp $cp \
      --skip-batches 1784 --max-batches 2 > "$OUT/import-cp$cp.log" 2>&1
    echo "import cp $cp: exit $?"
  done
  CPKV_POOL_MEMORY=dense timeout 120 "$cpkv" replay "$OUT/mooncake-prod-cp2.jsonl" --backend cuda --variant all --layers all > "$OUT/vmm-before-dense-cp2.txt" 2>&1
  echo "before (dense pool) cp 2: exit $? (2 expected: refused)"; cat "$OUT/vmm-before-dense-cp2.txt"
  for cp in 2 4; do
    t0=$(date +%s)
    timeout 200 "$cpkv" replay "$OUT/mooncake-prod-cp$cp.jsonl" --backend cuda --variant all --layers all \
      --json "$OUT/vmm-after-sparse-cp$cp.json" > "$OUT/vmm-after-sparse-cp$cp.txt" 2> "$OUT/vmm-after-sparse-cp$cp.err"
    echo "after (sparse pool) cp $cp: exit $? in $(( $(date +%s) - t0 )) s"; cat "$OUT/vmm-after-sparse-cp$cp.txt"; tail -5 "$OUT/vmm-after-sparse-cp$cp.err"
  done
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv || true
  unset CUDA_VISIBLE_DEVICES
  (cd "$build" && ctest -R "GpuVmm|PoolBacking|PoolNeed|RankSocket|GpuBackend|GpuPlugin" --output-on-failure --timeout 300 -j 1) > "$OUT/gpu-vmm-tests.log" 2>&1
  echo "vmm + backend tests: exit $?"; grep -E "Passed|Failed|Not Run|tests passed|\*\*\*" "$OUT/gpu-vmm-tests.log" | tail -30
fi
if [[ "$what" == bench-plugin ]]; then
  # Timings at cp 1 only (one rank, one GPU: never a time-sliced timing), the built-in and the plain
  # plugin on the same trace and variant in this one visit, then their ratio per layer; cp 2 on the
  # one GPU with --time-sliced checks the plugin path's bytes (its timings are discarded).
  plain="$build/examples/libcpkv_exchange_plain.so"
  trace="$root/traces/samples/seeds_batch.jsonl"
  common=(--cp 1 --layers 4 --reps 40 --variant staging_direct)
  timeout 120 "$cpkv" bench "$trace" "${common[@]}" --json "$OUT/bench-ab-builtin.json" --markdown "$OUT/bench-ab-builtin.md" > "$OUT/bench-ab-builtin.txt" 2>&1
  echo "bench built-in cp 1: exit $?"
  timeout 120 "$cpkv" bench "$trace" "${common[@]}" --exchange "$plain" --json "$OUT/bench-ab-plain.json" --markdown "$OUT/bench-ab-plain.md" > "$OUT/bench-ab-plain.txt" 2>&1
  echo "bench --exchange plain cp 1: exit $?"; cat "$OUT/bench-ab-plain.md"
  python3 "$root/bench/bench_ab.py" --a "$OUT/bench-ab-builtin.json" --b "$OUT/bench-ab-plain.json" --key-b plugin_compose_us_per_layer_median \
    --label-a built-in --label-b plain | tee "$OUT/bench-ab.md"
  timeout 120 "$cpkv" bench "$root/traces/samples/tiny.jsonl" --exchange "$plain" --cp 2 --time-sliced --reps 2 > "$OUT/bench-plugin-sliced.txt" 2>&1
  echo "bench --exchange plain cp 2 time-sliced (bytes only): exit $?"; grep -E "TIME-SLICED|FAILED|\| (yes|NO) \|$" "$OUT/bench-plugin-sliced.txt" | cut -c1-60
  (cd "$build" && ctest -R "^GpuBenchPlugin[.]" --output-on-failure --timeout 200 -j 1) > "$OUT/gpu-bench-plugin-tests.log" 2>&1
  echo "gpu bench plugin tests: exit $?"; grep -E "Passed|Failed|Skipped|tests passed|Not Run" "$OUT/gpu-bench-plugin-tests.log" | tail -6
fi
if [[ "$what" == abi24 ]]; then
  # Issue 24's A/B on one GPU at cp 1 (one rank, one GPU: a timing of record; peer links need two):
  # cpkv's own exchange in-process (the graph-replayed layer loop) against the same fused compose
  # behind the ABI (`--exchange builtin`: compose_layer launched from the host, its fill from the
  # handed-over rows inside the span), interleaved twice, every variant; then the GpuVmm tests.
  for i in 1 2; do
    for side in inproc abi; do
      extra=(); [[ $side == abi ]] && extra=(--exchange builtin)
      timeout 150 "$cpkv" bench "$root/traces/samples/seeds_batch.jsonl" --backend cuda --cp 1 --layers 4 --reps 40 "${extra[@]}" \
        --json "$OUT/abi24-$side-$i.json" > "$OUT/abi24-$side-$i.txt" 2>&1
      echo "bench seeds_batch $side $i: exit $?"
    done
  done
  for key in compose_us_per_layer_median with_fill_us_per_layer_median; do
    python3 "$root/bench/bench_ab.py" --key "$key" --key-b plugin_compose_us_per_layer_median --label-a "in-process $key" --label-b "ABI compose_layer" \
      --a "$OUT"/abi24-inproc-*.json --b "$OUT"/abi24-abi-*.json | tee -a "$OUT/abi24.md"
  done
  (cd "$build" && ctest -R "GpuVmm" --output-on-failure --timeout 300 -j 1) > "$OUT/gpu-vmm-tests.log" 2>&1
  echo "GpuVmm tests: exit $?"; grep -E "Passed|Failed|tests passed" "$OUT/gpu-vmm-tests.log" | tail -6
fi
if [[ "$what" == tests || "$what" == all ]]; then
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 600 -j 1) > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; tail -25 "$OUT/gpu-tests.log"
  for trace in "$root"/traces/samples/*.jsonl; do
    timeout 300 "$cpkv" replay "$trace" --backend cuda --layers 4 --json "$OUT/replay-$(basename "$trace" .jsonl).json"
  done
fi
if [[ "$what" == bench || "$what" == all ]]; then
  # Every bundled trace at cp = 2 (one rank per GPU on the 2-GPU machine); the chart is drawn with
  # the machine's python3 + matplotlib where it has them (else later: scripts/plot_bench.py).
  for trace in "$root"/traces/samples/*.jsonl; do
    name="$(basename "$trace" .jsonl)"
    timeout 300 "$cpkv" bench "$trace" --backend cuda --cp 2 --layers 4 --reps 60 \
      --json "$OUT/bench-$name-cp2.json" --markdown "$OUT/bench-$name-cp2.md"
    echo "bench $name: exit $?"
    python3 "$root/scripts/plot_bench.py" "$OUT/bench-$name-cp2.json" "$OUT/bench-$name-cp2.png" || true
  done
fi
echo "== done in $(( $(date +%s) - start )) s"
