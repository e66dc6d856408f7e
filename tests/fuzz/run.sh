#!/usr/bin/env bash
# run.sh FUZZER NAME SECONDS WORKDIR: one fuzz target, as ctest (-L fuzz) and bench/fuzz.sh run it.
#   1. replays every file of tests/fuzz/regressions/NAME/ once (inputs that once found a bug);
#   2. fuzzes for SECONDS, starting from WORKDIR/corpus (kept; new inputs go there) and the
#      committed seeds tests/fuzz/corpus/NAME/ (only read), with tests/fuzz/dict/NAME.dict;
#   3. prints one summary line: executions, exec/s, coverage (cov: edges, ft: features), corpus
#      size, peak RSS, and the files of this run's findings (crash-*, leak-*, timeout-*, oom-*
#      in WORKDIR/findings/).
# Exits non-zero when a regression input or the fuzzing run fails.
set -uo pipefail
fuzzer=$1 name=$2 seconds=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
seeds=$here/corpus/$name regressions=$here/regressions/$name dict=$here/dict/$name.dict
mkdir -p "$work/corpus" "$work/findings"

# Every byte is hostile: an input driving one allocation over 256 MiB (the inputs are KiB), the
# process past 2 GiB, or one input running over 10 s is a finding, like a crash.
opts=(-rss_limit_mb=2048 -malloc_limit_mb=256 -timeout=10 -print_final_stats=1 -artifact_prefix="$work/findings/")
[ -f "$dict" ] && opts+=(-dict="$dict")
# No size-keyed block cache (it would hide use-after-free from ASan and hold memory across
# inputs); one thread; leaks are findings too.
export QKV_ALLOC_CACHE_MB=0 QKV_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# Readers that take a path get each input as a file: on tmpfs that costs microseconds, on a disk
# milliseconds (60 times fewer executions). QKV_FUZZ_TMPDIR overrides.
tmp=${QKV_FUZZ_TMPDIR:-}
if [ -z "$tmp" ]; then [ -d /dev/shm ] && [ -w /dev/shm ] && tmp=/dev/shm || tmp=${TMPDIR:-/tmp}; fi
export TMPDIR=$tmp
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

rc=0
shopt -s nullglob
replay=("$regressions"/*)
if [ ${#replay[@]} -gt 0 ]; then
  echo "+ $fuzzer ${opts[*]} $regressions/* (${#replay[@]} regression inputs)"
  if ! "$fuzzer" "${opts[@]}" "${replay[@]}" >"$work/regressions.log" 2>&1; then
    tail -n 60 "$work/regressions.log"
    echo "fuzz $name: a regression input fails (log: $work/regressions.log)"
    rc=1
  fi
fi

echo "+ $fuzzer ${opts[*]} -max_total_time=$seconds $work/corpus $seeds"
touch "$work/.start"
start=$(date +%s)
"$fuzzer" "${opts[@]}" -max_total_time="$seconds" "$work/corpus" "$seeds" >"$work/fuzz.log" 2>&1
frc=$?
elapsed=$(( $(date +%s) - start ))
[ $frc -ne 0 ] && { tail -n 80 "$work/fuzz.log"; rc=1; }

stat() { sed -n "s/^stat::$1: *//p" "$work/fuzz.log" | tail -n 1; }
last=$(grep -E '^#[0-9]+' "$work/fuzz.log" | grep -E 'cov: ' | tail -n 1)
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
findings=($(find "$work/findings" -type f -newer "$work/.start" | sort))  # this run's
printf 'fuzz %s: %ss, %s executions (%s/s), cov %s, ft %s, corpus %s files, peak RSS %s MB, findings: %s\n' \
  "$name" "$elapsed" "$(stat number_of_executed_units)" "$(stat average_exec_per_sec)" "${cov:-?}" "${ft:-?}" \
  "$(ls "$work/corpus" | wc -l)" "$(stat peak_rss_mb)" "${findings[*]:-none}"
exit $rc
