# Hostile and unusual input to `qkv train` and the files it reads and writes (issue 10): each
# case exits 2 with one error naming the argument, file or key, or trains and says what it did
# differently; nothing is left half-made, no file that is not a regular file is replaced, and no
# FIFO is waited on. Run as: cmake -DQKV=path/to/qkv -DWORK=scratch/dir -P cli_hostile_train.cmake
cmake_minimum_required(VERSION 3.16)
include(${CMAKE_CURRENT_LIST_DIR}/cli_common.cmake)

set(w "${WORK}")
file(REMOVE_RECURSE "${w}")
file(MAKE_DIRECTORY "${w}")

function(expect_missing path what)
  if(EXISTS "${path}")
    message(FATAL_ERROR "${what}: ${path} exists; nothing should have been written")
  endif()
endfunction()
# json_get(var file key...): a value from a JSON file
function(json_get var file)
  file(READ "${file}" j)
  string(JSON v GET "${j}" ${ARGN})
  set(${var} "${v}" PARENT_SCOPE)
endfunction()

# --- small data: digit-word translation pairs, a short text, labelled lines
set(words zero one two three four five six seven eight nine)
set(tsv "")
set(txt "")
set(cls "")
foreach(i RANGE 0 199)
  math(EXPR a "${i} % 10")
  math(EXPR b "(${i} * 7 + 3) % 10")
  list(GET words ${a} wa)
  list(GET words ${b} wb)
  math(EXPR c "${i} / 10")  # so that the 200 pairs are distinct (no near-copy groups)
  string(APPEND tsv "${wa} ${wb} ${c}\t${a}${b} ${c}\n")
  math(EXPR label "${i} % 40")
  string(APPEND cls "L${label}\t${wa} ${wb} ${wa}\n")
endforeach()
foreach(i RANGE 0 19)  # labels seen once: some land in the held-out splits only
  string(APPEND cls "once${i}\tnine eight seven\n")
endforeach()
foreach(i RANGE 0 299)  # 300 short lines: fewer tokens than one window of the preset's 129
  math(EXPR a "${i} % 10")
  list(GET words ${a} wa)
  string(APPEND txt "${wa}\n")
endforeach()
file(WRITE "${w}/pairs.tsv" "${tsv}")
file(WRITE "${w}/short.txt" "${txt}")
file(WRITE "${w}/labels.tsv" "${cls}")
set(quick --tokenizer byte --preset tiny --steps 2)

# --- data options that contradict each other
expect_error("--data with --source" "give either --data FILE or --source and --target files, not both"
             train --task translate --data "${w}/pairs.tsv" --source "${w}/pairs.tsv" --target "${w}/pairs.tsv"
             --out "${w}/both" ${quick})
expect_missing("${w}/both" "--data with --source")
expect_error("--source alone" "--source and --target go together" train --task translate --source "${w}/pairs.tsv"
             --out "${w}/src_only" ${quick})

# --- a FIFO with no writer as data is refused at once, never waited on
execute_process(COMMAND mkfifo "${w}/fifo.tsv" RESULT_VARIABLE rc)
if(rc EQUAL 0)
  expect_error("a FIFO as --data" "fifo.tsv: is a FIFO (named pipe)" train --task translate --data "${w}/fifo.tsv"
               --out "${w}/fifo_run" ${quick})
  expect_missing("${w}/fifo_run" "a FIFO as --data")
  expect_error("a FIFO as --config" "fifo.tsv: config.json is a FIFO (named pipe), not a regular file" train --task translate --data
               "${w}/pairs.tsv" --config "${w}/fifo.tsv" --out "${w}/fifo_cfg" --tokenizer byte --steps 2)
endif()

# --- the learned position table: sized from --max-len; a config's table too small is refused
# before any work, and no directory is left
run_qkv(0 out err train --task lm --data "${w}/short.txt" --out "${w}/lm512" ${quick} --max-len 512)
json_get(ml "${w}/lm512/config.json" max_len)
if(NOT ml EQUAL 512)
  message(FATAL_ERROR "train --task lm --max-len 512: config.json max_len ${ml}, expected 512")
