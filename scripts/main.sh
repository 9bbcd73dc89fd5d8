#!/usr/bin/env bash
# The main job: install, build, then for every bundled trace print its plan and replay it through
# the rank simulator with every exchange variant, checking every byte against the model.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
status=0
for trace in "$root"/traces/samples/*.jsonl; do
  echo "== cpkv plan $(basename "$trace") --batch 0"
  "$BUILD_DIR/cli/cpkv" plan "$trace" --batch 0
  echo "== cpkv replay $(basename "$trace") --backend sim --variant all"
  "$BUILD_DIR/cli/cpkv" replay "$trace" --backend sim --variant all || status=1
done
exit $status
