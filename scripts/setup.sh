#!/usr/bin/env bash
# Installs what is missing (Debian packages), configures and builds. Safe to run again.
# Sourced by scripts/main.sh and scripts/test.sh; BUILD_DIR defaults to ./build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$root/build}"

packages=(build-essential cmake pkg-config libgtest-dev libgmock-dev librapidcheck-dev libboost-dev
          nlohmann-json3-dev libcli11-dev libfmt-dev libbenchmark-dev
          python3-dev pybind11-dev python3-pytest python3-numpy python3-hypothesis python3-torch  # the Python package (python/; torch: the conformance harness)
          python3-matplotlib  # the model replay's --chart (scripts/model_chart.py)
          clang libclang-rt-14-dev)  # clang + libFuzzer: the fuzz targets (scripts/fuzz.sh)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "cpkv setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

jobs="$(nproc 2>/dev/null || echo 2)"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CPKV_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$jobs"
