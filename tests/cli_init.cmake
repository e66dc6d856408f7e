# Fine-tuning and export end to end: qkv train --init (a qkv model directory, a Hugging Face
# folder written by qkv export), a new classification head on an encoder, --resume of a
# fine-tuning run, and the refusals (task against architecture, --init with --config or --resume,
# a tokenizer of another size, an export that does not map).
# Run as: cmake -DQKV=path/to/qkv -DWORK=scratch/dir -P cli_init.cmake
include(${CMAKE_CURRENT_LIST_DIR}/cli_common.cmake)

set(w "${WORK}")
file(REMOVE_RECURSE "${w}")
file(MAKE_DIRECTORY "${w}")

set(words zero one two three four five six seven eight nine)
set(lm "")
set(cls "")
foreach(i RANGE 0 119)
  math(EXPR a "${i} % 10")
  math(EXPR b "(${i} * 7 + 3) % 10")
  list(GET words ${a} wa)
  list(GET words ${b} wb)
  string(APPEND lm "${wa} ${wb} and ${wb} ${wa}.\n")
  math(EXPR parity "${a} % 2")
  if(parity)
    string(APPEND cls "odd\t${wa} ${wb}\n")
  else()
    string(APPEND cls "even\t${wa} ${wb}\n")
  endif()
endforeach()
file(WRITE "${w}/text.txt" "${lm}")
file(WRITE "${w}/labels.tsv" "${cls}")

# a language model trained from scratch, then exported as a Hugging Face gpt2 folder
run_qkv(0 out err --threads 2 train --task lm --data "${w}/text.txt" --out "${w}/lm" --tokenizer byte --steps 24
        --max-len 24 --seed 3)
run_qkv(0 out err export --model "${w}/lm" --format hf --out "${w}/lm-hf")
expect_contains("${out}" "as a Hugging Face gpt2 folder" "export")
expect_file("${w}/lm-hf/config.json" "export")
expect_file("${w}/lm-hf/model.safetensors" "export")
file(READ "${w}/lm-hf/config.json" hf_config)
expect_contains("${hf_config}" "\"model_type\": \"gpt2\"" "export config")

# fine-tuning the qkv directory (its own tokenizer) and the Hugging Face folder (--tokenizer)
run_qkv(0 out err --threads 2 train --task lm --init "${w}/lm" --data "${w}/text.txt" --out "${w}/ft-qkv" --steps 4
        --max-len 24 --seed 3)
expect_contains("${err}" "fine-tuning ${w}/lm" "fine-tune a qkv directory")
run_qkv(0 out err --threads 2 train --task lm --init "${w}/lm-hf" --tokenizer byte --data "${w}/text.txt"
        --out "${w}/ft-hf" --steps 4 --max-len 24 --seed 3 --eval-every 2)
expect_contains("${err}" "fine-tuning ${w}/lm-hf" "fine-tune a Hugging Face folder")
foreach(f config.json model.safetensors qkv_tokenizer.json checkpoint.safetensors train.json)
  expect_file("${w}/ft-hf/${f}" "fine-tuning run")
endforeach()
file(READ "${w}/ft-hf/train.json" tj)
expect_contains("${tj}" "\"init\": \"${w}/lm-hf\"" "train.json records --init")
# the fine-tuned model starts where the exported one was: after 4 steps its validation loss is
# below the trained model's and far below what 4 steps from random weights reach (log 259 = 5.56)
string(REGEX MATCH "best validation loss ([0-9.]+)" m "${out}")
set(ft_loss "${CMAKE_MATCH_1}")
run_qkv(0 out err --threads 2 train --task lm --data "${w}/text.txt" --out "${w}/scratch" --tokenizer byte --steps 4
        --max-len 24 --seed 3)
string(REGEX MATCH "best validation loss ([0-9.]+)" m "${out}")
set(scratch_loss "${CMAKE_MATCH_1}")
if(NOT ft_loss OR NOT scratch_loss OR NOT ft_loss LESS scratch_loss)
  message(FATAL_ERROR "fine-tuning did not start from the trained weights: validation loss ${ft_loss} after 4 steps "
                      "from --init, ${scratch_loss} after 4 steps from random weights")
endif()
message(STATUS "validation loss after 4 steps: ${ft_loss} from --init, ${scratch_loss} from random weights")
run_qkv(0 out err --threads 2 train --out "${w}/ft-hf" --resume --steps 6)
expect_contains("${out}" "trained 2 more steps (6 in all" "resume a fine-tuning run")
run_qkv(0 out err --threads 1 generate --model "${w}/ft-hf" --prompt "one two" --max-len 5)

