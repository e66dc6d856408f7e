#!/usr/bin/env bash
# bench/fuzz.sh [SECONDS | --total SECONDS] [TARGET...]: runs the libFuzzer targets of
# tests/fuzz/ (default: all) one at a time, each for SECONDS (default 60), or --total SECONDS
# shared equally among them, and prints per target: time, executions, exec/s, coverage (cov:
# edges, ft: features, from libFuzzer's final status line), corpus size, peak RSS and the files
# of any finding. Builds build-fuzz/ first (clang-16, ASan + UBSan, -DQKV_FUZZ=ON) if needed.
# Corpora persist in build-fuzz/fuzz-long/<target>/corpus, so a second run continues the first;
# findings land in build-fuzz/fuzz-long/<target>/findings/. Exits non-zero if any target found
# something.
set -uo pipefail
cd "$(dirname "$0")/.."
per=60 total=
case "${1:-}" in
  --total) total=${2:?--total needs SECONDS}; shift 2 ;;
  ''|*[!0-9]*) ;;
  *) per=$1; shift ;;
esac

build=build-fuzz
if [ ! -f $build/CMakeCache.txt ]; then
  CC=clang-16 CXX=clang++-16 cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQKV_FUZZ=ON \
    -DQKV_BUILD_TOOLS=OFF ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER} \
    >/dev/null || exit 1
fi
cmake --build $build -j "${JOBS:-$(nproc)}" >/dev/null || { echo "fuzz.sh: build failed: cmake --build $build" >&2; exit 1; }

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  # the list in tests/fuzz/CMakeLists.txt: set(QKV_FUZZ_TARGETS npy safetensors ...)
  targets=($(sed -n '/^set(QKV_FUZZ_TARGETS/,/)/p' tests/fuzz/CMakeLists.txt | tr -d '()' | sed 's/^set QKV_FUZZ_TARGETS//;s/^setQKV_FUZZ_TARGETS//'))
fi
[ -n "$total" ] && per=$(( total / ${#targets[@]} ))
echo "fuzz.sh: ${#targets[@]} targets, ${per}s each, one at a time; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

rc=0 summary=()
for t in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz.sh: no target $t ($bin)" >&2; rc=1; continue; }
  mkdir -p $build/fuzz-long
  tests/fuzz/run.sh "$bin" "$t" "$per" "$build/fuzz-long/$t" | tee $build/fuzz-long/$t.out
  [ "${PIPESTATUS[0]}" -ne 0 ] && rc=1
  summary+=("$(grep '^fuzz ' $build/fuzz-long/$t.out | tail -n 1)")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $rc
