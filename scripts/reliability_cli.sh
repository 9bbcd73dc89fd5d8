#!/usr/bin/env bash
# Runs cpkv on bad inputs (files, numbers, pipes, options) and prints the markdown table of
# docs/reliability.d/cli.md: one row per command actually run, with the exit status and first error
# line observed. Every row also checks that the protected files (a trace, a Mooncake log, an
# existing report) were not altered, and the summary counts lost or altered files.
# Usage: scripts/reliability_cli.sh [path/to/cpkv] > table.md   (default: build/cli/cpkv)
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cpkv="$(realpath "${1:-$root/build/cli/cpkv}")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
export TMPDIR="$work/tmp"
mkdir -p tmp out_dir bin
cp "$root/traces/samples/tiny.jsonl" T.jsonl
for i in 0 1 2 3; do
  printf '{"timestamp": %d, "input_length": 1500, "output_length": 10, "hash_ids": [%d, %d, %d]}\n' "$i" "$i" $((i + 1)) $((i + 2))
done > L.jsonl
echo "old report" > J.json
ln T.jsonl T_hardlink.json
ln -s /dev/null null_link
ln -s out_dir dir_link
printf '0 1 banana\n' > bad_schedule.txt
printf '{"peer_gbps": 1' > bad_ceilings.json
head -c 150 T.jsonl > truncated.jsonl
: > empty.jsonl
printf '{"timestamp": 0, "input_length": "many"}\n' > bad_log.jsonl
# A stand-in interpreter for the chart rows (CPKV_PYTHON; the configured one may lack matplotlib):
# it "draws" by writing argv[3].
printf '#!/bin/sh\nif [ "$1" = -c ]; then exit 0; fi\nprintf PNG > "$3"\n' > bin/python3
chmod +x bin/python3
stub_python="$work/bin/python3"
long_path="/nonexistent$(printf '/abcdefghi%.0s' $(seq 300))"
protected=(T.jsonl L.jsonl J.json)
sums() { sha256sum "${protected[@]}" 2>/dev/null; }
baseline="$(sums)"
altered=0
rows=0
unexpected=0

# row SUBCOMMAND "input / fault" EXPECTED_STATUS "expected" -- command words...
row() {
  local sub="$1" what="$2" want="$3" expected="$4"
  shift 5
  rm -f PWNED PWNED2
  timeout 120 "$@" > stdout.txt 2> stderr.txt
  local status=$?
  local err
  err="$(head -n 1 stderr.txt | cut -c 1-150 | sed 's/|/\\|/g')"
  local lines
  lines="$(wc -l < stderr.txt)"
  local note=""
  [[ "$status" != "$want" ]] && note=" **UNEXPECTED**" && unexpected=$((unexpected + 1))
  [[ "$want" == 2 && -s stdout.txt ]] && note="$note **stdout not empty**" && unexpected=$((unexpected + 1))
  [[ -e PWNED || -e PWNED2 ]] && note="$note **PWNED created**" && unexpected=$((unexpected + 1))
  if [[ "$(sums)" != "$baseline" ]]; then
    note="$note **protected file altered**"
    altered=$((altered + 1))
    cp "$root/traces/samples/tiny.jsonl" T.jsonl
    echo "old report" > J.json
    baseline="$(sums)"
  fi
  rows=$((rows + 1))
  printf '| %s | %s | %s | exit %s, %s stderr line(s): `%s`%s |\n' "$sub" "$what" "$expected" "$status" "$lines" "${err:-}" "$note"
}

