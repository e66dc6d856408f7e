# The toolkit commands end to end on small data: qkv data, train (translate, lm, classify),
# translate, generate, classify, eval, tokenize, --resume, and bad input giving one clear error.
# Run as: cmake -DQKV=path/to/qkv -DWORK=scratch/dir -P cli_tasks.cmake
include(${CMAKE_CURRENT_LIST_DIR}/cli_common.cmake)

set(w "${WORK}")
file(REMOVE_RECURSE "${w}")
file(MAKE_DIRECTORY "${w}")

# --- data: small corpora written here (120 distinct sentences of number words and their German: learnable, no downloads)
set(words zero one two three four five six seven eight nine)
set(german null eins zwei drei vier fuenf sechs sieben acht neun)
set(tsv "")
set(lm "")
set(cls "")
foreach(i RANGE 0 119)
  math(EXPR a "${i} % 10")
  math(EXPR b "(${i} / 10) % 10")
  math(EXPR c "(${i} * 3 + 1 + ${i} / 100) % 10")
  list(GET words ${a} wa)
  list(GET words ${b} wb)
  list(GET words ${c} wc)
  list(GET german ${a} ga)
  list(GET german ${b} gb)
  list(GET german ${c} gc)
  string(APPEND tsv "${wa} ${wb} ${wc}.\t${ga} ${gb} ${gc}.\n")
  string(APPEND lm "${wa} ${wb} ${wc} and ${wc} ${wb} ${wa}.\n")
  math(EXPR parity "${a} % 2")
  if(parity)
    string(APPEND cls "odd\t${wa} ${wb}\n")
  else()
    string(APPEND cls "even\t${wa} ${wb}\n")
  endif()
endforeach()
file(WRITE "${w}/pairs.tsv" "${tsv}no tab on this line\n\tempty source\n")
file(WRITE "${w}/text.txt" "${lm}")
file(WRITE "${w}/labels.tsv" "${cls}")

# --- translate: byte tokenizer, a few steps; malformed lines are counted and reported
run_qkv(0 out err train --task translate --data "${w}/pairs.tsv" --out "${w}/tr" --tokenizer byte --steps 4
        --max-tokens 512 --eval-every 2 --seed 3)
expect_contains("${err}" "2 malformed lines skipped (first: line 121" "train reports malformed lines")
expect_contains("${out}" "trained 4 steps (" "train summary")
foreach(f config.json model.safetensors qkv_tokenizer.json task.json train.json checkpoint.safetensors metrics.jsonl
          loss.svg test.tsv)
  expect_file("${w}/tr/${f}" "train --task translate")
endforeach()
# the translator (pre-norm, fused q/k/v, split-half sinusoids) exports as a Hugging Face Pegasus
# folder (q/k/v split); that a Pegasus folder computes what transformers does is hf_parity's test
run_qkv(0 out err export --model "${w}/tr" --out "${w}/tr-hf")
expect_contains("${out}" "as a Hugging Face pegasus folder" "export of the translator")
file(READ "${w}/tr-hf/config.json" tr_hf_config)
expect_contains("${tr_hf_config}" "\"model_type\": \"pegasus\"" "the exported translator's config")
# a post-norm translator with interleaved sinusoids and a final norm maps onto neither: the
# export to Marian (the post-norm family) lists every setting that does not map in one error, and
# writes nothing (a fused q/k/v is only a layout: written as q_proj, k_proj, v_proj)
file(WRITE "${w}/post.json" "{\"arch\": \"encoder-decoder\", \"vocab_size\": 40, \"d_model\": 16, \"n_heads\": 2, \
\"d_ff\": 32, \"n_encoder_layers\": 1, \"n_decoder_layers\": 1, \"positional\": \"sinusoidal\", \"final_norm\": true, \
\"norm_first\": false, \"fused_qkv\": true, \"pad_id\": 0, \"bos_id\": 1, \"eos_id\": 2}")
run_qkv(0 out err init --config "${w}/post.json" --out "${w}/post" --seed 5)
run_qkv(2 out err export --model "${w}/post" --out "${w}/post-hf")
foreach(part "2 settings do not map onto Hugging Face's marian: " "positional = sinusoidal (" "final_norm = true (")
  expect_contains("${err}" "${part}" "export lists every unmappable setting")
endforeach()
if(EXISTS "${w}/post-hf")
  message(FATAL_ERROR "a refused export left ${w}/post-hf behind")
