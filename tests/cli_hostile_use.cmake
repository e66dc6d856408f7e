# Hostile input at the command line (issue 10): bad input gets one clear error naming the
# argument, file or key and what was expected, and exit code 2; never a crash, a hang, a silent
# default or a wrong answer. Run as: cmake -DQKV=path/to/qkv -DWORK=scratch/dir -P cli_hostile_use.cmake
cmake_minimum_required(VERSION 3.16)  # this script's policies (empty list elements kept, quoted if() arguments)
include(${CMAKE_CURRENT_LIST_DIR}/cli_common.cmake)

set(w "${WORK}")
file(REMOVE_RECURSE "${w}")
file(MAKE_DIRECTORY "${w}")

# write_npy(path descr shape bytes): a .npy file, version 1.0, `bytes` as printf escapes (\xHH).
function(write_npy path descr shape bytes)
  set(dict "{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }")
  string(LENGTH "${dict}" n)
  math(EXPR pad "63 - (10 + ${n}) % 64")  # magic + version + length + dict + pad + newline = 64 k
  string(REPEAT " " ${pad} spaces)
  math(EXPR hlen "${n} + ${pad} + 1")
  math(EXPR lo "${hlen} % 256" OUTPUT_FORMAT HEXADECIMAL)
  math(EXPR hi "${hlen} / 256" OUTPUT_FORMAT HEXADECIMAL)
  string(REPLACE "0x" "" lo "${lo}")
  string(REPLACE "0x" "" hi "${hi}")
  execute_process(COMMAND printf "\\x93NUMPY\\x01\\x00\\x${lo}\\x${hi}%s\\n${bytes}" "${dict}${spaces}"
                  OUTPUT_FILE "${path}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "write_npy ${path}: printf failed")
  endif()
endfunction()
# float32 values as bytes: a cycle through seven exact ones, started at `first`, stepped by `step`
function(float_bytes var count first step)
  set(f "\\x00\\x00\\x80\\x3f;\\x00\\x00\\x00\\x3f;\\x00\\x00\\x80\\xbf;\\x00\\x00\\x00\\x40;\\x00\\x00\\x80\\x3e;\\x00\\x00\\x00\\xbf;\\x00\\x00\\xc0\\x3f")
  set(out "")
  set(i ${first})
  foreach(k RANGE 1 ${count})
    math(EXPR j "${i} % 7")
    list(GET f ${j} b)
    string(APPEND out "${b}")
    math(EXPR i "${i} + ${step}")
  endforeach()
  set(${var} "${out}" PARENT_SCOPE)
endfunction()
# int64 ids (0 .. 65535) as bytes
function(id_bytes var)
  set(out "")
  foreach(id ${ARGN})
    set(b "")
    foreach(part "${id} % 256" "${id} / 256")
      math(EXPR h "${part}" OUTPUT_FORMAT HEXADECIMAL)
      string(REPLACE "0x" "" h "${h}")
      string(LENGTH "${h}" len)
      if(len LESS 2)
        set(h "0${h}")
      endif()
      string(APPEND b "\\x${h}")
    endforeach()
    string(APPEND out "${b}\\x00\\x00\\x00\\x00\\x00\\x00")
  endforeach()
  set(${var} "${out}" PARENT_SCOPE)
endfunction()

# --- every numeric option of every command, found in the --help texts: NaN, infinity, overflow,
# words and fractions are refused by the one shared validator, naming the option
run_qkv(0 top err --help)
string(REGEX MATCH "Subcommands:.*" section "${top}")
string(REGEX MATCHALL "\n  [a-z][a-z-]*" names "${section}")
set(commands "")
foreach(n ${names})
  string(STRIP "${n}" n)
  run_qkv(0 help err ${n} --help)
  if(help MATCHES "Subcommands:")
    string(REGEX MATCH "Subcommands:.*" sub "${help}")
    string(REGEX MATCHALL "\n  [a-z][a-z-]*" subs "${sub}")
    foreach(s ${subs})
      string(STRIP "${s}" s)
      list(APPEND commands "${n} ${s}")
    endforeach()
  else()
    list(APPEND commands "${n}")
  endif()
endforeach()
set(floats 0)
set(ints 0)
set(uints 0)
foreach(cmd "" ${commands})
  separate_arguments(cmd_args UNIX_COMMAND "${cmd}")
  run_qkv(0 help err ${cmd_args} --help)
  string(REGEX MATCHALL "\n +(-[a-zA-Z],)?--[a-z0-9-]+ (FLOAT|INT|UINT)" opts "${help}")
  foreach(o ${opts})
    string(REGEX REPLACE ".*(--[a-z0-9-]+) (FLOAT|INT|UINT)$" "\\1" name "${o}")
    string(REGEX REPLACE ".* (FLOAT|INT|UINT)$" "\\1" type "${o}")
    if(type STREQUAL "FLOAT")
      math(EXPR floats "${floats} + 1")
      set(bad "nan|'nan' is not a finite number" "inf|'inf' is not a finite number" "-inf|'-inf' is not a finite number"
              "1e999|'1e999' is beyond the range of a double" "abc|'abc' is not a number")
    elseif(type STREQUAL "INT")
      math(EXPR ints "${ints} + 1")
      set(bad "abc|'abc' is not a number" "1.5|'1.5' is not a whole number" "nan|'nan' is not a whole number"
              "99999999999999999999|'99999999999999999999' is out of range")
    else()
      math(EXPR uints "${uints} + 1")
      set(bad "-1|'-1' is out of range" "18446744073709551616|'18446744073709551616' is out of range"
              "abc|'abc' is not a number")
    endif()
    foreach(pair ${bad})
      string(REPLACE "|" ";" pair "${pair}")
      list(GET pair 0 value)
      list(GET pair 1 said)
      expect_error("${cmd} ${name} ${value}" "qkv: error: ${name}: ${said}; expected a " ${cmd_args} ${name} ${value})
    endforeach()
  endforeach()
endforeach()
message(STATUS "numeric options checked: ${floats} FLOAT, ${ints} INT, ${uints} UINT")
if(floats LESS 29 OR ints LESS 47 OR uints LESS 7)
  message(FATAL_ERROR "the --help scan found ${floats} FLOAT, ${ints} INT, ${uints} UINT options: fewer than there are")
endif()

# the messages the issue quotes
expect_error("--window -3" "qkv: error: --window: '-3' is out of range; expected a whole number >= 0" attend --window -3)
expect_not_contains("${last_err}" "179769" "--window -3 prints no DBL_MAX")
expect_error("--window beyond int64" "'9223372036854775808' is out of range" attend --window 9223372036854775808)
expect_error("--threads abc" "--threads: 'abc' is not a number" attend --threads abc)
expect_error("--seed -1" "--seed: '-1' is out of range; expected a whole number in [0, 18446744073709551615]"
             init --out y --seed -1)
expect_error("--seed 2^64" "--seed: '18446744073709551616' is out of range" train --out y --seed 18446744073709551616)
expect_error("--lr nan" "--lr: 'nan' is not a finite number" train --out y --lr nan)
expect_error("--dropout nan" "--dropout: 'nan'" train --out y --dropout nan)
expect_error("--label-smoothing nan" "--label-smoothing: 'nan'" train --out y --label-smoothing nan)
expect_error("--minutes nan" "--minutes: 'nan'" train --out y --minutes nan)
expect_error("--length-penalty nan" "--length-penalty: 'nan'" translate --model y --length-penalty nan)
expect_error("fit --weight-decay inf" "--weight-decay: 'inf' is not a finite number" fit --weight-decay inf)
expect_error("qkv frobnicate" "'frobnicate' is not a qkv command; expected one of attend, bench" frobnicate)
expect_error("qkv bench frobnicate" "'frobnicate' is not a qkv bench command; expected one of attention" bench frobnicate)
expect_error("qkv bench" "qkv bench needs a command" bench)
# a whole number in other words is taken as that number; decimal digits are decimal (CLI11
# alone read "010" as octal 8)
run_qkv(0 out err --threads 1 bench attention --seq 1.6e1,010 --ref-max-t 0 --reps 1 --min-time 0 --gemm-n 32)
expect_contains("${out}" "flash     fwd          16" "--seq 1.6e1 is 16")
expect_contains("${out}" "flash     fwd          10" "--seq 010 is 10")

# --- config.json: integers checked for type and range naming the key, duplicates refused, and
# a model too large for the memory refused before it is allocated
file(WRITE "${w}/dup.json" [=[{"arch": "decoder", "vocab_size": 20, "d_model": 16, "n_heads": 2, "d_ff": 32, "d_ff": 64, "n_layers": 1}]=])
expect_error("duplicate key" "${w}/dup.json: duplicate key \"d_ff\"" init --config "${w}/dup.json" --out "${w}/o")
# each case: one key's value (replacing the base config's, or added to it) and what the error says
set(base_json [=[{"arch": "decoder", "vocab_size": 20, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1}]=])
foreach(case
    "vocab_size|18446744073709551615|\"vocab_size\" is 18446744073709551615, beyond any size"
    "vocab_size|\"20\"|\"vocab_size\" must be an integer, got \"20\""
    "n_kv_heads|-1|n_kv_heads must be in [0, 1099511627776] (0: n_heads), got -1"
    "d_k|1099511627776|n_heads * d_k = 2 * 1099511627776 is more than 1099511627776"
    "n_layers|100000000|of memory available (MemAvailable in /proc/meminfo); most of them in n_layers = 100000000 layers"
    "d_ff|1000000000000|most of them in n_layers = 1 layer of")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 key)
  list(GET case 1 value)
  list(GET case 2 said)
  if(base_json MATCHES "\"${key}\": ")
    string(REGEX REPLACE "\"${key}\": [0-9]+" "\"${key}\": ${value}" json "${base_json}")
  else()
    string(REPLACE "}" ", \"${key}\": ${value}}" json "${base_json}")
  endif()
  file(WRITE "${w}/c.json" "${json}")
  expect_error("config ${key} = ${value}" "${said}" init --config "${w}/c.json" --out "${w}/o")
  expect_contains("${last_err}" "${w}/c.json" "config ${key} = ${value} names the file")
