#!/usr/bin/env bash
# The GPU suites, run on the device machine (the `device` tool): build there, run the suites asked
# for, and leave what they report under $OUT. Usage (device tool, from the repository root):
#
#   scripts/gpu-visit.sh SUITE [SUITE...]      # or `all`; `list` prints the table below
#
# The device tool brings back at most 8 files, 2 folders deep, so $OUT holds only summary.txt (one
# line per step: suite, step, exit status, seconds), visit.log (everything printed), the bench's
# record (bench-TRACE.json and .md) and logs.tar.gz (every step's full output and files).
#
# Knobs (environment):
#   VISIT_S=540        the whole visit's bound in seconds (the device tool stops a command at 600);
#                      every step's own bound is cut to what is left of it
#   BUILD_S=360        the build's bound in seconds; 0 runs the suites on the build already in
#                      build-gpu/ (a second call on the same warm machine keeps it)
#   GPU_TESTS_S=420    the gpu suite's bound for all its tests together
#   GPU_TESTS_JOBS=1   gpu tests run side by side on the GPUs (correctness runs, never timed)
#   BENCH_CP           the bench's cp (default: 1 on one GPU, so its timings are of record; 2 on two)
#   BENCH_RUNS, BENCH_REPS, BENCH_VARIANT  runs per trace and side (default 2), timed replays (60), variant (all)
#   BENCH_TRACES       the bundled traces benched (default: seeds_batch mooncake_slice)
#   BENCH_BASELINE=DIR another tree (e.g. `git archive COMMIT | tar -x -C ab-old`), built the same way
#                      and benched interleaved with this one; bench/bench_ab.py gives the ratio per layer
#   PROBE_ARGS         the gather probe's arguments (default --quick; empty for the full sweep)
#   CPKV_COMMIT        the commit the caller's tree is at, for the visit's first line
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# suite        what it tests                                                  its build targets
SUITES=(
  "gpu         every gpu-labelled ctest test                                          all"
  "mutants     cpkv mutants --backend cuda, through the built-in plugin (in process: refused)  cpkv"
  "bench       cpkv bench on the bundled traces, twice, and the per-layer A/B ratio     cpkv"
  "conformance the Python conformance harness on CUDA ranks: its gpu test and its CLI   cpkv cpkv_python"
  "plugin      the example plugin and the fused .so: tests, replays, memcheck           cpkv cpkv_exchange_plain cpkv_exchange_plain_zero_tails cpkv_exchange_fused cpkv_stub_exchange_ok cpkv.tests.gpu_plugin cpkv.tests.gpu_bench_plugin cpkv.tests.fused_plugin"
  "probe       the gather probe (bench/gather_probe.cu, 2 GPUs), no project build       -"
  "vmm         the sparse pool: the production pool at cp 2 and 4 on one GPU, its tests  cpkv cpkv.tests.gpu_vmm cpkv.tests.gpu_pool_backing"
  "guards      the plugin host's guards: misbehaving plugins, counters, device faults    cpkv cpkv.tests.gpu_guard cpkv.tests.gpu_counters cpkv_misbehaving_none cpkv_misbehaving_past_dense cpkv_misbehaving_pool cpkv_misbehaving_counters cpkv_misbehaving_fault"
  "imports     cpkv's module and torch imported in both orders on CUDA ranks, each order its own process   cpkv cpkv_python"
  "allgather   section 12's all-gathers: their tests, every bundled trace at cp 2, 4, 8, a planted bug   cpkv cpkv_exchange_fused cpkv.tests.gpu_allgather cpkv.tests.gpu_plan cpkv.tests.fused_plugin"
)

suite_names() { local row; for row in "${SUITES[@]}"; do echo "${row%% *}"; done; }
suite_row() { local row; for row in "${SUITES[@]}"; do [[ "${row%% *}" == "$1" ]] && echo "$row"; done; }
# A suite's build targets: the row's words after its description, which ends at two or more spaces.
suite_targets() { suite_row "$1" | sed -E 's/^[a-z]+ +//; s/.*  +//'; }