endif()
file(READ "${w}/tr/loss.svg" curve)
expect_contains("${curve}" "with dropout 0.1 and label smoothing 0.1" "loss.svg says how the training loss is taken")
expect_contains("${curve}" "validation loss: plain cross-entropy on the validation split, no dropout" "loss.svg caption")
# --resume continues the same run; a second run into the same --out without it is refused
run_qkv(0 out err train --out "${w}/tr" --resume --steps 6)
expect_contains("${out}" "trained 2 more steps (6 in all" "train --resume")
run_qkv(0 out err train --out "${w}/tr" --resume --steps 6)
expect_contains("${out}" "nothing to do: the run in ${w}/tr is already at step 6" "train --resume at its limit")
run_qkv(2 out err train --task translate --data "${w}/pairs.tsv" --out "${w}/tr" --tokenizer byte --steps 2)
expect_contains("${err}" "already holds a training run" "train into a used --out")
# --subword-alpha: each epoch's training pairs segmented afresh by SentencePiece's sampling; kept
# in train.json, so --resume continues with it; refused where it cannot run
run_qkv(0 out err train --task translate --data "${w}/pairs.tsv" --out "${w}/sw" --vocab 300 --steps 5
        --max-tokens 4096 --seed 3 --subword-alpha 0.2)
expect_contains("${out}" "trained 5 steps (" "train --subword-alpha")
file(READ "${w}/sw/train.json" sw_json)
expect_contains("${sw_json}" "\"subword_alpha\": 0.2" "train.json keeps --subword-alpha")
run_qkv(0 out err train --out "${w}/sw" --resume --steps 7)
expect_contains("${out}" "trained 2 more steps (7 in all" "train --resume with --subword-alpha")
# the learner's path out of qkv: a translator (with its SentencePiece tokenizer) as a Hugging
# Face Pegasus folder, which qkv loads back and translates with the same output: sampled, so
# that the same text needs the same distributions at every step
run_qkv(0 out err train --task translate --data "${w}/pairs.tsv" --out "${w}/rt" --vocab 300 --steps 60
        --max-tokens 4096 --seed 3)
run_qkv(0 out err export --model "${w}/rt" --format hf --out "${w}/rt-hf")
expect_contains("${out}" "as a Hugging Face pegasus folder: ${w}/rt-hf/ config.json, model.safetensors, tokenizer.model"
                "export of a SentencePiece translator")
file(WRITE "${w}/rt-src.txt" "one two three.\nseven eight nine.\nfive five zero.\n")
# same_translations(model folder family): the model and its exported folder translate the three
# sentences alike, sampled, so that the same text needs the same distributions at every step
function(same_translations model folder family)
  run_qkv(0 own err translate --model "${model}" --input "${w}/rt-src.txt" --sample --seed 11 --temperature 0.8
          --max-len 12)
  run_qkv(0 hf err translate --model "${folder}" --input "${w}/rt-src.txt" --sample --seed 11 --temperature 0.8
          --max-len 12)
  if(NOT own MATCHES "(null|eins|zwei|drei|vier|fuenf|sechs|sieben|acht|neun)")
    message(FATAL_ERROR "${model}, trained for the export check, says nothing German: ${own}")
  endif()
  if(NOT own STREQUAL hf)
    message(FATAL_ERROR "the exported ${family} folder translates otherwise:\n${own}\nagainst\n${hf}")
  endif()
endfunction()
same_translations("${w}/rt" "${w}/rt-hf" Pegasus)
# the main job's translator (scripts/demo.sh's model config, read from the script: post-norm, no
# final norms, a fused q/k/v) exports as a Hugging Face Marian folder, which qkv loads back and
# translates with the same output (sampled, as above)
file(READ "${CMAKE_CURRENT_LIST_DIR}/../scripts/demo.sh" demo_sh)
if(NOT demo_sh MATCHES "<<'JSON'\n([^\n]+\n[^\n]+\n[^\n]+)\nJSON")
  message(FATAL_ERROR "scripts/demo.sh: no model config (a heredoc <<'JSON' ... JSON) found")
endif()
file(WRITE "${w}/demo-config.json" "${CMAKE_MATCH_1}")
run_qkv(0 out err train --task translate --data "${w}/pairs.tsv" --out "${w}/mt" --config "${w}/demo-config.json"
        --vocab 300 --steps 60 --max-tokens 4096 --max-len 64 --lr 0.7 --warmup 20 --seed 3)