endforeach()
expect_contains("${last_err}" "mostly the feed-forward (d_ff = 1000000000000 x d_model = 16)" "the largest part named")
# --- models to use: translation, language model, classifier (byte tokenizer, a few steps), and
# copies whose logits are NaN (weights ~ N(0, 1e30) overflow in the first layer) or whose end
# of sequence never comes (eos_id -1)
set(words zero one two three four five six seven eight nine)
set(german null eins zwei drei vier fuenf sechs sieben acht neun)
set(tsv "")
set(txt "")
set(cls_data "")
foreach(i RANGE 0 119)
  math(EXPR a "${i} % 10")
  math(EXPR b "(${i} * 7 + 3) % 10")
  list(GET words ${a} wa)
  list(GET words ${b} wb)
  list(GET german ${a} ga)
  list(GET german ${b} gb)
  math(EXPR c "${i} / 10 % 10")  # pairs i and i + 10k differ (no near-copy groups but i, i + 100)
  list(GET words ${c} wc)
  list(GET german ${c} gc)
  string(APPEND tsv "${wa} ${wb} ${wc}.\t${ga} ${gb} ${gc}.\n")
  string(APPEND txt "${wa} ${wb} and ${wb} ${wa}.\n")
  math(EXPR parity "${a} % 2")
  if(parity)
    string(APPEND cls_data "odd\t${wa} ${wb}\n")
  else()
    string(APPEND cls_data "even\t${wa} ${wb}\n")
  endif()