# a Llama-shaped model with a SentencePiece vocabulary, exported with tokenizer.model and
# tokenizer.json (as Llama-2 / TinyLlama folders carry both): the folder tokenizes as the qkv
# directory does, and with tokenizer.model alone it generates the same text (the text, not only
# the ids: tokenizer.json's ByteFallback decoder writes an invalid byte run as one U+FFFD per byte,
# where SentencePiece decodes the valid characters inside it)
file(WRITE "${w}/llama.json" "{\"arch\": \"decoder\", \"vocab_size\": 300, \"d_model\": 32, \"n_heads\": 4, \
\"n_kv_heads\": 2, \"d_ff\": 48, \"n_layers\": 1, \"positional\": \"rope\", \"norm\": \"rmsnorm\", \
\"norm_first\": true, \"activation\": \"silu\", \"gated\": true, \"bias\": false, \"fused_qkv\": false}")
run_qkv(0 out err --threads 1 train --task lm --data "${w}/text.txt" --out "${w}/sp" --config "${w}/llama.json"
        --vocab 300 --steps 4 --max-len 24)
run_qkv(0 out err export --model "${w}/sp" --out "${w}/sp-hf")
expect_contains("${out}" "tokenizer.model, tokenizer.json, tokenizer_config.json" "llama export with its tokenizer")
foreach(text "one two" "  seven. and\tnine" "zero one two three four five six seven eight nine")
  run_qkv(0 qkv_ids err tokenize --model "${w}/sp" --text "${text}" --ids)
  run_qkv(0 hf_ids err tokenize --model "${w}/sp-hf" --text "${text}" --ids)
  if(NOT qkv_ids STREQUAL hf_ids)
    message(FATAL_ERROR "tokenize '${text}': the exported tokenizer.json gives '${hf_ids}', the qkv directory '${qkv_ids}'")
  endif()
endforeach()
file(REMOVE "${w}/sp-hf/tokenizer.json")
run_qkv(0 qkv_out err --threads 1 generate --model "${w}/sp" --prompt "one two" --max-len 5)
run_qkv(0 hf_out err --threads 1 generate --model "${w}/sp-hf" --prompt "one two" --max-len 5)
if(NOT qkv_out STREQUAL hf_out)
  message(FATAL_ERROR "generate: the llama folder with tokenizer.model wrote '${hf_out}', the qkv directory '${qkv_out}'")
endif()

# a classifier from an encoder: a BERT-shaped masked-LM model, exported as bert, gets a new head
file(WRITE "${w}/bert.json" "{\"arch\": \"encoder-mlm\", \"vocab_size\": 259, \"d_model\": 32, \"n_heads\": 4, \
\"d_ff\": 64, \"n_layers\": 1, \"positional\": \"learned\", \"max_len\": 32, \"final_norm\": false, \
\"embed_norm\": true, \"type_vocab_size\": 2, \"fused_qkv\": false, \"activation\": \"gelu\", \
\"tie_embeddings\": true, \"pad_id\": 0, \"norm_eps\": 1e-12}")
run_qkv(0 out err init --config "${w}/bert.json" --out "${w}/bert" --seed 5)
run_qkv(0 out err export --model "${w}/bert" --out "${w}/bert-hf")
file(READ "${w}/bert-hf/config.json" bert_config)
expect_contains("${bert_config}" "BertForMaskedLM" "bert export")
run_qkv(0 out err --threads 2 train --task classify --init "${w}/bert-hf" --tokenizer byte --data "${w}/labels.tsv"
        --out "${w}/cls" --steps 6 --max-len 24)
expect_contains("${err}" "a new 2-class head (pooler + classifier)" "classifier head")
run_qkv_stdin(0 "${w}/labels.tsv" cls_out err --threads 1 classify --model "${w}/cls")
# and the classifier exports as BertForSequenceClassification, its classes named as trained (they
# were once exported as LABEL_0 / LABEL_1): the exported folder classifies identically
run_qkv(0 out err export --model "${w}/cls" --out "${w}/cls-hf")
file(READ "${w}/cls-hf/config.json" cls_config)
expect_contains("${cls_config}" "BertForSequenceClassification" "classifier export")
expect_contains("${cls_config}" "\"even\"" "classifier export's id2label")
expect_contains("${cls_config}" "\"odd\"" "classifier export's id2label")
run_qkv_stdin(0 "${w}/labels.tsv" cls_hf_out err --threads 1 classify --model "${w}/cls-hf")
expect_not_contains("${cls_hf_out}" "LABEL_" "classify on the exported classifier")
if(NOT cls_out STREQUAL cls_hf_out)
  message(FATAL_ERROR "classify: the exported classifier printed\n${cls_hf_out}\nthe qkv directory\n${cls_out}")