run_qkv(0 out err export --model "${w}/mt" --format hf --out "${w}/mt-hf")
expect_contains("${out}" "as a Hugging Face marian folder: ${w}/mt-hf/ config.json, model.safetensors"
                "export of the main job's translator")
file(READ "${w}/mt-hf/config.json" mt_hf_config)
expect_contains("${mt_hf_config}" "\"model_type\": \"marian\"" "the exported translator's config")
same_translations("${w}/mt" "${w}/mt-hf" Marian)
# (the demo's config leaves vocab_size out: the tokenizer's size is the model's; a config that
# states another size is told so)
file(READ "${w}/mt/config.json" mt_config)
expect_contains("${mt_config}" "\"vocab_size\": 300" "the demo config's model, vocab_size from --vocab 300")
file(WRITE "${w}/vs-config.json" "{\"arch\": \"encoder-decoder\", \"d_model\": 32, \"n_heads\": 2, \"d_ff\": 64, \"n_encoder_layers\": 1, \"n_decoder_layers\": 1, \"vocab_size\": 9999}")
run_qkv(0 out err train --task translate --data "${w}/pairs.tsv" --out "${w}/vs" --config "${w}/vs-config.json"
        --vocab 300 --steps 1)
expect_contains("${err}" "note: ${w}/vs-config.json says vocab_size 9999; the model has the tokenizer's 300"
                "a --config whose vocab_size is not the tokenizer's")
file(WRITE "${w}/vs-bad.json" "{\"arch\": \"encoder-decoder\", \"d_model\": 32, \"n_heads\": 2, \"d_ff\": 64, \"n_encoder_layers\": 1, \"n_decoder_layers\": 1, \"vocab_size\": \"8000\"}")
expect_error("a --config whose vocab_size is a string" "vs-bad.json: \"vocab_size\" is \"8000\" (expected a positive integer, or leave it out)"
             train --task translate --data "${w}/pairs.tsv" --out "${w}/vs-bad" --config "${w}/vs-bad.json" --vocab 300 --steps 1)
# the folder's tokenizer.json ends a source with </s>, as qkv's encoder reads it (Hugging Face's
# tokenizer(text) adds the special tokens by default)
run_qkv(0 own err tokenize --model "${w}/mt" --ids --text "seven eight nine.")
run_qkv(0 hf err tokenize --model "${w}/mt-hf" --ids --special --text "seven eight nine.")
run_qkv(0 hf_pieces err tokenize --model "${w}/mt-hf" --special --text "seven eight nine.")
string(STRIP "${own}" own)
if(NOT hf MATCHES "^${own} [0-9]+\n?$" OR NOT hf_pieces MATCHES ":</s>\n?$")
  message(FATAL_ERROR "the exported Marian folder's source is not qkv's then </s>: ${own} against ${hf} (${hf_pieces})")
endif()
expect_error("--subword-alpha with the byte tokenizer" "a byte tokenizer cannot sample segmentations"
             train --task translate --data "${w}/pairs.tsv" --out "${w}/sw2" --tokenizer byte --steps 1
             --subword-alpha 0.1)
expect_error("--subword-alpha above 1" "--subword-alpha" train --task translate --data "${w}/pairs.tsv"
             --out "${w}/sw3" --steps 1 --subword-alpha 1.5)
expect_error("--subword-alpha for a language model" "subword sampling is for --task translate"
             train --task lm --data "${w}/text.txt" --out "${w}/sw4" --vocab 300 --max-len 16 --steps 1
             --subword-alpha 0.1)
# --train-only: more pairs for training only; near-copies of held-out pairs (case and punctuation
# aside) are left out. The extra file holds the corpus's 120 pairs upper-cased without their full
# stops, and 3 new pairs: of these 123, the 4 that copy a validation or test pair are left out.
string(TOUPPER "${tsv}" extra)
string(REPLACE ".\t" "\t" extra "${extra}")
string(REPLACE ".\n" "\n" extra "${extra}")
string(APPEND extra "ten\tzehn\neleven\telf\ntwelve\tzwoelf\n")
file(WRITE "${w}/extra.tsv" "${extra}")
run_qkv(0 out err train --task translate --data "${w}/pairs.tsv" --train-only "${w}/extra.tsv" --out "${w}/tx"
        --tokenizer byte --steps 2 --max-tokens 512 --seed 3)
expect_contains("${err}" "--train-only: 119 records added to the training split, 4 left out as near-copies"
                "train --train-only")
