#!/usr/bin/env bash
# qkv's main job, from a fresh Debian 12 machine: install dependencies, build, reproduce the
# chapter's worked example step by step, then a short attention benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
echo
build/qkv attend
echo
build/qkv bench attention --seq 512,1024,2048 --ref-max-t 1024