endforeach()
file(WRITE "${w}/pairs.tsv" "${tsv}")
file(WRITE "${w}/text.txt" "${txt}")
file(WRITE "${w}/labels.tsv" "${cls_data}")
run_qkv(0 out err --threads 1 train --task translate --data "${w}/pairs.tsv" --out "${w}/tr" --tokenizer byte --steps 40
        --max-tokens 512 --seed 3)  # 40 steps: enough to say something (an empty source used to get a sentence)
run_qkv(0 out err --threads 1 train --task lm --data "${w}/text.txt" --out "${w}/lm" --tokenizer byte --steps 3
        --max-len 16 --max-tokens 512)
run_qkv(0 out err --threads 1 train --task classify --data "${w}/labels.tsv" --out "${w}/cls" --tokenizer byte
        --steps 3 --max-tokens 256)
foreach(m tr lm cls)
  file(COPY "${w}/${m}/" DESTINATION "${w}/${m}_nan")
  file(READ "${w}/${m}/config.json" cfg)
  string(REGEX REPLACE "\"init_std\": [0-9.e-]+" "\"init_std\": 1e30" cfg "${cfg}")
  file(WRITE "${w}/${m}_nan/config.json" "${cfg}")
  run_qkv(0 out err --threads 1 init --config "${w}/${m}_nan/config.json" --out "${w}/${m}_nan" --seed 1)
  if(NOT m STREQUAL "cls")
    file(COPY "${w}/${m}/" DESTINATION "${w}/${m}_endless")
    file(READ "${w}/${m}/config.json" cfg)
    string(REGEX REPLACE "\"eos_id\": [0-9]+" "\"eos_id\": -1" cfg "${cfg}")
    file(WRITE "${w}/${m}_endless/config.json" "${cfg}")
  endif()