expect_contains("${err}" "235 training pairs" "train --train-only counts")
run_qkv(0 out err train --out "${w}/tx" --resume --steps 3)
expect_contains("${out}" "trained 1 more step (3 in all" "train --resume with --train-only")
run_qkv(2 out err train --out "${w}/tx" --resume --steps 4 --train-only "${w}/extra.tsv")
expect_contains("${err}" "--train-only" "train --resume refuses new data")
file(APPEND "${w}/extra.tsv" "thirteen\tdreizehn\n")
run_qkv(2 out err train --out "${w}/tx" --resume --steps 4)
expect_contains("${err}" "extra.tsv has changed since the run started" "train --resume with edited --train-only data")
run_qkv(2 out err train --task translate --data "${w}/pairs.tsv" --train-only "${w}/none.tsv" --out "${w}/ty"
        --tokenizer byte --steps 2)
expect_contains("${err}" "none.tsv: no such file" "train --train-only missing file")
# translate: stdin and --input, an attention map; eval: BLEU and chrF on the held-out split
file(WRITE "${w}/src.txt" "one two three.\nnine.\n")
run_qkv_stdin(0 "${w}/src.txt" out err translate --model "${w}/tr" --max-len 12 --attention-map "${w}/tr/map.svg")
expect_file("${w}/tr/map.svg" "translate --attention-map")
string(REGEX MATCHALL "\n" nl "${out}")
list(LENGTH nl lines)
if(NOT lines EQUAL 2)
  message(FATAL_ERROR "translate: expected 2 output lines, got ${lines}:\n${out}")
endif()
run_qkv(0 out err translate --model "${w}/tr" --input "${w}/src.txt" --beam 1 --max-len 8)
run_qkv(0 out err eval --model "${w}/tr" --max-len 12 --beam 2)
expect_contains("${out}" "BLEU = " "eval prints BLEU")
expect_contains("${out}" "chrF2 = " "eval prints chrF")
expect_contains("${out}" "tok:13a" "eval prints the BLEU signature")

# --- language model: SentencePiece trained on the data, generate, eval perplexity
run_qkv(0 out err train --task lm --data "${w}/text.txt" --out "${w}/lm" --vocab 300 --max-len 16 --steps 3
        --max-tokens 128)
# --precision bf16: named at the start, kept in train.json and the checkpoint, kept on --resume
# (which refuses another --precision); qkv plot draws both runs' curves in one chart
run_qkv(0 out err train --task lm --data "${w}/text.txt" --out "${w}/lm16" --vocab 300 --max-len 16 --steps 3
        --max-tokens 128 --eval-every 2 --precision bf16)
expect_contains("${err}" "bf16" "train --precision bf16 names its products")
file(READ "${w}/lm16/train.json" tj)
expect_contains("${tj}" "\"precision\": \"bf16\"" "train.json records the precision")
run_qkv(0 out err train --out "${w}/lm16" --resume --steps 5)
expect_contains("${err}" "bf16" "--resume keeps the checkpoint's precision")
expect_contains("${out}" "trained 2 more steps (5 in all" "train --resume in bf16")
expect_error("resume with another precision" "--precision would be ignored" train --out "${w}/lm16" --resume --steps 6
             --precision f32)
expect_error("unknown precision" "--precision" train --task lm --data "${w}/text.txt" --out "${w}/lm17" --precision fp16)
run_qkv(0 out err plot "float32=${w}/lm" "${w}/lm16" --out "${w}/runs.svg" --smooth 2 --title "f32 against bf16")
expect_contains("${out}" "wrote ${w}/runs.svg: 4 curves from 2 runs" "plot")
file(READ "${w}/runs.svg" svg)
foreach(needle "<svg" "float32 (train)" "float32 (validation)" "lm16 (train)" "lm16 (validation)" "f32 against bf16")
  expect_contains("${svg}" "${needle}" "plot's chart")
endforeach()
file(WRITE "${w}/train_only.jsonl" "{\"step\": 1, \"loss\": 2.5}\n\n{\"step\": 2, \"loss\": null}\n")
run_qkv(0 out err plot "${w}/train_only.jsonl" --out "${w}/one.svg" --what train --linear)
expect_error("plot: a run without validation losses" "no validation losses" plot "${w}/train_only.jsonl"
             --out "${w}/x.svg")
