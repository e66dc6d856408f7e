#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: install dependencies, build (Release),
# run every test; then build the core tests with AddressSanitizer + UndefinedBehaviorSanitizer
# and run them again; then build the fuzz targets (clang) and run each for a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

scripts/install-deps.sh all
echo "== build (Release)"
scripts/build.sh -DQKV_BUILD_TESTS=ON
# ctest runs tests side by side; OpenMP threads that spin while they wait would then fight over
# the cores (one learning test took 215 s instead of a few). Passive waiting changes no result.
export OMP_WAIT_POLICY=passive
echo "== tests (Release)"
(cd build && ctest --output-on-failure -j "$jobs" --timeout 900)

echo "== pip install . into a virtual environment (the README's command; the module from build/)"
venv=$(mktemp -d)/venv
/usr/bin/python3 -m venv --system-site-packages "$venv"  # Debian's Python (NumPy, PyTorch)
QKV_BUILD_DIR=$PWD/build "$venv/bin/pip" install -q .
(cd "$venv" && "$venv/bin/python" -c 'import numpy as np, qkv, qkv.torch; q = np.ones((4, 8), np.float32);
assert np.allclose(qkv.attention(q, q, q, causal=True), 1); print("import qkv:", qkv.__file__)')
rm -rf "$(dirname "$venv")"

echo "== core tests under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQKV_SANITIZE=ON -DQKV_BUILD_TOOLS=OFF >/dev/null
cmake --build build-asan -j "$jobs" --target test_core test_attention test_kernels_train test_kernels_layers test_kernels_misc \
   test_io test_nn test_train test_checkpoint_kill test_generate test_scheduler test_task test_data test_tokenizer test_hf_tokenizer test_metrics test_viz \
   test_train_json test_train_run test_quant test_chat_template test_json_constraint
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j "$jobs" -L core --timeout 1800)
echo "== fuzz targets (libFuzzer, clang-16, ASan + UBSan): regressions, then 10 s of fuzzing each"
CC=clang-16 CXX=clang++-16 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQKV_FUZZ=ON \
   -DQKV_BUILD_TOOLS=OFF >/dev/null
cmake --build build-fuzz -j "$jobs"
echo "+ (cd build-fuzz && ctest -L fuzz): tests/fuzz/run.sh for each target (longer runs: bench/fuzz.sh)"
(cd build-fuzz && ctest --output-on-failure -j "$jobs" -L fuzz --timeout 600)
grep -h -e '^+ ' -e '^fuzz ' build-fuzz/Testing/Temporary/LastTest.log  # what ran, and its figures
echo "== all tests passed"