endforeach()
file(WRITE "${w}/src.txt" "one two.\n")
# a model directory whose config implies far more than its weights hold: refused before the
# model is allocated, naming the key
file(COPY "${w}/lm/" DESTINATION "${w}/lm_deep")
file(READ "${w}/lm/config.json" cfg)
string(REGEX REPLACE "\"n_layers\": [0-9]+" "\"n_layers\": 10000" cfg "${cfg}")
file(WRITE "${w}/lm_deep/config.json" "${cfg}")
expect_error("a config its weights cannot hold" "${w}/lm_deep/config.json: the config implies"
             generate --model "${w}/lm_deep" --prompt "one")
expect_contains("${last_err}" "n_layers = 10000 layers" "names n_layers")
expect_contains("${last_err}" "the two files do not belong together" "says what is wrong")

# --- NaN or infinite logits are an error naming the model, for greedy, beam and sampling
foreach(mode "--beam;1" "--beam;4" "--sample")
  expect_error_stdin("translate ${mode} on NaN logits" "--model ${w}/tr_nan: translate: the model's logits are not finite"
                     "${w}/src.txt" translate --model "${w}/tr_nan" ${mode})
  expect_error("generate ${mode} on NaN logits" "--model ${w}/lm_nan: generate: the model's logits are not finite"
               generate --model "${w}/lm_nan" --prompt "one" ${mode})
endforeach()
expect_error("eval translate on NaN logits" "--model ${w}/tr_nan: translate: the model's logits are not finite"
             eval --model "${w}/tr_nan")
expect_error("eval lm on a NaN loss" "--model ${w}/lm_nan: the model's loss on" eval --model "${w}/lm_nan")
expect_error("eval classify on a NaN loss" "--model ${w}/cls_nan: the model's loss on" eval --model "${w}/cls_nan")
expect_error_stdin("classify on NaN logits" "--model ${w}/cls_nan: the model's logits are not finite" "${w}/src.txt"
                   classify --model "${w}/cls_nan")

# --- --sample samples: it turns translate's default beam off, and an explicit beam with it is
# refused; different seeds give different samples
set(samples "")
foreach(seed 1 2 3)
  run_qkv_stdin(0 "${w}/src.txt" out err --threads 1 translate --model "${w}/tr_endless" --sample --temperature 2
                --max-len 12 --seed ${seed})
  string(SHA256 digest "${out}")  # (raw bytes may hold ; or [ ], which CMake lists do not keep apart)
  list(APPEND samples "${digest}")
endforeach()
list(REMOVE_DUPLICATES samples)
list(LENGTH samples n)
if(n LESS 2)
  message(FATAL_ERROR "translate --sample --seed 1|2|3 gave one output for every seed: ${out}")
endif()
expect_error_stdin("translate --sample --beam 4" "--sample and --beam 4 exclude each other" "${w}/src.txt"
                   translate --model "${w}/tr" --sample --beam 4)
expect_error("generate --sample --beam 4" "--sample and --beam 4 exclude each other"
             generate --model "${w}/lm" --prompt "one" --sample --beam 4)
expect_error("eval --sample --beam 2" "--sample and --beam 2 exclude each other" eval --model "${w}/tr" --sample --beam 2)
run_qkv(0 out err --threads 1 eval --model "${w}/tr" --sample --seed 4 --max-len 8 --limit 4)
expect_contains("${out}" "BLEU" "eval --sample runs")
expect_error("--temperature without --sample" "--temperature applies to sampling only: add --sample"
             generate --model "${w}/lm" --prompt "one" --temperature 2)
expect_error("--length-penalty without a beam" "--length-penalty ranks the hypotheses of beam search"
             generate --model "${w}/lm" --prompt "one" --length-penalty 2)
expect_error("eval lm --beam" "--beam applies to decoding translations; this is a language model"
             eval --model "${w}/lm" --beam 2)

# --- generate -n with a beam: the n best distinct continuations; more than the beam is refused
run_qkv(0 out err --threads 1 generate --model "${w}/lm_endless" --prompt "one" --beam 4 -n 2 --max-len 6)
lines(outs "${out}")
list(LENGTH outs n)
list(REMOVE_DUPLICATES outs)
list(LENGTH outs distinct)
if(NOT n EQUAL 2 OR NOT distinct EQUAL 2)
  message(FATAL_ERROR "generate --beam 4 -n 2: expected two different continuations, got:\n${out}")