endif()
file(WRITE "${w}/small.json" [=[{"arch": "decoder", "vocab_size": 300, "d_model": 32, "n_heads": 2, "d_ff": 64,
  "n_layers": 1, "positional": "learned", "max_len": 16}]=])
expect_error("--config table below --max-len" "max_len 16 (the learned position table) is below --max-len 64"
             train --task lm --data "${w}/short.txt" --out "${w}/cfg16" --config "${w}/small.json" --max-len 64
             --tokenizer byte --steps 2)
expect_missing("${w}/cfg16" "--config table below --max-len")

# --- small corpora train, saying what was done: a 300-line text shorter than one window, a
# single line, labels that only the validation split has
run_qkv(0 out err train --task lm --data "${w}/short.txt" --out "${w}/lm_short" ${quick})
expect_contains("${err}" "(validation split)" "the note names the split, not the whole file")
expect_contains("${err}" "one window of" "a short validation split is one shorter window")
expect_file("${w}/lm_short/model.safetensors" "a short LM corpus trains")
file(WRITE "${w}/one.txt" "just one line of text\n")
run_qkv(0 out err train --task lm --data "${w}/one.txt" --out "${w}/lm_one" ${quick})
expect_contains("${err}" "too few to hold out a validation split" "one line: no validation split")
expect_contains("${err}" "one window of" "one line: one shorter window")
expect_contains("${out}" "no validation split" "the final line says there was no validation")
expect_missing("${w}/lm_one/test.txt" "no empty test split is written")
run_qkv(0 out err train --task classify --data "${w}/labels.tsv" --out "${w}/cls_rare" ${quick} --valid-fraction 0.3)
expect_contains("${err}" "validation records have labels the training split lacks; left out" "rare labels")
# no held-out splits at all: no empty test file, and eval says what it needs
run_qkv(0 out err train --task translate --data "${w}/pairs.tsv" --out "${w}/nosplit" ${quick}
        --valid-fraction 0 --test-fraction 0)
expect_contains("${out}" "no validation split" "--valid-fraction 0")
expect_missing("${w}/nosplit/test.tsv" "--test-fraction 0")
expect_error("eval without a test split" "has no held-out test split" eval --model "${w}/nosplit")
# held-out splits that leave nothing to train on are refused (not trained with the test split dropped)
expect_error("--valid-fraction 0.5 --test-fraction 0.5"
             "--valid-fraction 0.5 and --test-fraction 0.5 hold out the whole corpus, leaving nothing to train on"
             train --task translate --data "${w}/pairs.tsv" --out "${w}/halves" ${quick} --valid-fraction 0.5
             --test-fraction 0.5)
expect_missing("${w}/halves" "--valid-fraction 0.5 --test-fraction 0.5")

# --- options the run would not use: --preset with --config, --vocab / --spm-type with a given tokenizer
expect_error("--preset with --config" "--preset small and --config ${w}/small.json exclude each other" train --task lm
             --data "${w}/short.txt" --out "${w}/preset_cfg" --config "${w}/small.json" --preset small --max-len 16 --tokenizer byte
             --steps 1)
expect_error("--tokenizer with --vocab" "--vocab 8000 applies to the SentencePiece vocabulary qkv trains, but the tokenizer is given (--tokenizer byte)"
             train --task lm --data "${w}/short.txt" --out "${w}/tok_vocab" --tokenizer byte --vocab 8000 --steps 1)
expect_error("--tokenizer with --spm-type" "--spm-type bpe applies to the SentencePiece vocabulary" train --task lm
             --data "${w}/short.txt" --out "${w}/tok_spm" --tokenizer byte --spm-type bpe --steps 1)
