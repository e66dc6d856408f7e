#!/usr/bin/env bash
# Training throughput, qkv against PyTorch, in one run on this machine: the GPT-2-small-shaped
# decoder and the 2017 base encoder-decoder, batch 4 x 256 tokens, fwd + bwd + AdamW, each in
# its own process (peak memory is per process). Usage: bench/train_vs_torch.sh [build/qkv]
set -euo pipefail
cd "$(dirname "$0")/.."
QKV=${1:-build/qkv}
STEPS=${STEPS:-3}
threads=$(nproc)
# PyTorch's best settings: all cores, and OpenBLAS's right kernel if it fell back to Prescott.
core=$(/usr/bin/python3 -c "import torch, ctypes
try:
    h = ctypes.CDLL('libopenblas.so.0'); h.openblas_get_corename.restype = ctypes.c_char_p; print(h.openblas_get_corename().decode())
except OSError: print('unknown')")
if [ "$core" = "Prescott" ] && [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -q avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX; else export OPENBLAS_CORETYPE=Haswell; fi
  echo "PyTorch's OpenBLAS fell back to Prescott: running with OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
fi
printf '%-18s %12s %12s %8s %14s %14s\n' model "qkv tok/s" "torch tok/s" ratio "qkv peak MiB" "torch peak MiB"
for m in gpt2-small transformer-base; do
  q=$("$QKV" bench train --model "$m" --steps "$STEPS" --warmup 1 --json)
  t=$(/usr/bin/python3 bench/torch_train.py --model "$m" --steps "$STEPS" --warmup 1 --threads "$threads" --json 2>/dev/null)
  /usr/bin/python3 - "$m" "$q" "$t" <<'PY'
import json, sys
m, q, t = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(f"{m:<18} {q['tokens_per_s']:12.1f} {t['tokens_per_s']:12.1f} {q['tokens_per_s'] / t['tokens_per_s']:7.2f}x "
      f"{q['peak_rss_mib']:14.0f} {t['peak_rss_mib']:14.0f}   (qkv {q['est_gflops']:.0f} GFLOP/s = "
      f"{100 * q['est_gflops'] / q['gemm_ceiling_gflops']:.0f}% of {q['gemm_ceiling_gflops']:.0f}; torch {t['threads']} threads, "
      f"OpenBLAS {t['blas_core']})")
PY
done
