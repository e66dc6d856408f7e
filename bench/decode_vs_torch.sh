#!/usr/bin/env bash
# Decoding at batch 1 on the GPT-2-small shape: qkv (KV cache, greedy) against the memory-
# bandwidth bound measured in the same run, and against PyTorch with its own cache, each in its
# own process. Usage: bench/decode_vs_torch.sh [build/qkv]
set -euo pipefail
cd "$(dirname "$0")/.."
QKV=${1:-build/qkv}
# OpenBLAS's best kernel for the CPU for both (bench/torch_best.py); PyTorch flushes denormals.
export OPENBLAS_CORETYPE=$(/usr/bin/python3 bench/torch_best.py)
echo "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE for both"
q=$("$QKV" bench decode --json)
t=$(/usr/bin/python3 bench/torch_decode.py --json)
/usr/bin/python3 - "$q" "$t" <<'PY'
import json, sys
q, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"qkv {q['tokens_per_s']:.1f} tokens/s = {100 * q['fraction_of_bound']:.0f}% of the bound "
      f"({q['bound_tokens_per_s']:.1f} tokens/s: {q['weight_mib']:.0f} MiB per token at {q['read_bandwidth_gbs']:.1f} GB/s); "
      f"torch {t['torch']} {t['tokens_per_s']:.1f} tokens/s ({t['threads']} threads): qkv/torch = "
      f"{q['tokens_per_s'] / t['tokens_per_s']:.2f}x")
PY