endif()
expect_error("generate -n 5 --beam 4" "-n 5 with --beam 4: beam search returns at most its 4 best"
             generate --model "${w}/lm" --prompt "one" --beam 4 -n 5)
expect_error("generate -n 2 greedy" "-n 2 without --sample" generate --model "${w}/lm" --prompt "one" -n 2)

# --- an empty source line gives an empty output line, the lines staying aligned; a model is
# never run on it (an input of empty lines translates even with NaN weights)
file(WRITE "${w}/gaps.txt" "one two.\n\nthree.\n")
run_qkv_stdin(0 "${w}/gaps.txt" out err --threads 1 translate --model "${w}/tr" --max-len 12)
lines(outs "${out}")
list(LENGTH outs n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "translate: 3 input lines gave ${n} output lines:\n${out}")
endif()
list(GET outs 0 first)
list(GET outs 1 middle)
list(GET outs 2 last)
if(NOT middle STREQUAL "" OR first STREQUAL "" OR last STREQUAL "")
  message(FATAL_ERROR "translate: expected an empty line for the empty source only, got:\n${out}")
endif()
file(WRITE "${w}/blank.txt" "\n\n")
run_qkv_stdin(0 "${w}/blank.txt" out err --threads 1 translate --model "${w}/tr_nan")
if(NOT out STREQUAL "\n\n")
  message(FATAL_ERROR "translate of two empty lines: expected two empty lines, got '${out}'")
endif()

# --- generate says, once, that it stopped at the end of a learned position table
run_qkv(0 out err --threads 1 generate --model "${w}/lm_endless" --prompt "one" --max-len 200 --sample -n 2)
string(REGEX MATCHALL "end of the model's learned positions" said "${err}")
list(LENGTH said n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "generate --max-len 200 on a 16-position model (trained with --max-len 16): expected one note on stderr, got:\n${err}")
endif()
expect_contains("${err}" "max_len 16" "the note names the table's size")
run_qkv(0 out err --threads 1 generate --model "${w}/lm_endless" --prompt "one" --max-len 5)
expect_not_contains("${err}" "learned positions" "no note when the table is not reached")
# --dtype packs the projections at load (issue 21): every type generates; a bad one is refused
foreach(t f32 bf16 f16 int8 q4)
  run_qkv(0 out err --threads 1 generate --model "${w}/lm" --prompt "one" --max-len 6 --dtype ${t})
  expect_contains("${out}" "one" "generate --dtype ${t}")
endforeach()
expect_error("generate --dtype q3" "--dtype q3: expected f32, bf16, f16, int8 (q8_0) or q4 (q4_0)" generate
             --model "${w}/lm" --prompt "one" --dtype q3)
run_qkv(0 out err --threads 1 eval --model "${w}/lm" --dtype int8)
expect_contains("${out}" "perplexity" "eval --dtype int8")
# qkv quantize writes a directory that generates as --dtype does at load, token for token, and
# evaluates to the same loss; another --dtype on it, or a bad --out, is refused
foreach(t int8 q4 bf16)
  run_qkv(0 out err quantize --model "${w}/lm" --dtype ${t} --out "${w}/lm_${t}")
  expect_contains("${out}" " weights, " "quantize --dtype ${t}")
  expect_file("${w}/lm_${t}/task.json" "quantize copies task.json")
  run_qkv(0 want err --threads 1 generate --model "${w}/lm" --prompt "one" --max-len 8 --dtype ${t})
  run_qkv(0 got err --threads 1 generate --model "${w}/lm_${t}" --prompt "one" --max-len 8)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "quantize --dtype ${t}: the packed directory generates '${got}', packing at load '${want}'")
  endif()
  run_qkv(0 want err --threads 1 eval --model "${w}/lm" --dtype ${t})
  run_qkv(0 got err --threads 1 eval --model "${w}/lm_${t}")
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "quantize --dtype ${t}: eval of the packed directory says '${got}', packing at load '${want}'")
  endif()
endforeach()
expect_error("generate --dtype f16 on a q4 directory" "its weights are packed to q4_0 (qkv quantize)" generate
             --model "${w}/lm_q4" --prompt "one" --dtype f16)