file(WRITE "${w}/bad_metrics.jsonl" "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 0, \"loss\": 1}\n")
expect_error("plot: a bad metrics line" "bad_metrics.jsonl line 2: expected an object with an integer \"step\" >= 1"
             plot "${w}/bad_metrics.jsonl" --out "${w}/x.svg")
expect_error("plot: a missing run" "nowhere" plot "${w}/nowhere" --out "${w}/x.svg")
if(EXISTS "${w}/x.svg")
  message(FATAL_ERROR "plot wrote ${w}/x.svg although it failed")
endif()
run_qkv(0 out err tokenize --model "${w}/lm" --text "one two three")
expect_contains("${out}" "tokens:" "tokenize")
run_qkv(0 a err generate --model "${w}/lm" --prompt "one two" --max-len 6 --sample --seed 5 --top-k 20)
run_qkv(0 b err generate --model "${w}/lm" --prompt "one two" --max-len 6 --sample --seed 5 --top-k 20)
if(NOT a STREQUAL b)
  message(FATAL_ERROR "generate: the same seed gave different samples:\n${a}\n${b}")
endif()
expect_contains("${a}" "one two" "generate echoes the prompt")
run_qkv(0 out err generate --model "${w}/lm" --prompt "one" --max-len 4 --attention-map "${w}/lm/self.svg")
expect_file("${w}/lm/self.svg" "generate --attention-map")
run_qkv(0 out err eval --model "${w}/lm")
expect_contains("${out}" "perplexity" "eval on a language model")

# --- classification
run_qkv(0 out err train --task classify --data "${w}/labels.tsv" --out "${w}/cls" --tokenizer byte --steps 3
        --max-tokens 256)
file(WRITE "${w}/cls_in.txt" "one two\nthree three\n")
run_qkv_stdin(0 "${w}/cls_in.txt" out err classify --model "${w}/cls")
string(REGEX MATCH "^(odd|even)\t" first "${out}")
if(NOT first)
  message(FATAL_ERROR "classify: expected a label per line, got:\n${out}")
endif()
run_qkv(0 out err eval --model "${w}/cls")
expect_contains("${out}" "accuracy" "eval on a classifier")

# an existing SentencePiece .model as the tokenizer: the new model's vocabulary is that model's
run_qkv(0 out err train --task classify --data "${w}/labels.tsv" --out "${w}/cls_spm" --tokenizer "${w}/lm/tokenizer.model"
        --steps 1 --max-tokens 256)
file(READ "${w}/lm/config.json" lm_cfg)
file(READ "${w}/cls_spm/config.json" spm_cfg)
string(REGEX MATCH "\"vocab_size\": [0-9]+" v1 "${lm_cfg}")
string(REGEX MATCH "\"vocab_size\": [0-9]+" v2 "${spm_cfg}")
if(NOT v1 STREQUAL v2)
  message(FATAL_ERROR "train --tokenizer FILE.model: vocabulary '${v2}', expected the model's '${v1}'")
endif()

# --- bad input: one clear error each, exit code 2
run_qkv(2 out err train --task translate --data "${w}/missing.tsv" --out "${w}/x1" --steps 1)
expect_contains("${err}" "missing.tsv" "missing data file")
file(WRITE "${w}/empty.tsv" "")
run_qkv(2 out err train --task translate --data "${w}/empty.tsv" --out "${w}/x2" --steps 1)
expect_contains("${err}" "empty.tsv" "empty corpus")
file(WRITE "${w}/bad.tsv" "only one column\nanother\n")
run_qkv(2 out err train --task classify --data "${w}/bad.tsv" --out "${w}/x3" --steps 1)
expect_contains("${err}" "bad.tsv" "corpus of malformed lines")
run_qkv(2 out err train --task lm --data "${w}/text.txt" --out "${w}/x4")
expect_contains("${err}" "give a limit" "train without a limit")
run_qkv_stdin(2 "${w}/src.txt" out err translate --model "${w}/lm")
expect_contains("${err}" "trained for --task lm" "translate with a language model")
run_qkv(2 out err generate --model "${w}/nowhere" --prompt "x")
expect_contains("${err}" "nowhere" "generate with a missing model")
# a model directory whose config.json does not match its weights
file(MAKE_DIRECTORY "${w}/mixed")
foreach(f model.safetensors qkv_tokenizer.json task.json)
  file(COPY "${w}/lm/${f}" DESTINATION "${w}/mixed")