echo "| command | input / fault | expected | observed after the fix |"
echo "|---|---|---|---|"
# plan
row plan "missing trace" 2 "exit 2, names the path" -- "$cpkv" plan /nonexistent/t.jsonl
row plan "trace is a directory" 2 "exit 2, 'is a directory'" -- "$cpkv" plan out_dir
row plan "trace is /dev/null (a device)" 2 "exit 2" -- "$cpkv" plan /dev/null
row plan "empty trace" 2 "exit 2, 'empty'" -- "$cpkv" plan empty.jsonl
row plan "truncated trace line" 2 "exit 2, file:line" -- "$cpkv" plan truncated.jsonl
row plan "--batch -1" 2 "exit 2, range" -- "$cpkv" plan T.jsonl --batch -1
row plan "--batch 99 (not in trace)" 2 "exit 2" -- "$cpkv" plan T.jsonl --batch 99
row plan "--rank 9" 2 "exit 2, range 0..7" -- "$cpkv" plan T.jsonl --rank 9
row plan "--variant bogus" 2 "exit 2" -- "$cpkv" plan T.jsonl --variant bogus
row plan "trace through a pipe (cat T \| plan /dev/stdin)" 0 "exit 0, same plan" -- bash -c 'cat T.jsonl | "$0" plan /dev/stdin' "$cpkv"
row plan "bad trace through a pipe" 2 "exit 2, names /dev/stdin, no spool left" -- bash -c 'printf "{}\n" | "$0" plan /dev/stdin' "$cpkv"
row plan "3000-character path" 2 "exit 2, line cut at ~300 chars" -- "$cpkv" plan "$long_path"
# replay, every backend
row replay "--json T (the trace itself)" 2 "exit 2, same file, T kept" -- "$cpkv" replay T.jsonl --json T.jsonl
row replay "--event-log T (the trace itself)" 2 "exit 2, same file" -- "$cpkv" replay T.jsonl --schedule random --variant staging_direct --event-log T.jsonl
row replay "--json J --variant bogus (J exists)" 2 "exit 2, J kept" -- "$cpkv" replay T.jsonl --json J.json --variant bogus
row replay "--json J --batch 7 (J exists)" 2 "exit 2, J kept" -- "$cpkv" replay T.jsonl --json J.json --batch 7
row replay "--json /dev/full" 2 "exit 2, not a regular file" -- "$cpkv" replay T.jsonl --json /dev/full
row replay "--json /dev/null" 2 "exit 2, not a regular file" -- "$cpkv" replay T.jsonl --json /dev/null
row replay "--json - (stdout)" 2 "exit 2" -- "$cpkv" replay T.jsonl --json -
row replay "--json /dev/stdout" 2 "exit 2" -- "$cpkv" replay T.jsonl --json /dev/stdout
row replay "--json DIR" 2 "exit 2, directory" -- "$cpkv" replay T.jsonl --json out_dir
row replay "--json link to a directory" 2 "exit 2, symbolic link" -- "$cpkv" replay T.jsonl --json dir_link
row replay "--json in a missing folder" 2 "exit 2" -- "$cpkv" replay T.jsonl --json no_dir/r.json
row replay "--json X --event-log X" 2 "exit 2, same file" -- "$cpkv" replay T.jsonl --schedule random --variant staging_direct --json x.json --event-log x.json
row replay "--seed -1" 2 "exit 2" -- "$cpkv" replay T.jsonl --seed -1
row replay "--seed 18446744073709551616" 2 "exit 2, names 2^64-1" -- "$cpkv" replay T.jsonl --seed 18446744073709551616
row replay "--wait-ms-max -1" 2 "exit 2, limit not a 309-digit bound" -- "$cpkv" replay T.jsonl --wait-ms-max -1
row replay "--layers 0" 2 "exit 2" -- "$cpkv" replay T.jsonl --layers 0
row replay "--backend bogus" 2 "exit 2" -- "$cpkv" replay T.jsonl --backend bogus
row replay "malformed --schedule file" 2 "exit 2" -- "$cpkv" replay T.jsonl --schedule bad_schedule.txt
row replay "--ipc-missing-rank 9" 2 "exit 2" -- "$cpkv" replay T.jsonl --ipc-missing-rank 9
row replay "trace via <(cat T), threads" 0 "exit 0, pass" -- bash -c '"$0" replay <(cat T.jsonl) --variant staging_direct --ranks-as threads' "$cpkv"
row replay "overflowing batch, sim" 0 "exit 0, 'batch 2 rejected' on stderr" -- "$cpkv" replay T.jsonl --variant staging_direct --ranks-as threads
row "replay (model)" "--variant bogus" 2 "exit 2" -- "$cpkv" replay T.jsonl --backend model --variant bogus
row "replay (model)" "--mutant bogus" 2 "exit 2" -- "$cpkv" replay T.jsonl --backend model --mutant bogus
row "replay (model)" "--mutant no_barrier" 2 "exit 2, simulator only" -- "$cpkv" replay T.jsonl --backend model --mutant no_barrier
row "replay (model)" "--layers 0" 2 "exit 2" -- "$cpkv" replay T.jsonl --backend model --layers 0
row "replay (model)" "malformed --schedule" 2 "exit 2" -- "$cpkv" replay T.jsonl --backend model --schedule bad_schedule.txt
row "replay (model)" "--peer-gbps inf" 2 "exit 2" -- "$cpkv" replay T.jsonl --backend model --peer-gbps inf
row "replay (model)" "--peer-gbps nan" 2 "exit 2" -- "$cpkv" replay T.jsonl --backend model --peer-gbps nan
row "replay (model)" "--ceilings DIR" 2 "exit 2, directory" -- "$cpkv" replay T.jsonl --backend model --ceilings out_dir
row "replay (model)" "--ceilings truncated JSON" 2 "exit 2" -- "$cpkv" replay T.jsonl --backend model --ceilings bad_ceilings.json
row "replay (model)" "--json hard link to the trace" 2 "exit 2, same file" -- "$cpkv" replay T.jsonl --backend model --json T_hardlink.json
row "replay (model)" "--json J, write fails (ulimit -f 1: files past 1 KiB)" 1 "exit 1, J kept, nothing on stdout" -- bash -c 'ulimit -f 1; trap "" XFSZ; exec "$0" replay T.jsonl --backend model --json J.json' "$cpkv"
row "replay (model)" "trace and --chart named x';touch PWNED;'" 0 "exit 0, no PWNED file" -- env CPKV_PYTHON="$stub_python" bash -c 'cp T.jsonl "x'"'"';touch PWNED;'"'"'.jsonl" && exec "$0" replay "x'"'"';touch PWNED;'"'"'.jsonl" --backend model --chart "c'"'"';touch PWNED2;'"'"'.png"' "$cpkv"
row "replay (model)" "--chart /dev/null" 2 "exit 2" -- "$cpkv" replay T.jsonl --backend model --chart /dev/null
row "replay (model)" "trace through a pipe" 0 "exit 0" -- bash -c 'cat T.jsonl | "$0" replay /dev/stdin --backend model' "$cpkv"
row "replay (model)" "stdin redirected from T, --json T" 2 "exit 2, same file" -- bash -c '"$0" replay /dev/stdin --backend model --json T.jsonl < T.jsonl' "$cpkv"
row "replay (cuda)" "--mutant token_split" 2 "exit 2, simulator only" -- "$cpkv" replay T.jsonl --backend cuda --mutant token_split
row "replay (cuda)" "--schedule random" 2 "exit 2, simulator only" -- "$cpkv" replay T.jsonl --backend cuda --schedule random
row "replay (cuda)" "--json T (the trace itself)" 2 "exit 2, same file" -- "$cpkv" replay T.jsonl --backend cuda --json T.jsonl
# import
row import "-o LOG (the input itself)" 2 "exit 2, same file, LOG kept" -- "$cpkv" import mooncake L.jsonl -o L.jsonl
row import "-o DIR" 2 "exit 2, no .partial left" -- "$cpkv" import mooncake L.jsonl -o out_dir
row import "-o /dev/full" 2 "exit 2, device kept" -- "$cpkv" import mooncake L.jsonl -o /dev/full
row import "-o link to /dev/null" 2 "exit 2, link kept" -- "$cpkv" import mooncake L.jsonl -o null_link
row import "--layers 2147483647 (ulimit -v 512 MiB)" 2 "exit 2, limit 256, no allocation" -- bash -c 'ulimit -v 524288; exec "$0" import mooncake L.jsonl -o o.jsonl --layers 2147483647' "$cpkv"
row import "--cp 9" 2 "exit 2, names --cp" -- "$cpkv" import mooncake L.jsonl -o o.jsonl --cp 9
row import "--page-size 3" 2 "exit 2, names --page-size" -- "$cpkv" import mooncake L.jsonl -o o.jsonl --page-size 3
row import "--pool-pages 3" 2 "exit 2, names --pool-pages" -- "$cpkv" import mooncake L.jsonl -o o.jsonl --pool-pages 3
row import "malformed log line" 2 "exit 2, file:line, no output" -- "$cpkv" import mooncake bad_log.jsonl -o o.jsonl
row import "missing log" 2 "exit 2" -- "$cpkv" import mooncake /nonexistent/log.jsonl -o o.jsonl
row import "log through a pipe" 0 "exit 0" -- bash -c 'cat L.jsonl | "$0" import mooncake /dev/stdin -o piped.jsonl --cp 2 --layers 2' "$cpkv"
# mutants, explore, soak
row mutants "RC_PARAMS=seed=banana" 2 "exit 2, one line" -- env RC_PARAMS=seed=banana "$cpkv" mutants
row mutants "--seed -1" 2 "exit 2" -- "$cpkv" mutants --seed -1
row mutants "--cases 0" 2 "exit 2" -- "$cpkv" mutants --cases 0
row explore "--seconds-max nan" 2 "exit 2" -- "$cpkv" explore --seconds-max nan
row explore "--seconds-max inf" 2 "exit 2" -- "$cpkv" explore --seconds-max inf
row explore "--cp-max 5" 2 "exit 2, range 1..4" -- "$cpkv" explore --cp-max 5
row explore "--variant bogus" 2 "exit 2" -- "$cpkv" explore --variant bogus
row soak "--minutes nan" 2 "exit 2" -- "$cpkv" soak --minutes nan
row soak "--minutes inf" 2 "exit 2" -- "$cpkv" soak --minutes inf
row soak "--minutes -1" 2 "exit 2" -- "$cpkv" soak --minutes -1
row soak "--seed 99999999999999999999" 2 "exit 2" -- "$cpkv" soak --seed 99999999999999999999
row soak "RC_PARAMS=seed=banana" 2 "exit 2, one line" -- env RC_PARAMS=seed=banana "$cpkv" soak --minutes 0.01
# bench (built with the CUDA backend)
if "$cpkv" --help | grep -q bench; then
  row bench "--json T (the trace itself)" 2 "exit 2, same file" -- "$cpkv" bench T.jsonl --json T.jsonl
  row bench "--markdown /dev/full" 2 "exit 2" -- "$cpkv" bench T.jsonl --markdown /dev/full
  row bench "--reps 0" 2 "exit 2" -- "$cpkv" bench T.jsonl --reps 0
  row bench "--cp 9" 2 "exit 2" -- "$cpkv" bench T.jsonl --cp 9
  row bench "no GPU visible" 2 "exit 2, one line" -- "$cpkv" bench T.jsonl
fi
# top level
row cpkv "no subcommand" 2 "exit 2, lists the subcommands" -- "$cpkv"
row cpkv "import without its subcommand" 2 "exit 2, lists mooncake" -- "$cpkv" import
echo
echo "Rows: $rows. Unexpected results: $unexpected. Protected files (trace, log, existing report) lost or altered: $altered."
[[ -z "$(ls -A "$TMPDIR")" ]] && echo "Spool and temporary files left in \$TMPDIR: 0." || echo "Left in \$TMPDIR: $(ls -A "$TMPDIR" | tr '\n' ' ')"
leftovers="$(ls -A "$work" | grep -E '^\.cpkv-|\.partial$' || true)"
echo "Temporary or .partial files left beside the outputs: ${leftovers:-0}."
[[ -c /dev/full && -c /dev/null ]] && echo "/dev/full and /dev/null are still character devices."