expect_error("quantize --dtype f32" "--dtype f32: quantize packs to bf16, f16, int8 (q8_0) or q4 (q4_0)" quantize
             --model "${w}/lm" --dtype f32 --out "${w}/lm_f32")
expect_error("quantize over its own model" "is the model directory itself" quantize --model "${w}/lm" --dtype int8
             --out "${w}/lm")
file(WRITE "${w}/a_file" "x")
expect_error("quantize --out onto a file" "exists and is not a directory" quantize --model "${w}/lm" --dtype int8
             --out "${w}/a_file")
expect_error("export of a packed model" "export: the model's weights are packed to q8_0 for inference" export --model "${w}/lm_int8" --out "${w}/lm_int8_hf")
foreach(way "--beam;4" "--beam;4;-n;3" "--beam;2")
  run_qkv(0 out err --threads 1 generate --model "${w}/lm_endless" --prompt "one" --max-len 200 ${way})
  string(REGEX MATCHALL "end of the model's learned positions" said "${err}")
  list(LENGTH said n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "generate ${way} --max-len 200 on a 16-position model: expected one note on stderr, got:\n${err}")
  endif()
endforeach()

# --- attention maps: errors name --layer and --head and the command
expect_error_stdin("translate --layer 5" "--layer 5: the model has 2 layers" "${w}/src.txt"
                   translate --model "${w}/tr" --attention-map "${w}/m.svg" --layer 5)
expect_not_contains("${last_err}" "generate" "translate's map errors do not say generate")
expect_error("generate --head 9" "--head 9: the model has 4 heads" generate --model "${w}/lm" --prompt "one"
             --attention-map "${w}/m.svg" --head 9)
expect_error("--layer without a map" "--layer and --head choose the attention of --attention-map"
             generate --model "${w}/lm" --prompt "one" --layer 1)

# --- eval --limit reports what it read and what it kept
run_qkv(0 out err --threads 1 eval --model "${w}/tr" --data "${w}/pairs.tsv" --limit 3 --max-len 6)
expect_contains("${err}" "scoring the first 3 (--limit)" "eval --limit")
expect_not_contains("${err}" "0 records from 0 lines" "eval --limit keeps the file's report")
expect_contains("${out}" "3 sentences" "eval --limit 3 scores 3")

# --- perplexity printed whole at any size, in train's last line and in eval
file(WRITE "${w}/hot.json" [=[{"arch": "decoder", "vocab_size": 1, "d_model": 64, "n_heads": 2, "d_ff": 64,
  "n_layers": 1, "positional": "learned", "max_len": 16, "init_std": 20, "norm_first": true}]=])
run_qkv(0 out err --threads 1 train --task lm --data "${w}/text.txt" --out "${w}/hot" --tokenizer byte
        --config "${w}/hot.json" --steps 1 --max-len 16 --max-tokens 512 --lr 1e-6)
if(NOT out MATCHES "best validation loss ([0-9]+)\\.([0-9][0-9][0-9][0-9]) \\(perplexity [1-9]\\.[0-9][0-9][0-9]e\\+([0-9]+)\\)")
  message(FATAL_ERROR "train: expected the perplexity as m.mmme+NN, got:\n${out}")
endif()
# the exponent is floor(loss / ln 10), within one for the rounding of ln 10 here
math(EXPR digits "${CMAKE_MATCH_1}${CMAKE_MATCH_2} * 1000 / 23025851")
math(EXPR off "${CMAKE_MATCH_3} - ${digits}")
if(off GREATER 1 OR off LESS -1)
  message(FATAL_ERROR "train: perplexity exponent ${CMAKE_MATCH_3}, expected about ${digits}:\n${out}")
endif()
run_qkv(0 out err --threads 1 eval --model "${w}/hot")
if(NOT out MATCHES "perplexity [1-9]\\.[0-9][0-9][0-9]e\\+[0-9]+,")
  message(FATAL_ERROR "eval: expected the perplexity as m.mmme+NN, got:\n${out}")
endif()

# --- bench attention never reports negative memory or a ratio of noise
run_qkv(0 out err --threads 1 bench attention --seq 16,32 --ref-max-t 32 --reps 1 --min-time 0 --gemm-n 32)
if(out MATCHES " -[0-9.]+\n" OR out MATCHES "memory -")
  message(FATAL_ERROR "bench attention: a negative memory figure:\n${out}")
endif()
run_qkv(0 out err --threads 1 bench attention --seq 16 --ref-max-t 0 --reps 1 --min-time 0 --gemm-n 32 --json)
if(out MATCHES "\"peak_extra_mib\": -")
  message(FATAL_ERROR "bench attention --json: a negative memory figure:\n${out}")
