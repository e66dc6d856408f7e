#!/usr/bin/env bash
# qkv's main job, from a fresh Debian 12 machine: install dependencies, build, show the chapter's
# worked example, then train a small English->German transformer on the Ding dictionary's
# sentence pairs (and, for training only, the German translations of free games' story text) for a
# bounded time, translate sentences held out from training, score the
# held-out test set (BLEU, chrF) and draw a cross-attention map.
#
#   scripts/demo.sh                 # 9 minutes of training (MINUTES=... to change), into out/ende
#   MINUTES=2 OUT=/tmp/ende scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${MINUTES:-9}
OUT=${OUT:-out/ende}
scripts/install-deps.sh main           # the tool and its data; scripts/test.sh installs the rest
scripts/build.sh -DQKV_BUILD_TESTS=OFF  # the tool; scripts/test.sh builds the tests
echo
echo "== the chapter's worked example: one query, three keys, every number"
build/qkv attend | tail -12
echo
echo "== data: whole-sentence English-German pairs from the Ding dictionary (package trans-de-en)"
mkdir -p "$(dirname "$OUT")"
build/qkv data ding --out "$(dirname "$OUT")/ding-en-de.tsv"
echo
echo "== more sentences, for training only: free games' story text in German (the gettext catalogs of"
echo "   Debian's packages of Wesnoth, Cataclysm: DDA, FreeDink and FreedroidRPG: downloaded once with"
echo "   apt-get download, about 580 MB, not installed; 8 MB of catalogs kept)"
scripts/get-game-text.sh "$(dirname "$OUT")/game-text-de"
build/qkv data gettext --out "$(dirname "$OUT")/games-en-de.tsv" "$(dirname "$OUT")"/game-text-de/*.mo
echo
echo "== training a tiny encoder-decoder for $MINUTES minutes (Ctrl-C stops and saves; --resume continues)"
if [ -f "$OUT/checkpoint.safetensors" ]; then
  echo "$OUT already holds a run: continuing it for $MINUTES more minutes"
  build/qkv train --out "$OUT" --resume --minutes "$MINUTES"
else
  # the model: the 2017 encoder-decoder in miniature (2 + 2 post-norm layers, d_model 128, 4 heads,
  # feed-forward 512, sinusoidal positions laid out as Marian's), one 8000-piece vocabulary for
  # both languages in one embedding table; the recipe (BENCHMARKS.md, "The main job"): dropout
  # 0.2, batches of 2500 tokens, the 2017 learning-rate formula at 0.7x with 800 warmup steps
  # (post-norm layers need a gentler peak than the formula's at this width), bf16 products where
  # the CPU has them, and the mean of the last 12 validations' weights (one every 100 steps) if
  # it validates better; each epoch the Ding training sentences and the next half as many
  # of the games' (never validated or tested on; any that repeats a held-out sentence is left out)
  cat > "$(dirname "$OUT")/ende-config.json" <<'JSON'
{"arch": "encoder-decoder", "d_model": 128, "n_heads": 4, "d_ff": 512, "n_encoder_layers": 2,
 "n_decoder_layers": 2, "norm_first": false, "final_norm": false, "positional": "sinusoidal_split_half",
 "scale_embeddings": true, "share_embeddings": true, "tie_embeddings": true, "dropout": 0.2}
JSON
  build/qkv train --task translate --data "$(dirname "$OUT")/ding-en-de.tsv" --out "$OUT" \
    --config "$(dirname "$OUT")/ende-config.json" --vocab 8000 --max-tokens 2500 --max-len 64 --lr 0.7 --warmup 800 \
    --precision auto --average 12 --minutes "$MINUTES" --eval-every 100 \
    --train-only "$(dirname "$OUT")/games-en-de.tsv" --train-only-ratio 0.5
fi
echo
echo "== five held-out sentences (from $OUT/test.tsv): source / reference / qkv"
head -5 "$OUT/test.tsv" > "$OUT/sample.tsv"
cut -f1 "$OUT/sample.tsv" | build/qkv translate --model "$OUT" > "$OUT/sample.out"
paste "$OUT/sample.tsv" "$OUT/sample.out" | while IFS=$'\t' read -r src ref hyp; do
  printf '  en:  %s\n  de:  %s\n  qkv: %s\n\n' "$src" "$ref" "$hyp"
done
echo "== the held-out test set: BLEU and chrF (sacreBLEU's definitions), and an attention map"
build/qkv eval --model "$OUT" --attention-map "$OUT/attention.svg" --hyp-out "$OUT/test.out"
echo
echo "Model, tokenizer, metrics.jsonl and loss curve (loss.svg) are in $OUT; the cross-attention"
echo "map of the first test sentence is $OUT/attention.svg. Try: build/qkv translate --model $OUT"
echo "Take it to Hugging Face transformers: build/qkv export --model $OUT --format hf --out $OUT-hf"
echo "  (a MarianMTModel folder with its tokenizer; qkv translates with it too)"
echo "Serve it over HTTP: build/qkv serve --model $OUT   (then, from another terminal:"
echo "  curl http://127.0.0.1:8080/v1/translations -d '{\"text\": [\"Where is the station?\"]}'  )"
echo
echo "See it at work: build/qkv explore --model $OUT"
echo "  opens the explorer page (http://127.0.0.1:8080/): type a sentence, see its translation and every"
echo "  layer x head of encoder, decoder and cross-attention on it, the chapter's worked example and its"
echo "  claims on live numbers. Without a desktop, open the address it prints (over ssh: ssh -L 8080:127.0.0.1:8080)."