endif()

# refusals, each before anything is written
expect_error("task against architecture" "--task translate fine-tunes an encoder-decoder" train --task translate
             --init "${w}/lm" --data "${w}/labels.tsv" --out "${w}/no1" --steps 1)
expect_error("a decoder as a classifier" "--task classify fine-tunes an encoder" train --task classify
             --init "${w}/lm" --data "${w}/labels.tsv" --out "${w}/no2" --steps 1)
expect_error("--init with --config" "exclude each other" train --task lm --init "${w}/lm" --config "${w}/bert.json"
             --data "${w}/text.txt" --out "${w}/no3" --steps 1)
expect_error("--init with --resume" "--init starts one" train --init "${w}/lm" --out "${w}/ft-hf" --resume --steps 9)
file(WRITE "${w}/small.json" "{\"arch\": \"decoder\", \"vocab_size\": 40, \"d_model\": 16, \"n_heads\": 2, \
\"d_ff\": 32, \"n_layers\": 1, \"positional\": \"learned\", \"max_len\": 32, \"norm_first\": true}")
run_qkv(0 out err init --config "${w}/small.json" --out "${w}/small")
run_qkv(0 out err export --model "${w}/small" --out "${w}/small-hf")
expect_error("a tokenizer of another size" "the tokenizer has 259 tokens but the model's vocab_size is 40" train
             --task lm --init "${w}/small-hf" --tokenizer byte --data "${w}/text.txt" --out "${w}/no4" --steps 1)
expect_error("no tokenizer in a Hugging Face folder" "or give --tokenizer" train --task lm --init "${w}/small-hf"
             --data "${w}/text.txt" --out "${w}/no5" --steps 1)
# weights that are not finite: refused (every step was skipped and the run said "trained")
file(WRITE "${w}/nan.json" "{\"arch\": \"decoder\", \"vocab_size\": 259, \"d_model\": 8, \"n_heads\": 2, \
\"d_ff\": 8, \"n_layers\": 1, \"positional\": \"learned\", \"max_len\": 32, \"norm_first\": true, \"pad_id\": 0}")
run_qkv(0 out err init --config "${w}/nan.json" --out "${w}/nan")
file(READ "${w}/nan/model.safetensors" st HEX)
string(LENGTH "${st}" n)
math(EXPR n "${n} - 8")
string(SUBSTRING "${st}" 0 ${n} st)
string(APPEND st "0000c07f")  # the last float32: NaN
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "\\\\x\\1" st "${st}")
execute_process(COMMAND printf "${st}" OUTPUT_FILE "${w}/nan/model.safetensors" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "writing ${w}/nan/model.safetensors failed")
endif()
expect_error("--init from NaN weights" "--init ${w}/nan: its weights are not finite (" train --task lm
             --init "${w}/nan" --tokenizer byte --data "${w}/text.txt" --out "${w}/no7" --steps 2 --max-len 16)
expect_contains("${last_err}" "holds nan at flat index" "--init from NaN weights")
# a layer count far beyond the folder's tensors, refused at once (it once planned 10^9 layers first)
file(COPY "${w}/small-hf/" DESTINATION "${w}/huge-hf")
file(READ "${w}/huge-hf/config.json" huge)
string(REPLACE "\"n_layer\": 1," "\"n_layer\": 1000000000," huge "${huge}")
file(WRITE "${w}/huge-hf/config.json" "${huge}")
expect_error("--init with n_layer 10^9" "config.json: \"n_layer\" is 1000000000, but" train --task lm
             --init "${w}/huge-hf" --tokenizer byte --data "${w}/text.txt" --out "${w}/no6" --steps 1)
foreach(d no1 no2 no3 no4 no5 no6 no7)
  if(EXISTS "${w}/${d}")
    message(FATAL_ERROR "a refused run wrote ${w}/${d}")
  endif()
endforeach()
file(WRITE "${w}/alibi.json" "{\"arch\": \"decoder\", \"vocab_size\": 40, \"d_model\": 16, \"n_heads\": 2, \
\"d_ff\": 32, \"n_layers\": 1, \"positional\": \"alibi\"}")
run_qkv(0 out err init --config "${w}/alibi.json" --out "${w}/alibi")
expect_error("an export that does not map" "positional = alibi does not map" export --model "${w}/alibi"
             --out "${w}/alibi-hf")
if(EXISTS "${w}/alibi-hf")
  message(FATAL_ERROR "a refused export wrote ${w}/alibi-hf")
endif()
message(STATUS "cli_init: fine-tuning, new heads, resume, export and refusals checked")
