#!/usr/bin/env bash
# The main job: install, build, then plan every bundled trace.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
for trace in "$root"/traces/samples/*.jsonl; do
  echo "== cpkv plan $(basename "$trace")"
  "$BUILD_DIR/cli/cpkv" plan "$trace"
done