if [[ $# -eq 0 || "$1" == list || "$1" == -h || "$1" == --help ]]; then
  echo "usage: scripts/gpu-visit.sh SUITE [SUITE...] | all"; printf '  %s\n' "${SUITES[@]}"
  exit $(( $# == 0 ? 2 : 0 ))
fi
suites=()
for s in "$@"; do
  if [[ "$s" == all ]]; then mapfile -t suites < <(suite_names); continue; fi
  [[ -n "$(suite_row "$s")" ]] || { echo "gpu-visit: '$s' is no suite (scripts/gpu-visit.sh list)" >&2; exit 2; }
  suites+=("$s")
done

OUT="${OUT:-$root/out}"
work=/tmp/cpkv-visit
logs="$work/logs"
rm -rf "$logs"  # a warm machine keeps /tmp: this visit's logs only
mkdir -p "$OUT" "$logs"
summary="$OUT/summary.txt"
exec > >(tee -a "$OUT/visit.log") 2>&1
visit_s="${VISIT_S:-540}"
start=$(date +%s)
left_s() { echo $(( visit_s - ($(date +%s) - start) )); }

# step SUITE NAME LIMIT_S [=RC] COMMAND...: runs COMMAND bounded by LIMIT_S or what is left of the
# visit, its output in logs/SUITE.log, and its exit status and seconds as one line of the summary;
# a status other than RC (default 0) counts as a failure of the visit.
failures=0
step() {
  local suite="$1" name="$2" limit="$3" expect=0; shift 3
  [[ "$1" == =* ]] && { expect="${1#=}"; shift; }
  local left; left=$(left_s)
  (( left < limit )) && limit=$left
  if (( limit < 5 )); then echo "$suite $name: not run (the visit's $visit_s s are spent)" | tee -a "$summary"; return 0; fi
  local t0; t0=$(date +%s)
  echo "== $suite $name (bound ${limit} s): $*" >> "$logs/$suite.log"
  if declare -F "$1" >/dev/null; then  # a function of this script: timeout runs programs only
    timeout --kill-after=10 "$limit" bash -c "$(declare -f "$1"); \"\$@\"" _ "$@" >> "$logs/$suite.log" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" >> "$logs/$suite.log" 2>&1
  fi
  local rc=$? verdict=ok
  (( rc == expect )) || { verdict=FAILED; failures=$(( failures + 1 )); }
  (( rc == 124 || rc == 137 )) && verdict="$verdict (bound ${limit} s reached)"
  echo "$suite $name: exit $rc (expected $expect) in $(( $(date +%s) - t0 )) s: $verdict" | tee -a "$summary"
  return $rc
}
# ctest_step SUITE NAME LIMIT_S CTEST-ARGS...: ctest in the build folder, each test bounded too; a
# selection that matches no test is a failure, not a pass.
ctest_step() {
  local suite="$1" name="$2" limit="$3"; shift 3
  (cd "$build" && step "$suite" "$name" "$limit" ctest --output-on-failure --no-tests=error --timeout 300 "$@")
  local rc=$?
  (( rc == 0 )) || failures=$(( failures + 1 ))
  grep -E "tests passed|Failed|Not Run|\*\*\*Skipped" "$logs/$suite.log" | tail -12
  return $rc
}

# The device's copy of the tree may carry stale git metadata (its files are the caller's, its .git an
# older copy's), so the commit comes from the caller where given: CPKV_COMMIT=$(git rev-parse --short HEAD).
commit="${CPKV_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?') (from the device copy, CPKV_COMMIT not given)}"
echo "== $(date -u +%FT%TZ) gpu visit: ${suites[*]} (commit $commit)"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi: no GPU here"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
build="$root/build-gpu"  # inside the tree (ignored): the device machine keeps it between calls
cpkv="$build/cli/cpkv"
samples="$root/traces/samples"

# configure_build SRC BUILD TARGETS...: the project built for sm_90 within BUILD_S.
configure_build() {
  local src="$1" dir="$2"; shift 2
  local py_args=()
  # The machine's own python3 where it has PyTorch and pybind11 (Debian's there has neither).
  if python3 -c "import torch, pybind11" >/dev/null 2>&1; then
    py_args=(-DPython3_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)")
  fi
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 "${py_args[@]}" \
    && cmake --build "$dir" -j "$(nproc)" "$@"
}

# RapidCheck is not in every GPU image: unpack a carried Debian package (.deps/) where it is missing.
if ! ls /usr/lib/x86_64-linux-gnu/cmake/rapidcheck >/dev/null 2>&1 && ls "$root"/.deps/librapidcheck-dev_*.deb >/dev/null 2>&1; then
  mkdir -p "$work/rc" && for deb in "$root"/.deps/librapidcheck-dev_*.deb; do dpkg -x "$deb" "$work/rc"; done
  export CMAKE_PREFIX_PATH="$work/rc/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
fi
targets=()
for s in "${suites[@]}"; do
  for t in $(suite_targets "$s"); do [[ "$t" == - ]] || targets+=("$t"); done
done
if (( ${#targets[@]} > 0 && ${BUILD_S:-360} > 0 )); then
  target_args=(); [[ " ${targets[*]} " == *" all "* ]] || target_args=(--target $(printf '%s\n' "${targets[@]}" | sort -u))
  step build project "${BUILD_S:-360}" configure_build "$root" "$build" "${target_args[@]}" \
    || { grep -E "error|Error" "$logs/build.log" | head -30; suites=(); }
fi

suite_gpu() {
  ctest_step gpu tests "${GPU_TESTS_S:-420}" -L gpu -j "${GPU_TESTS_JOBS:-1}"
}

suite_mutants() {
  step mutants builtin 240 "$cpkv" mutants --backend cuda
  step mutants inprocess-refused 30 =2 "$cpkv" mutants --backend cuda --exchange inprocess
  grep -E "caught|missed|FAIL|self-test" "$logs/mutants.log" | tail -16
}

# Each bundled trace at BENCH_CP, twice (the same binary's run-to-run spread), interleaved with the
# baseline tree's when BENCH_BASELINE names one; bench_ab.py gives the per-layer ratio.
suite_bench() {
  local bench_cp="${BENCH_CP:-$(( gpus >= 2 ? 2 : 1 ))}" base="${BENCH_BASELINE:-}" name side i bin
  local sides=(tree)
  if [[ -n "$base" ]]; then
    (( ${BUILD_S:-360} > 0 )) && step bench baseline-build "${BUILD_S:-360}" configure_build "$base" "$root/build-baseline" --target cpkv
    [[ -x "$root/build-baseline/cli/cpkv" ]] && sides=(baseline tree)
  fi
  for name in ${BENCH_TRACES:-seeds_batch mooncake_slice}; do
    for i in $(seq 1 "${BENCH_RUNS:-2}"); do
      for side in "${sides[@]}"; do
        bin="$cpkv"; [[ $side == baseline ]] && bin="$root/build-baseline/cli/cpkv"
        step bench "$name-$side-$i" 200 "$bin" bench "$samples/$name.jsonl" --backend cuda --cp "$bench_cp" --layers 4 \
          --reps "${BENCH_REPS:-60}" --variant "${BENCH_VARIANT:-all}" \
          --json "$logs/bench-$name-$side-$i.json" --markdown "$logs/bench-$name-$side-$i.md"
      done
    done
    cp "$logs/bench-$name-tree-1.json" "$OUT/bench-$name.json" 2>/dev/null
    cp "$logs/bench-$name-tree-1.md" "$OUT/bench-$name.md" 2>/dev/null
    (( ${BENCH_RUNS:-2} >= 2 )) && step bench "$name-spread" 30 python3 "$root/bench/bench_ab.py" --label-a "run 1" --label-b "run 2" \
      --a "$logs/bench-$name-tree-1.json" --b "$logs/bench-$name-tree-2.json"
    [[ ${#sides[@]} == 2 ]] && step bench "$name-ab" 30 python3 "$root/bench/bench_ab.py" --label-a baseline --label-b tree \
      --a "$logs"/bench-$name-baseline-*.json --b "$logs"/bench-$name-tree-*.json
  done
  grep -E "geometric|geomean|^\| [a-z_]+ \|" "$logs/bench.log" | tail -30
}

suite_conformance() {
  ctest_step conformance gpu-test 300 -R cpkv.python.conformance_gpu
  local impl=cpkv.conformance.reference args
  for args in "--impl $impl:StagingDirect" "--impl $impl:V2" "--impl $impl:StagingDirect --swarm --seed 4" \
              "--impl $impl:StagingDirect --time" "=1 --impl $impl:StagingDirect --mutant single_half"; do
    local expect=(); [[ "$args" == =* ]] && { expect=("${args%% *}"); args="${args#* }"; }
    local name="${args#--impl $impl:}"
    PYTHONPATH="$build/python" step conformance "${name// /_}" 180 "${expect[@]}" \
      python3 -m cpkv.conformance "$samples/tiny.jsonl" $args --ranks 2 --device cuda --wait-ms-max 10000
  done
}

# Section 12's variants: every bundled trace with its header's cp set to 2, 4 and 8 (ranks time-slice
# on one GPU: the IPC all-gather; NCCL's where every rank has a GPU), through the built-in plugin and
# the fused .so, and skip_zero (the re-ordering's zero rows left out) caught: exit 1.
suite_allgather() {
  local name cp variants=allgather_zigzag,allgather_continuous
  ctest_step allgather tests 240 -R "GpuAllGather|GpuPlan|FusedPlugin"
  for name in tiny seeds_batch mooncake_slice; do
    for cp in 2 4 8; do
      sed -E "1s/\"cp\":[0-9]+/\"cp\":$cp/" "$samples/$name.jsonl" > "$work/$name-cp$cp.jsonl"
      step allgather "$name-cp$cp" 120 "$cpkv" replay "$work/$name-cp$cp.jsonl" --backend cuda --variant $variants --layers 2
    done
  done
  step allgather fused-so-seeds 120 "$cpkv" replay "$samples/seeds_batch.jsonl" --backend cuda --variant $variants --layers 2 \
    --exchange "$build/gpu/libcpkv_exchange_fused.so"
  step allgather skip_zero-caught 120 =1 "$cpkv" replay "$samples/tiny.jsonl" --backend cuda --variant $variants --layers 2 --mutant skip_zero
  grep -E "^(allgather|staging|cp |  [a-z_]+ )|mismatch|violat|FAIL|wrong" "$logs/allgather.log" | head -60
}

suite_plugin() {
  local plain="$build/examples/libcpkv_exchange_plain.so" fused="$build/gpu/libcpkv_exchange_fused.so" so args
  ctest_step plugin tests 400 -R "GpuPlugin|GpuFusedPlugin|FusedPlugin|GpuBenchPlugin|GpuPluginStub"
  for so in "$plain" "$fused"; do
    for args in "tiny.jsonl --layers 2" "tiny.jsonl --layers 2 --swarm --seed 5" "seeds_batch.jsonl --layers 3" \
                "mooncake_slice.jsonl --layers 2"; do
      step plugin "$(basename "$so" .so) ${args// /_}" 240 "$cpkv" replay "$samples/"$args --variant all --backend cuda --exchange "$so"
    done
    # A planted bug of the harness (the rows it hands over, unzeroed) must be caught: exit 1.
    step plugin "$(basename "$so" .so) unzeroed_rows" 240 =1 "$cpkv" replay "$samples/mooncake_slice.jsonl" --layers 2 \
      --variant staging_direct --backend cuda --exchange "$so" --mutant unzeroed_rows
    step plugin "$(basename "$so" .so)-memcheck" 300 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --target-processes all \
      --error-exitcode 3 "$cpkv" replay "$samples/tiny.jsonl" --backend cuda --variant all --exchange "$so" --layers 2
  done
  step plugin stub-setup-fails 120 =1 "$cpkv" replay "$samples/tiny.jsonl" --backend cuda --variant staging_direct \
    --exchange "$build/tests/libcpkv_stub_exchange_ok.so"
}

# Needs two GPUs with peer access; built with nvcc alone.
suite_probe() {
  if (( gpus < 2 )); then echo "probe: not run (needs 2 GPUs, this machine has $gpus)" | tee -a "$summary"; return 0; fi
  step probe build 180 /usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -std=c++17 -o "$work/gather_probe" "$root/bench/gather_probe.cu" || return 1
  step probe run 300 sh -c "'$work/gather_probe' ${PROBE_ARGS---quick} > '$logs/gather-probe.csv'"
  grep -E "copy engines|best" "$logs/probe.log" | tail -20
}

# The production pool (65,536 pages, 61 layers; batches 1784-1785 of the Mooncake sample) at cp 2
# and 4 on GPU 0 alone: the dense pool (CPKV_POOL_MEMORY=dense) refused up front (exit 2), the
# sparse pool byte-exact in every variant; then the pool's tests.
suite_vmm() {
  local cp
  for cp in 2 4; do
    step vmm "import-cp$cp" 120 "$cpkv" import mooncake "$root/traces/data/mooncake/synthetic_trace.jsonl" \
      -o "$work/mooncake-prod-cp$cp.jsonl" --cp $cp --skip-batches 1784 --max-batches 2
  done
  CUDA_VISIBLE_DEVICES=0 CPKV_POOL_MEMORY=dense step vmm dense-cp2-refused 120 =2 \
    "$cpkv" replay "$work/mooncake-prod-cp2.jsonl" --backend cuda --variant all --layers all
  for cp in 2 4; do
    CUDA_VISIBLE_DEVICES=0 step vmm "sparse-cp$cp" 200 "$cpkv" replay "$work/mooncake-prod-cp$cp.jsonl" --backend cuda \
      --variant all --layers all --json "$logs/vmm-sparse-cp$cp.json"
  done
  grep -E "gpu memory|needs|passed|FAIL" "$logs/vmm.log" | cut -c1-300 | tail -12
  ctest_step vmm tests 300 -R "GpuVmm|PoolBacking|PoolNeed"
}

# Which order of `import cpkv` (its pybind11 module) and `import torch` a CUDA conformance rank
# survives, and what each order loads: the C++ runtime and the libraries both bring, and the
# pybind11 internals names of both modules (an order that aborts shows its backtrace).
suite_imports() {
  # The package imports cpkv's module first and torch after it (cpkv.conformance); torch first too.
  PYTHONPATH="$build/python" step imports cpkv-first 180 \
    python3 -m cpkv.conformance "$samples/tiny.jsonl" --impl cpkv.conformance.reference:StagingDirect --ranks 2 --device cuda
  PYTHONPATH="$build/python" step imports torch-first 180 python3 -c \
    "import torch, sys; from cpkv.conformance.__main__ import run_main; sys.exit(run_main(['$samples/tiny.jsonl', '--impl', 'cpkv.conformance.reference:StagingDirect', '--ranks', '2', '--device', 'cuda']))"
  PYTHONPATH="$build/python" step imports loaded-libraries 120 import_diagnosis "$build"
}
import_diagnosis() {
  local order so
  for order in "cpkv._cpkv torch" "torch cpkv._cpkv"; do
    echo "-- import $order: the runtimes loaded"
    LD_DEBUG=libs python3 -c "import importlib; [importlib.import_module(m) for m in '$order'.split()]" 2>&1 \
      | grep -E "calling init: .*(libstdc|libgcc_s|libfmt|libc10|libtorch_python|_cpkv)" | sed 's/^ *[0-9]*: *//' | head -12
    echo "-- import $order, then a CUDA tensor: exit $(python3 -c "import importlib; [importlib.import_module(m) for m in '$order'.split()]; import torch; torch.ones(1, device='cuda')" >/dev/null 2>&1; echo $?)"
  done
  so=$(ls "$1"/python/cpkv/_cpkv*.so 2>/dev/null | head -1)
  echo "-- the module's libraries and its exported symbols ($(nm -D --defined-only "$so" | wc -l) defined)"
  ldd "$so" | sed 's/ (0x.*//'
  echo "-- cpkv first, then a CUDA tensor: the Python stack at the abort, if any"
  timeout 120 python3 -X faulthandler -c "import cpkv._cpkv, torch; torch.ones(1, device='cuda'); print('ok')" 2>&1 | tail -15
  echo "-- symbols that a library other than the module bound to the module's or libfmt's copy"
  LD_DEBUG=bindings timeout 120 python3 -c "import cpkv._cpkv, torch; torch.ones(1, device='cuda')" 2>&1 \
    | grep -E "to .*(_cpkv|libfmt)" | grep -vE "binding file .*(_cpkv|libfmt)[^ ]* " | sed 's/^ *[0-9]*: *//' | head -15
  echo "-- pybind11 internals names: cpkv's $(strings "$so" | grep -o '__pybind11_internals[a-z0-9_]*' | sort -u | tr '\n' ' ')"
  echo "   torch's $(strings "$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_python.so"))')" | grep -o '__pybind11_internals[a-z0-9_]*' | sort -u | tr '\n' ' ')"
  command -v gdb >/dev/null && timeout 120 gdb -batch -ex run -ex bt --args python3 -c \
    "import cpkv._cpkv, torch; torch.ones(1, device='cuda')" 2>&1 | tail -25
  return 0
}

suite_guards() {
  local m
  ctest_step guards tests 300 -R "GpuCounters|GpuGuard"
  # Each misbehaving plugin (tests/plugins/misbehaving_exchange.cu) as a user sees it.
  for m in none past_dense pool counters fault; do
    step guards "misbehaving-$m" 120 "=$([[ $m == none ]] && echo 0 || echo 1)" "$cpkv" replay "$samples/tiny.jsonl" --backend cuda \
      --exchange "$build/tests/libcpkv_misbehaving_$m.so" --variant staging_direct --layers 2
  done
  grep -E "wrote outside|counters|device fault" "$logs/guards.log" | cut -c1-300 | head -12
}

for s in "${suites[@]}"; do "suite_$s"; done
tar -czf "$OUT/logs.tar.gz" -C "$work" logs 2>/dev/null
files=$(find "$OUT" -type f | wc -l)
(( files > 8 )) && echo "gpu-visit: $files files under \$OUT: the device tool brings back 8"
echo "== done in $(( $(date +%s) - start )) s, $failures step(s) failed; summary:"
cat "$summary" 2>/dev/null
(( failures == 0 ))