foreach(d preset_cfg tok_vocab tok_spm)
  expect_missing("${w}/${d}" "a refused run")
endforeach()

# --- SentencePiece: a vocabulary too small for the characters says which size is needed; one
# larger than the corpus supports is reported; a file that is not a model is named
# 400 distinct CJK characters (printf writes \\uXXXX as UTF-8): more than a vocabulary of 300
set(fmt "")
foreach(line RANGE 0 39)
  math(EXPR label "${line} % 2")
  string(APPEND fmt "L${label}\\t")
  foreach(k RANGE 0 9)
    math(EXPR cp "19968 + ${line} * 10 + ${k}" OUTPUT_FORMAT HEXADECIMAL)
    string(REPLACE "0x" "" cp "${cp}")
    string(APPEND fmt "\\u${cp}")
  endforeach()
  string(APPEND fmt "\\n")
endforeach()
execute_process(COMMAND printf "${fmt}" OUTPUT_FILE "${w}/cjk.tsv" RESULT_VARIABLE rc)
expect_error("--vocab too small" "--vocab 300 is too small for ${w}/cjk.tsv (training split)"
             train --task classify --data "${w}/cjk.tsv" --out "${w}/v300" --preset tiny --steps 1 --vocab 300)
string(REGEX MATCH "give --vocab ([0-9]+) or more" m "${last_err}")
if(NOT m)
  message(FATAL_ERROR "--vocab too small: no size given in: ${last_err}")
endif()
expect_missing("${w}/v300" "--vocab too small")
run_qkv(0 out err train --task classify --data "${w}/labels.tsv" --out "${w}/v16k" --preset tiny --steps 1
        --vocab 16000)
expect_contains("${err}" "SentencePiece pieces, not the 16000 asked for" "a vocabulary below --vocab is reported")
# a corpus that is one long line (SentencePiece trains on lines of up to 4192 bytes): named, with
# what to do, not "SentencePiece training failed: no reason given"
string(REPEAT "word " 20000 one_line)
file(WRITE "${w}/one_line.txt" "${one_line}\n")
expect_error("a one-line corpus" "one_line.txt (training split): train_sentencepiece: every sentence is longer than"
             train --task lm --data "${w}/one_line.txt" --out "${w}/one_line" --preset tiny --steps 1)
expect_contains("${last_err}" "(--tokenizer byte)" "a one-line corpus")
expect_missing("${w}/one_line" "a one-line corpus")
# a run's tokenizer swapped for one of another size: refused on --resume and when the model is used
# (the smaller one loaded, then failed mid-decoding naming neither)
run_qkv(0 out err train --task lm --data "${w}/short.txt" --out "${w}/spm_run" --preset tiny --vocab 300 --max-len 16
        --steps 2 --eval-every 1)
file(READ "${w}/spm_run/train.json" spm_json)
string(REGEX MATCH "\"tokenizer_vocab\": ([0-9]+)" m "${spm_json}")
if(NOT m OR CMAKE_MATCH_1 LESS_EQUAL 259)
  message(FATAL_ERROR "train.json records no tokenizer_vocab above the byte tokenizer's 259:\n${spm_json}")
endif()
set(spm_vocab "${CMAKE_MATCH_1}")
file(WRITE "${w}/spm_run/qkv_tokenizer.json" "{\"type\": \"byte\"}\n")
expect_error("--resume with a swapped tokenizer"
             "qkv_tokenizer.json: the tokenizer has 259 tokens, but the run started with ${spm_vocab} (train.json's tokenizer_vocab)"
             train --out "${w}/spm_run" --resume --steps 3)
expect_error("generate with a swapped tokenizer"
             "--model ${w}/spm_run: its tokenizer has 259 tokens, but the model was trained with ${spm_vocab}"
             generate --model "${w}/spm_run" --prompt "the")
