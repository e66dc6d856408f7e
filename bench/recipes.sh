#!/usr/bin/env bash
# The three recipes of BENCHMARKS.md, one after the other on real data from Debian packages:
# English->German translation (Ding), a King James Bible language model, and testament
# classification of KJV verses. Each trains a tiny preset for a bounded time, then scores its
# held-out test split. Usage: bench/recipes.sh [OUT_DIR] (default out/recipes)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/recipes}
QKV=build/qkv
mkdir -p "$OUT"
$QKV data ding --out "$OUT/ding.tsv"
$QKV data kjv --out "$OUT/kjv.txt"
$QKV data kjv-testament --out "$OUT/kjv-testament.tsv"
run() {  # name, then qkv train arguments
  local name=$1; shift
  rm -rf "${OUT:?}/$name"
  local t0=$SECONDS
  $QKV train "$@" --out "$OUT/$name" 2>"$OUT/$name.train.log" | tee "$OUT/$name.summary"
  echo "$name: training command took $((SECONDS - t0)) s wall"
  $QKV eval --model "$OUT/$name" 2>"$OUT/$name.eval.log" | tee -a "$OUT/$name.summary"
}
run ende --task translate --data "$OUT/ding.tsv" --preset tiny --minutes 9 --eval-every 250
run kjv --task lm --data "$OUT/kjv.txt" --preset tiny --minutes 9 --eval-every 250
run testament --task classify --data "$OUT/kjv-testament.tsv" --preset tiny --minutes 4 --eval-every 250
