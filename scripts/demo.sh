#!/usr/bin/env bash
# qkv's main job, from a fresh Debian 12 machine: install dependencies, build, reproduce the
# chapter's worked example step by step, run a short attention benchmark, then build a small
# language model, train it on one batch and check its loss from outside.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
echo
build/qkv attend
echo
build/qkv bench attention --seq 512,1024,2048 --ref-max-t 1024
echo
echo "== a small decoder-only language model: init, train 100 AdamW steps on one batch, forward"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/lm.json" <<'JSON'
{"arch": "decoder", "vocab_size": 50, "d_model": 64, "n_heads": 4, "d_ff": 128, "n_layers": 2,
 "norm_first": true, "positional": "rope", "activation": "swiglu", "norm": "rmsnorm"}
JSON
/usr/bin/python3 -c "import numpy as np; x = np.random.default_rng(0).integers(0, 50, (4, 17)); \
np.save('$work/x.npy', x[:, :-1]); np.save('$work/y.npy', x[:, 1:])"
build/qkv init --config "$work/lm.json" --out "$work/lm" --seed 1
build/qkv fit --model "$work/lm" --input "$work/x.npy" --target "$work/y.npy" --steps 100 --lr 3e-3 \
  --out "$work/lm-trained" | tail -1
build/qkv forward --model "$work/lm-trained" --input "$work/x.npy" --target "$work/y.npy" --out "$work/logits.npy"