endif()
expect_error("bench attention beyond memory" "--seq 16777216: a case of B = 1, H = 64" bench attention --seq 16777216
             --heads 64)
expect_contains("${last_err}" "of memory available" "bench attention names the memory")

# --- .npy inputs: errors from deep inside the model name the file and what was expected
write_npy("${w}/empty_t.npy" "<i8" "(2, 0)" "")
write_npy("${w}/empty_b.npy" "<i8" "(0, 3)" "")
id_bytes(ids 3 4 5 6 7 8)
write_npy("${w}/ids.npy" "<i8" "(2, 3)" "${ids}")
id_bytes(big 3 4 500 6 7 8)
write_npy("${w}/big.npy" "<i8" "(2, 3)" "${big}")
id_bytes(ids3 3 4 5 6 7 8)
write_npy("${w}/ids3.npy" "<i8" "(1, 2, 3)" "${ids3}")
expect_error("forward on (2, 0) ids" "--input ${w}/empty_t.npy: (2, 0) is empty" forward --model "${w}/lm" --input "${w}/empty_t.npy")
expect_error("forward on (0, 3) ids" "--input ${w}/empty_b.npy: (0, 3) is empty" forward --model "${w}/lm" --input "${w}/empty_b.npy")
expect_error("forward on ids outside the vocabulary" "--input ${w}/big.npy: token id 500 at (0, 2) is outside the vocabulary"
             forward --model "${w}/lm" --input "${w}/big.npy")
expect_error("forward with a 3-d target" "--target ${w}/ids3.npy: expected one next token per position, (2, 3)"
             forward --model "${w}/lm" --input "${w}/ids.npy" --target "${w}/ids3.npy")
expect_error("fit with a target outside the vocabulary" "--target ${w}/big.npy: 500 at flat index 2"
             fit --model "${w}/lm" --input "${w}/ids.npy" --target "${w}/big.npy" --steps 1)
run_qkv(0 out err --threads 1 forward --model "${w}/lm" --input "${w}/ids.npy" --target "${w}/ids.npy")
expect_contains("${out}" "loss" "forward on good ids")
# the sliding window: a literal near INT64_MAX is no window, as it should be
float_bytes(qb 48 0 1)
float_bytes(kb 48 1 3)
float_bytes(vb 48 2 5)
write_npy("${w}/q.npy" "<f4" "(2, 6, 4)" "${qb}")
write_npy("${w}/k.npy" "<f4" "(2, 6, 4)" "${kb}")
write_npy("${w}/v.npy" "<f4" "(2, 6, 4)" "${vb}")
float_bytes(kb1 24 1 3)
write_npy("${w}/k7.npy" "<f4" "(1, 6, 4)" "${kb1}")
set(qkv_files --q "${w}/q.npy" --k "${w}/k.npy" --v "${w}/v.npy")
run_qkv(0 out err --threads 1 attend ${qkv_files} --out "${w}/z_plain.npy")
foreach(window 6 1000 9223372036854775806 9223372036854775807)
  run_qkv(0 out err --threads 1 attend ${qkv_files} --window ${window} --out "${w}/z_${window}.npy")
  file(SHA256 "${w}/z_plain.npy" want)
  file(SHA256 "${w}/z_${window}.npy" got)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "attend --window ${window} (wider than the 6 keys) differs from no window")
  endif()
endforeach()
run_qkv(0 out err --threads 1 attend ${qkv_files} --window 2 --out "${w}/z_2.npy")
file(SHA256 "${w}/z_2.npy" narrow)
if(narrow STREQUAL want)
  message(FATAL_ERROR "attend --window 2 equals no window: the window is not applied")
endif()
expect_error("attend with mismatched heads" "--q ${w}/q.npy, --k ${w}/k7.npy, --v ${w}/v.npy: k and v must agree"
             attend --q "${w}/q.npy" --k "${w}/k7.npy" --v "${w}/v.npy" --out "${w}/z.npy")

# --- a Hugging Face folder (no task.json) whose config.json is broken: config.json and what is
# wrong with it are named (it was "DIR/task.json: not found")
set(hf "${w}/hf_broken")
file(MAKE_DIRECTORY "${hf}")
expect_error("HF folder without config.json" "${hf}/config.json: not found, and neither is ${hf}/task.json"
             generate --model "${hf}" --prompt x)
