#!/usr/bin/env bash
# Training throughput, qkv against PyTorch, in one run on this machine: the GPT-2-small-shaped
# decoder and the 2017 base encoder-decoder, batch 4 x 256 tokens, fwd + bwd + AdamW, each in
# its own process (peak memory is per process).
# Usage: [ROUNDS=3] [STEPS=6] [TORCH_BF16=1] [BASELINE=old/qkv] bench/train_vs_torch.sh [build/qkv]
# qkv runs in float32 and in bf16 (--precision bf16); PyTorch in float32 and under its bf16 autocast.
# BASELINE: another qkv binary (an older commit's build, say) whose float32 runs in each round too,
# first, so that bf16 can be set against the float32 of a given day on this machine.
# PyTorch flushes denormals (torch.set_flush_denormal(True)), its fastest setting on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
QKV=${1:-build/qkv}
STEPS=${STEPS:-6}  # 6 timed steps after a warmup one: 3 were not yet a steady state
threads=$(nproc)
# Best settings for both: all cores; for PyTorch denormals flushed; and OpenBLAS's best kernel
# for the CPU (bench/torch_best.py), for PyTorch's products and qkv's single rows alike.
export OPENBLAS_CORETYPE=$(/usr/bin/python3 bench/torch_best.py)
echo "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE for both; ISA: $(grep -q avx512f /proc/cpuinfo && echo AVX-512 || echo AVX2)"
# This machine's speed drifts by 10-20% from minute to minute (other tenants), so the programs
# take turns: ROUNDS rounds of qkv then PyTorch per model, and the summary gives the median of
# the per-round ratios (each from two runs a minute apart) as well as the lowest.
ROUNDS=${ROUNDS:-3}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
# Each round and model: qkv in float32 and in bf16 (--precision bf16), PyTorch in float32 and
# under its bf16 autocast (TORCH_BF16=0 leaves that out).
TORCH_BF16=${TORCH_BF16:-1}
BASELINE=${BASELINE:-}
if [ -n "$BASELINE" ]; then
  [ -x "$BASELINE" ] || { echo "BASELINE=$BASELINE: not an executable" >&2; exit 2; }
  echo "baseline float32: $BASELINE"
fi
printf '%-6s %-18s %10s %10s %10s %10s %9s %9s %9s\n' round model "qkv f32" "qkv bf16" "torch f32" "torch bf16" \
  "bf16/f32" "bf16/t32" "peak MiB"
for r in $(seq 1 "$ROUNDS"); do
  for m in gpt2-small transformer-base; do
    # the baseline's float32 straight before the bf16 run and qkv's float32 straight after it: each
    # ratio to bf16 comes from neighbouring runs (this machine's speed drifts from minute to minute)
    b=null
    if [ -n "$BASELINE" ]; then b=$("$BASELINE" bench train --model "$m" --steps "$STEPS" --warmup 1 --json); fi
    qb=$("$QKV" bench train --model "$m" --steps "$STEPS" --warmup 1 --precision bf16 --json)
    q=$("$QKV" bench train --model "$m" --steps "$STEPS" --warmup 1 --json)
    t=$(/usr/bin/python3 bench/torch_train.py --model "$m" --steps "$STEPS" --warmup 1 --threads "$threads" --json 2>/dev/null)
    tb=null
    if [ "$TORCH_BF16" = 1 ]; then
      tb=$(/usr/bin/python3 bench/torch_train.py --model "$m" --steps "$STEPS" --warmup 1 --threads "$threads" \
             --autocast-bf16 --json 2>/dev/null)
    fi
    /usr/bin/python3 - "$r" "$m" "$q" "$qb" "$t" "$tb" "$b" "$results" <<'PY'
import json, sys
r, m, q, qb, t, tb, b, out = sys.argv[1], sys.argv[2], *map(json.loads, sys.argv[3:8]), sys.argv[8]
bs = b['tokens_per_s'] if b else float('nan')
tbs = tb['tokens_per_s'] if tb else float('nan')
print(f"{r:<6} {m:<18} {q['tokens_per_s']:10.1f} {qb['tokens_per_s']:10.1f} {t['tokens_per_s']:10.1f} {tbs:10.1f} "
      f"{qb['tokens_per_s'] / q['tokens_per_s']:8.2f}x {qb['tokens_per_s'] / t['tokens_per_s']:8.2f}x "
      f"{q['peak_rss_mib']:.0f}/{qb['peak_rss_mib']:.0f}/{t['peak_rss_mib']:.0f}"
      f"   (qkv f32 {q['est_gflops']:.0f} GFLOP/s = {100 * q['est_gflops'] / q['gemm_ceiling_gflops']:.0f}% of "
      f"{q['gemm_ceiling_gflops']:.0f}; bf16 {qb['est_gflops']:.0f}; bf16 dot products: {qb['bf16_native']}; "
      f"torch {t['threads']} threads, OpenBLAS {t['blas_core']})"
      + (f"\n{'':<6} {'':<18} baseline f32 {bs:.1f} tokens/s: qkv bf16 / baseline f32 {qb['tokens_per_s'] / bs:.2f}x, "
         f"qkv f32 / baseline f32 {q['tokens_per_s'] / bs:.2f}x" if b else ""))
with open(out, "a") as f:
    f.write(json.dumps({"model": m, "qkv": q['tokens_per_s'], "qkv_bf16": qb['tokens_per_s'], "torch": t['tokens_per_s'],
                        "torch_bf16": tbs, "base": bs, "qkv_mib": q['peak_rss_mib'], "qkv_bf16_mib": qb['peak_rss_mib'],
                        "torch_mib": t['peak_rss_mib']}) + "\n")
PY
  done
done
/usr/bin/python3 - "$results" "$ROUNDS" <<'PY'
import json, math, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"over {sys.argv[2]} rounds (medians of tokens/s and of the per-round ratios; highest peak memory):")
for m in dict.fromkeys(r['model'] for r in rows):
    rs = [r for r in rows if r['model'] == m]
    med = lambda f: statistics.median(f(r) for r in rs)
    tb = med(lambda r: r['torch_bf16'])
    print(f"  {m:<18} qkv f32 {med(lambda r: r['qkv']):6.1f}  qkv bf16 {med(lambda r: r['qkv_bf16']):6.1f}  "
          f"torch f32 {med(lambda r: r['torch']):6.1f}  torch bf16 {tb:6.1f} tok/s; "
          f"qkv bf16 / qkv f32 {med(lambda r: r['qkv_bf16'] / r['qkv']):.2f}x, "
          f"qkv f32 / torch f32 {med(lambda r: r['qkv'] / r['torch']):.2f}x, "
          f"qkv bf16 / torch f32 {med(lambda r: r['qkv_bf16'] / r['torch']):.2f}x"
          + ("" if math.isnan(tb) else f", qkv bf16 / torch bf16 {med(lambda r: r['qkv_bf16'] / r['torch_bf16']):.2f}x")
          + ("" if math.isnan(rs[0]['base']) else f", qkv bf16 / baseline f32 {med(lambda r: r['qkv_bf16'] / r['base']):.2f}x"
             f" (baseline f32 {med(lambda r: r['base']):.1f} tok/s)")
          + f"; peak MiB qkv {max(r['qkv_mib'] for r in rs):.0f} (bf16 {max(r['qkv_bf16_mib'] for r in rs):.0f}), "
          f"torch {max(r['torch_mib'] for r in rs):.0f}")
PY
