#!/usr/bin/env bash
# Coverage-guided fuzzing on stable Rust (docs/fuzzing.md): builds the
# targets once with SanitizerCoverage and libFuzzer (libfuzzer-sys), then
# runs each for a bounded time from its seed corpus. Exits non-zero when the
# build fails or any target crashes (panic, abort, an allocation over the
# target's budget, a per-input timeout, RSS over the limit); the crashing
# input is kept in fuzz/artifacts/<target>/ and the command to replay it is
# printed.
#
# usage: bash fuzz/run.sh <target|all> <seconds> [libFuzzer flags...]
#        bash fuzz/run.sh build      build only
#        bash fuzz/run.sh seeds      regenerate fuzz/corpus/ (see src/bin/seedgen.rs)
#
# Environment: FUZZ_NICE (default 10) is the niceness of the fuzzers;
# FUZZ_OPT_LEVEL, when set, the optimization level of the build (the
# profile's 3 otherwise; CI's short runs build at 1: 280 s cold on 2 cores
# instead of 347 s, for fewer executions per second).
# Inputs found that add coverage go to fuzz/target/corpus/<target>/ (not
# committed); the committed seeds in fuzz/corpus/<target>/ are only read.
set -uo pipefail
cd "$(dirname "$0")"
fuzz=$(pwd)

targets=(kafka_request rocketmq_frame kafka_batch_convert recovery)
declare -A max_len=([kafka_request]=16384 [rocketmq_frame]=16384 [kafka_batch_convert]=16384 [recovery]=32768)

usage() {
  echo "usage: bash fuzz/run.sh <${targets[*]// /|}|all> <seconds> [libFuzzer flags...] | build | seeds" >&2
  exit 2
}

host=$(rustc -vV | sed -n 's/^host: //p')
out="$fuzz/target/$host/release"

build() {
  # SanitizerCoverage as cargo-fuzz sets it up, with stable flags only:
  # inline 8-bit edge counters and a PC table for libFuzzer, comparison
  # tracing so it can solve magic numbers, lengths and CRCs. `--target`
  # keeps build scripts and proc macros uninstrumented. Debug assertions
  # and overflow checks are on (profile.release in Cargo.toml).
  local flags=(
    -Cpasses=sancov-module
    -Cllvm-args=-sanitizer-coverage-level=4
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
    -Cllvm-args=-sanitizer-coverage-pc-table
    -Cllvm-args=-sanitizer-coverage-trace-compares
    -Cllvm-args=-sanitizer-coverage-stack-depth
    --cfg fuzzing
    -Cdebug-assertions
    -Coverflow-checks
  )
  local bins=()
  for t in "${targets[@]}"; do bins+=(--bin "$t"); done
  echo "building fuzz targets (${targets[*]}) for $host"
  # Not --locked: fuzz/Cargo.lock pins what the targets add (libfuzzer-sys)
  # and what was current; a dependency a workspace crate gains later is
  # resolved here rather than failing the build.
  local opt=()
  [[ -n ${FUZZ_OPT_LEVEL:-} ]] && opt=(CARGO_PROFILE_RELEASE_OPT_LEVEL="$FUZZ_OPT_LEVEL")
  env "${opt[@]}" RUSTFLAGS="${flags[*]}" CARGO_TARGET_DIR="$fuzz/target" \
    cargo build --release --target "$host" "${bins[@]}"
}

run_one() {
  local t=$1 secs=$2; shift 2
  local bin="$out/$t" work="$fuzz/target/corpus/$t" art="$fuzz/artifacts/$t/" log="$fuzz/target/logs/$t.log"
  mkdir -p "$work" "$art" "$(dirname "$log")"
  echo "==> fuzz $t for ${secs}s"
  # -rss_limit_mb: the process's whole RSS; -timeout: one input.
  nice -n "${FUZZ_NICE:-10}" "$bin" \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=30 -max_len="${max_len[$t]}" \
    -print_final_stats=1 -artifact_prefix="$art" "$@" \
    "$work" "$fuzz/corpus/$t" >"$log" 2>&1 &
  local pid=$!
  wait "$pid"
  local code=$?
  # The recovery target's data directory (named by its pid) on tmpfs.
  rm -rf "/dev/shm/rokka-fuzz-recovery-$pid" "${TMPDIR:-/tmp}/rokka-fuzz-recovery-$pid"
  if [[ $code == 0 ]]; then
    grep -E '^(INFO: (Loaded|seed corpus)|#[0-9]+[[:space:]]+(INITED|DONE)|Done [0-9]+ runs|stat::)' "$log"
    echo "$t: ok"
  else
    tail -80 "$log"
    echo "$t: FAILED (exit $code); log: $log; crashing inputs: $art"
    echo "replay: $bin $art<file>"
  fi
  return "$code"
}

[[ $# -ge 1 ]] || usage
case $1 in
  build) build; exit $? ;;
  seeds)
    CARGO_TARGET_DIR="$fuzz/target/plain" cargo run --release --bin seedgen -- "$fuzz"
    exit $?
    ;;
esac
[[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || usage
which=$1 secs=$2
shift 2
if [[ $which == all ]]; then
  run=("${targets[@]}")
else
  [[ " ${targets[*]} " == *" $which "* ]] || usage
  run=("$which")
fi
build || { echo "fuzz build failed"; exit 1; }
failed=()
for t in "${run[@]}"; do
  run_one "$t" "$secs" "$@" || failed+=("$t")
done
if ((${#failed[@]})); then
  echo "fuzz: crashes in ${failed[*]}"
  exit 1
fi
echo "fuzz: ${run[*]}: no crash (at most ${secs}s each)"