endforeach()
file(READ "${w}/lm/config.json" cfg)
string(REGEX REPLACE "\"d_ff\": [0-9]+" "\"d_ff\": 24" cfg "${cfg}")
file(WRITE "${w}/mixed/config.json" "${cfg}")
run_qkv(2 out err generate --model "${w}/mixed" --prompt "one")
expect_contains("${err}" "linear1.weight" "weights from a different config name the tensor")
# invalid UTF-8 input names the byte offset
execute_process(COMMAND printf "caf\\351\\n" OUTPUT_FILE "${w}/bad_utf8.txt")
run_qkv_stdin(2 "${w}/bad_utf8.txt" out err tokenize --model "${w}/lm")
expect_contains("${err}" "UTF-8" "tokenize rejects invalid UTF-8")
# --- the real corpora from Debian packages (installed by scripts/install-deps.sh)
run_qkv(0 out err data ding --out "${w}/ding.tsv" --phrases "${w}/phrases.tsv")
expect_contains("${out}" "sentence pairs" "data ding")
expect_contains("${out}" "word and phrase pairs" "data ding --phrases")
file(STRINGS "${w}/ding.tsv" ding_lines)
list(LENGTH ding_lines n)
if(n LESS 15000)
  message(FATAL_ERROR "data ding: only ${n} pairs")
endif()
file(STRINGS "${w}/phrases.tsv" phrase_lines LIMIT_COUNT 1000000)
list(LENGTH phrase_lines n)
if(n LESS 500000)
  message(FATAL_ERROR "data ding --phrases: only ${n} pairs")
endif()
run_qkv(0 out err data kjv-testament --out "${w}/kjv.tsv")
expect_contains("${out}" "31102 verses" "data kjv-testament")
run_qkv(2 out err data ding --out "${w}/ding2.tsv" --dict "${w}/nothing")
# gettext catalogs compiled by GNU msgfmt (Debian's gettext, installed by scripts/install-deps.sh)
find_program(MSGFMT msgfmt REQUIRED)
file(WRITE "${w}/wz.po" "msgid \"\"\nmsgstr \"Content-Type: text/plain; charset=UTF-8\\n\"\n\n"
     "msgid \"<i>We must hurry.</i> The orcs are near!\"\nmsgstr \"<i>Wir müssen uns beeilen.</i> Die Orks sind nah!\"\n\n"
     "msgid \"Gold: $gold\"\nmsgstr \"Gold: $gold\"\n")
execute_process(COMMAND "${MSGFMT}" -o "${w}/wz.mo" "${w}/wz.po" RESULT_VARIABLE rc)
file(WRITE "${w}/one.po" "msgid \"Aye\"\nmsgstr \"Jawohl\"\n")  # one message of one word: no sentence
execute_process(COMMAND "${MSGFMT}" -o "${w}/one.mo" "${w}/one.po" RESULT_VARIABLE rc2)
if(NOT rc EQUAL 0 OR NOT rc2 EQUAL 0)
  message(FATAL_ERROR "msgfmt failed (${rc}, ${rc2})")
endif()
run_qkv(0 out err data gettext --out "${w}/wz.tsv" "${w}/wz.mo")
expect_contains("${out}" "wrote 2 sentence pairs (English<TAB>translation" "data gettext")
file(READ "${w}/wz.tsv" tsv)
if(NOT tsv STREQUAL "We must hurry.\tWir müssen uns beeilen.\nThe orcs are near!\tDie Orks sind nah!\n")
  message(FATAL_ERROR "data gettext wrote: ${tsv}")
endif()
run_qkv(0 out err data gettext --reverse --out "${w}/wz_de_en.tsv" "${w}/wz.mo")
file(READ "${w}/wz_de_en.tsv" tsv)
if(NOT tsv MATCHES "^Wir müssen uns beeilen.\tWe must hurry.\n")
  message(FATAL_ERROR "data gettext --reverse wrote: ${tsv}")
endif()
expect_error("data gettext on a TSV" "ding.tsv: not a compiled gettext catalog (.mo)"
             data gettext --out "${w}/never.tsv" "${w}/ding.tsv")
expect_error("data gettext on a catalog without sentences" "no sentence pair in the 1 message of 1 catalog"
             data gettext --out "${w}/never.tsv" "${w}/one.mo")
if(EXISTS "${w}/never.tsv")
  message(FATAL_ERROR "data gettext wrote a file although it failed")
endif()
foreach(cmd train translate generate classify eval tokenize data)
  run_qkv(0 out err ${cmd} --help)
endforeach()
message(STATUS "cli_tasks: all checks passed")