file(WRITE "${hf}/config.json" "{\"model_type\": \"gpt2\", ")
expect_error("HF config.json, bad JSON" "${hf}/config.json: not valid JSON" generate --model "${hf}" --prompt x)
file(WRITE "${hf}/config.json" "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_layer\": 3}")
expect_error("HF config.json, a key twice" "${hf}/config.json: duplicate key \"n_layer\"" generate --model "${hf}" --prompt x)
execute_process(COMMAND printf "{\"model_type\": \"gpt2\\000\"}" OUTPUT_FILE "${hf}/config.json")
expect_error("HF config.json with a NUL" "${hf}/config.json: not valid JSON: NUL byte" generate --model "${hf}" --prompt x)
file(WRITE "${hf}/config.json" "{\"n_layer\": 2}")
expect_error("HF config.json without model_type" "${hf}/config.json: no \"model_type\", so not a Hugging Face config"
             generate --model "${hf}" --prompt x)
file(WRITE "${hf}/config.json" "{\"model_type\": \"gpt2\", \"n_head\": 0}")
expect_error("HF config.json with a bad value" "${hf}/config.json (gpt2): config: n_heads" generate --model "${hf}" --prompt x)
file(REMOVE "${hf}/config.json")
file(MAKE_DIRECTORY "${hf}/config.json")
expect_error("HF config.json a directory" "${hf}/config.json: config.json is a directory" generate --model "${hf}" --prompt x)
file(REMOVE_RECURSE "${hf}/config.json")
execute_process(COMMAND mkfifo "${hf}/config.json" RESULT_VARIABLE rc)
if(rc EQUAL 0)
  expect_error("HF config.json a FIFO" "${hf}/config.json: config.json is a FIFO" generate --model "${hf}" --prompt x)
  expect_error("HF config.json a FIFO (classify)" "${hf}/config.json: config.json is a FIFO" classify --model "${hf}")
  file(REMOVE "${hf}/config.json")
endif()

# a classifier whose task.json lists fewer labels than config.json's classes
file(COPY "${w}/cls/" DESTINATION "${w}/cls_short")
file(WRITE "${w}/cls_short/task.json" [=[{"task": "classify", "labels": ["even"], "max_len": 64}]=])
expect_error_stdin("classify with one label" "task.json: a classify model needs a \"labels\" array of at least 2"
                   "${w}/src.txt" classify --model "${w}/cls_short")
file(WRITE "${w}/cls_short/task.json" [=[{"task": "classify", "labels": ["even", "odd", "other"], "max_len": 64}]=])
expect_error_stdin("classify with too many labels" "task.json lists 3 labels, but config.json's num_classes is 2"
                   "${w}/src.txt" classify --model "${w}/cls_short")
file(WRITE "${w}/cls_short/task.json" [=[{"task": "classify", "labels": ["even", "even"], "max_len": 64}]=])
expect_error_stdin("classify with a label twice" "label \"even\" appears twice" "${w}/src.txt" classify
                   --model "${w}/cls_short")


# --- --out through /proc/self/fd/1 and /dev/stdout (issue 20): the open file is written through,
# not resolved into a path (a pipe's link reads "pipe:[N]"); a symbolic link loop is named as such
foreach(out_path /proc/self/fd/1 /dev/stdout)
  run_qkv(0 out err data kjv-testament --out ${out_path})
  string(LENGTH "${out}" n)
  if(n LESS 1000)
    message(FATAL_ERROR "data --out ${out_path}: ${n} bytes on standard output\n${err}")
  endif()
endforeach()
file(CREATE_LINK "loopB" "${w}/loopA" SYMBOLIC)
file(CREATE_LINK "loopA" "${w}/loopB" SYMBOLIC)
expect_error("data --out a link loop" "loopA: cannot write: more than 40 levels of symbolic links"
             data kjv-testament --out "${w}/loopA")
file(WRITE "${w}/tiny.json" [=[{"arch": "decoder", "vocab_size": 20, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1}]=])
expect_error("init --out a link loop" "loopA: too many levels of symbolic links" init --config "${w}/tiny.json"
             --out "${w}/loopA")
file(WRITE "${w}/lines.txt" "one two three\nfour five six\n")
expect_error("train --out a link loop" "too many levels of symbolic links" train --task lm --data "${w}/lines.txt"
             --steps 1 --preset tiny --tokenizer byte --out "${w}/loopA")

file(REMOVE_RECURSE "${w}")
