#!/usr/bin/env bash
# Installs what qkv needs, from Debian 12's archive only.
#   scripts/install-deps.sh main   what the main job needs: build the qkv tool and the Ding
#                                  dictionary it trains on (scripts/demo.sh)
#   scripts/install-deps.sh        everything: the above, and what the tests and benchmarks need
#                                  (GoogleTest, PyTorch, Open MPI, chromium, clang-16, node, ...)
# Idempotent: does nothing (and needs no network) when everything is already installed.
set -euo pipefail
what=${1:-all}
case "$what" in
  main | all) ;;
  *) echo "usage: scripts/install-deps.sh [main|all]" >&2; exit 2 ;;
esac

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libopenblas-openmp-dev      # single-row products (OpenMP build: shares qkv's thread pool)
  libdnnl-dev                 # GEMM: oneDNN (OpenMP runtime)
  ocl-icd-opencl-dev          # oneDNN's CMake package requires OpenCL (only a Recommends of libdnnl-dev)
  libcli11-dev                # command line
  nlohmann-json3-dev          # config.json, safetensors headers, --json output
  libsentencepiece-dev        # SentencePiece tokenizers (training and encoding)
  libpcre2-dev                # GPT-2's pre-tokenisation regex (Unicode classes)
  libicu-dev                  # Hugging Face tokenizers: Unicode properties, case, normalisation
  libboost-dev                # the server (qkv serve): Boost.Beast (HTTP/1.1) on Boost.Asio, header-only
  trans-de-en                 # English-German sentence pairs (the Ding dictionary)
)
if [ "$what" = all ]; then
  PACKAGES+=(
    libgtest-dev                # tests
    python3-numpy python3-torch # the PyTorch parity test (Debian's torch 1.13)
    python3-sentencepiece       # the Hugging Face tokenizer parity test (SentencePiece's own encoding)
    python3-jinja2              # the chat template parity test (Jinja2 itself)
    python3-jsonschema          # structured output's answers validated (tests/serve_test.py)
    pybind11-dev python3-pybind11 python3-dev python3-pytest python3-setuptools python3-wheel python3-venv
                                # the Python module (import qkv) and its pytest suite
    libopenmpi-dev openmpi-bin  # data-parallel training: mpirun -np N qkv train
    chromium                    # the explorer page's tests in a real browser (headless, via puppeteer-core from npm)
    clang-16 libclang-rt-16-dev # the fuzz targets (libFuzzer, ASan + UBSan; tests/fuzz)
    libomp-16-dev               # ... and clang's OpenMP runtime, which they link
    bible-kjv                   # English prose for language models (the King James Bible)
    gettext                     # msgfmt: the gettext catalog reader's test reads what GNU's own writer writes
  )
  # The GPT-2 and Hugging Face tokenizer parity tests run gpt-3-encoder and @huggingface/tokenizers from npm, the
  # explorer's browser test puppeteer-core: Debian's nodejs and npm, unless the machine already has both.
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then PACKAGES+=(nodejs npm); fi
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present ($what)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (or install sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