file(WRITE "${w}/junk.model" "not a model")
expect_error("a file that is not a SentencePiece model" "junk.model: not a SentencePiece model" train --task lm
             --data "${w}/short.txt" --tokenizer "${w}/junk.model" --out "${w}/junk" --steps 1)
expect_not_contains("${last_err}" ".cc(" "no SentencePiece source location in the message")

# --- resume: everything read back is checked
run_qkv(0 out err train --task translate --data "${w}/pairs.tsv" --out "${w}/run" ${quick} --max-tokens 300)
# progress before any validation shows no number for it (it once said "valid nan")
expect_contains("${err}" "step 1 ep 0 loss" "progress line")
expect_contains("${err}" "valid -" "no validation loss yet")
expect_not_contains("${err}" "nan" "progress before the first validation")
expect_error("--resume with --data" "--resume continues with the data the run started with" train --out "${w}/run"
             --resume --steps 4 --data "${w}/pairs.tsv")
file(READ "${w}/run/train.json" train_json)
string(REPLACE "\"max_tokens\": 300" "\"max_tokens\": \"many\"" bad "${train_json}")
if(bad STREQUAL train_json)
  message(FATAL_ERROR "train.json has no \"max_tokens\": 300 to change:\n${train_json}")
endif()
file(WRITE "${w}/run/train.json" "${bad}")
expect_error("train.json with a string for a number" "train.json: \"max_tokens\" is \"many\" (expected 0 or an integer" train
             --out "${w}/run" --resume --steps 4)
string(REPLACE "\"max_tokens\": 300" "\"max_tokens\": 300, \"max_tokens\": 100" bad "${train_json}")
if(bad STREQUAL train_json)
  message(FATAL_ERROR "train.json has no \"max_tokens\": 300 to change:\n${train_json}")
endif()
file(WRITE "${w}/run/train.json" "${bad}")
expect_error("train.json with a key twice" "train.json: duplicate key \"max_tokens\"" train --out "${w}/run"
             --resume --steps 4)
file(WRITE "${w}/run/train.json" "${train_json}")
# options a resumed run would not use are refused by name (they were silently ignored)
expect_error("--resume with --lr, --preset, --vocab"
             "train.json) and its checkpoint's model, learning-rate schedule and tokenizer: --preset, --vocab, --lr would be ignored"
             train --out "${w}/run" --resume --steps 4 --lr 50 --preset base --vocab 300)
expect_error("--resume with --tokenizer" "--tokenizer would be ignored" train --out "${w}/run" --resume --steps 4
             --tokenizer byte)
# train.json naming another data file than the one it recorded (an edit) is refused
string(REPLACE "\"data\": \"${w}/pairs.tsv\"" "\"data\": \"${w}/other.tsv\"" bad "${train_json}")
if(bad STREQUAL train_json)
  message(FATAL_ERROR "train.json has no \"data\": \"${w}/pairs.tsv\" to change:\n${train_json}")
endif()
file(WRITE "${w}/run/train.json" "${bad}")
file(WRITE "${w}/other.tsv" "${tsv}one more\tline\n")
expect_error("train.json naming another data file"
             "train.json names the data ${w}/other.tsv but records the run's data files as ${w}/pairs.tsv" train
             --out "${w}/run" --resume --steps 4)
file(WRITE "${w}/run/train.json" "${train_json}")
# a directory the resumed run cannot write in is refused before training (it trained until its
# first write); root writes anyway, so as root qkv runs as nobody here (setpriv)
execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
set(as_user "")
if(uid STREQUAL "0")
  set(as_user setpriv --reuid=65534 --regid=65534 --clear-groups)
  execute_process(COMMAND ${as_user} test -r "${w}/run/train.json" RESULT_VARIABLE readable)
  if(NOT readable EQUAL 0)
    set(as_user "skip")
  endif()
endif()
if(as_user STREQUAL "skip")
  message(STATUS "--resume into a read-only directory: not checked (root, and nobody cannot read ${w})")
else()
  file(CHMOD "${w}/run" PERMISSIONS OWNER_READ OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  set(qkv_saved "${QKV}")
  set(QKV ${as_user} ${QKV})
  expect_error("--resume into a read-only directory" "--resume: cannot write in ${w}/run (Permission denied)" train
               --out "${w}/run" --resume --steps 4)
  set(QKV "${qkv_saved}")
  file(CHMOD "${w}/run" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ
       WORLD_EXECUTE)
endif()
file(APPEND "${w}/pairs.tsv" "ten\t10\n")
expect_error("the data changed since the run started" "pairs.tsv has changed since the run started" train
             --out "${w}/run" --resume --steps 4)
file(WRITE "${w}/pairs.tsv" "${tsv}")
# a temporary file left by a killed writer (pid 4194304 is above Linux's pid_max) is removed
file(WRITE "${w}/run/checkpoint.safetensors.tmp.4194304.0123456789abcdef" "partial")
run_qkv(0 out err train --out "${w}/run" --resume --steps 4)
expect_contains("${err}" "removed 1 temporary file(s)" "stale temporary files")
# after a resume, progress shows the checkpoint's validation loss, not "nan"
expect_contains("${err}" "step 3 ep" "resumed progress")
expect_not_contains("${err}" "nan" "resumed progress shows the checkpoint's validation loss")
expect_not_contains("${err}" "valid -" "resumed progress shows the checkpoint's validation loss")
expect_missing("${w}/run/checkpoint.safetensors.tmp.4194304.0123456789abcdef" "stale temporary file")
file(READ "${w}/run/task.json" task_json)
file(WRITE "${w}/run/task.json" [=[{"task": "translate", "task": "lm"}]=])
expect_error("task.json with a key twice" "task.json: duplicate key \"task\"" translate --model "${w}/run"
             --input "${w}/pairs.tsv")
file(WRITE "${w}/run/task.json" "${task_json}")

# --- written files: a symbolic link is followed (the link stays), a character device is written
# through (never replaced), a FIFO with no reader and a directory are refused
file(WRITE "${w}/real.tsv" "old")
file(CREATE_LINK "real.tsv" "${w}/link.tsv" SYMBOLIC)
run_qkv(0 out err data kjv-testament --out "${w}/link.tsv")
if(NOT IS_SYMLINK "${w}/link.tsv")
  message(FATAL_ERROR "data --out LINK replaced the symbolic link with a file")
endif()
file(SIZE "${w}/real.tsv" size)
if(size LESS 1000)
  message(FATAL_ERROR "data --out LINK: the link's target was not written (${size} bytes)")
endif()
run_qkv(0 out err data kjv-testament --out /dev/null)
execute_process(COMMAND test -c /dev/null RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "data --out /dev/null: /dev/null is no longer a character device")
endif()
if(EXISTS "${w}/fifo.tsv")
  expect_error("--out a FIFO with no reader" "fifo.tsv: cannot write: it is a FIFO (named pipe) with no reader"
               data kjv-testament --out "${w}/fifo.tsv")
endif()
file(MAKE_DIRECTORY "${w}/adir")
expect_error("--out a directory" "adir: cannot write: it is a directory" data kjv-testament --out "${w}/adir")

# --- input lines: invalid UTF-8 is named by its line, on standard input and from --input
execute_process(COMMAND printf "zero one\\nbad \\377 byte\\n" OUTPUT_FILE "${w}/bad.txt")
expect_error_stdin("invalid UTF-8 on stdin" "standard input, line 2: invalid UTF-8 at byte 5" "${w}/bad.txt"
                   translate --model "${w}/run")
expect_error("invalid UTF-8 in --input" "--input ${w}/bad.txt, line 2: invalid UTF-8 at byte 5" translate
             --model "${w}/run" --input "${w}/bad.txt")

file(REMOVE_RECURSE "${w}")
message(STATUS "qkv train and its files under hostile input: ok")
