#!/usr/bin/env bash
# The project's test command (README.md "Run the tests"; .ci/run calls it).
# Installs what the tests need, builds once, runs every step with bounded
# time — all of them, even after a failure — and ends with a summary of
# every step. Each step's output and every broker log are kept under
# target/compat-results (ROKKA_RESULTS_DIR); the tails of failed steps and
# of broker logs with errors are printed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export ROKKA_RESULTS_DIR="${ROKKA_RESULTS_DIR:-$root/target/compat-results}"
rm -rf "$ROKKA_RESULTS_DIR"
mkdir -p "$ROKKA_RESULTS_DIR"

step() { printf '\n==> %s\n' "$*"; }
die() { echo "compat-tests/run.sh: $*" >&2; exit 2; }

# ---- what the tests need, installed or named clearly ---------------------
step "prerequisites"
if command -v sudo >/dev/null 2>&1 && [[ $(id -u) != 0 ]]; then SUDO=sudo; else SUDO=; fi
missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq || die "apt-get update failed; install by hand: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null \
    || die "apt-get install failed; install by hand: ${missing[*]}"
fi
command -v python3 >/dev/null 2>&1 || die "python3 (3.9 or newer) is needed"
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
((node_major >= 18)) || die "Node.js 18 or newer is needed for kafkajs and node --test (found $(node --version 2>/dev/null || echo none))"
cargo fmt --version >/dev/null 2>&1 || die "rustfmt is needed: rustup component add rustfmt"
cargo clippy --version >/dev/null 2>&1 || die "clippy is needed: rustup component add clippy"
cargo --version
rustc --version
echo "node $(node --version), npm $(npm --version), $(python3 --version), $(cmake --version | head -1)"

# CI builds once: incremental compilation state would only take disk space
# the suites' data shares.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# disk_report WHEN: the space left where the build and the suites' data go
# (a nearly full disk fails writes everywhere; the summary shows it).
disk_report() {
  echo "disk $1: $(df -h --output=used,avail,pcent "$root" | tail -1 | tr -s ' ') used/avail/use; target/ $(du -sh "$root/target" 2>/dev/null | cut -f1)"
}
disk_at_start=$(disk_report "at the start")
echo "$disk_at_start"

# ---- steps ---------------------------------------------------------------
declare -a names=() codes=() secs=()
# run_step NAME TIMEOUT CMD...: output to the terminal and to results/NAME.log.
run_step() {
  local name=$1 limit=$2; shift 2
  step "$name"
  local start=$SECONDS
  timeout --kill-after=30 "$limit" "$@" 2>&1 | tee "$ROKKA_RESULTS_DIR/$name.log"
  local code=${PIPESTATUS[0]}
  [[ $code == 124 ]] && echo "$name: timed out after $limit s"
  names+=("$name"); codes+=("$code"); secs+=($((SECONDS - start)))
}

run_step fmt 300 cargo fmt --all -- --check
# Patched crate copies are their published release plus their patch file.
run_step vendored 300 bash third_party/verify.sh
run_step clippy 1500 cargo clippy --workspace --all-targets --locked -- -D warnings
# Unit tests, proptest, recovery, the SIGKILL crash test, retention, the
# binary end to end. Each stops itself; the timeout only guards a hang.
run_step compat-lint 300 bash compat-tests/lint.sh

# ---- in the background, on idle CPU only ----------------------------------
# The client builds the suites need (the RocketMQ harness, ~8 CPU-minutes
# cold; Apache's RocketMQ 5 Rust client, ~3) and the fuzz smoke run (its
# build ~9 CPU-minutes) wait mostly on the CPU, while the workspace tests'
# runs and the suites wait mostly on clients, brokers and timers. So they
# run one after the other in the background under SCHED_IDLE (niceness 19
# where chrt is missing): they take only CPU nothing else wants, and the
# steps in the foreground keep theirs. A suite that needs a client build
# still running waits on cargo's lock of that build directory (the build
# then has the CPU to itself); a failed background build is built again,
# with its error, by the suite. The fuzz run is a step of its own,
# collected before the summary.
if command -v chrt >/dev/null 2>&1 && chrt --idle 0 true 2>/dev/null; then
  idle=(chrt --idle 0 nice -n 19)
else
  idle=(nice -n 19)
fi
background() {
  local start
  for dir in compat-tests/rocketmq/harness compat-tests/rocketmq5/rust; do
    start=$SECONDS
    (cd "$dir" && timeout 3600 cargo build --profile ci -q --locked) \
      > "$ROKKA_RESULTS_DIR/prebuild-$(basename "$dir").log" 2>&1
    echo "prebuild $dir: exit $? in $((SECONDS - start)) s" >> "$ROKKA_RESULTS_DIR/prebuild-$(basename "$dir").log"
  done
  # Short runs: the targets built at opt-level 1 (a minute less to build
  # cold); the fuzzers themselves run at the idle priority as well.
  start=$SECONDS
  timeout --kill-after=30 3600 env FUZZ_OPT_LEVEL="${FUZZ_OPT_LEVEL:-1}" FUZZ_NICE=19 \
    bash fuzz/run.sh all 20 > "$ROKKA_RESULTS_DIR/fuzz.log" 2>&1
  local code=$?
  [[ $code == 124 ]] && echo "fuzz: timed out after 3600 s" >> "$ROKKA_RESULTS_DIR/fuzz.log"
  echo "$code $((SECONDS - start))" > "$ROKKA_RESULTS_DIR/fuzz.status"
}
"${idle[@]}" bash -c "$(declare -f background); ROKKA_RESULTS_DIR='$ROKKA_RESULTS_DIR'; background" &
background_pid=$!

run_step workspace-tests 1200 cargo test --workspace --locked
# One debug build of rokka serves every suite.
run_step build-rokka 900 cargo build -p rokka-server --locked
export ROKKA_BIN="$root/target/debug/rokka"
# Third-party client suites: each installs its own clients (venv, npm, apt).
# The Kafka suite needs no client build, so it runs first, while the
# background builds the RocketMQ clients; the rest in order of name.
suites=(compat-tests/kafka/run.sh)
for suite in compat-tests/*/run.sh; do
  [[ -e $suite && $suite != compat-tests/kafka/run.sh ]] && suites+=("$suite")
done
for suite in "${suites[@]}"; do
  run_step "suite-$(basename "$(dirname "$suite")")" 1800 bash "$suite"
done

# The background's fuzz run: its output, then its verdict as a step.
step "fuzz (ran in the background; waiting for it to end)"
start=$SECONDS
wait "$background_pid"
echo "(waited $((SECONDS - start)) s)"
cat "$ROKKA_RESULTS_DIR"/prebuild-*.log 2>/dev/null | grep '^prebuild ' || true
cat "$ROKKA_RESULTS_DIR/fuzz.log" 2>/dev/null
if read -r code took < "$ROKKA_RESULTS_DIR/fuzz.status" 2>/dev/null; then :; else code=1 took=0; fi
names+=(fuzz); codes+=("$code"); secs+=("$took")

# ---- summary -------------------------------------------------------------
failed=0
for i in "${!names[@]}"; do
  if [[ ${codes[$i]} != 0 ]]; then
    failed=$((failed + 1))
    step "tail of failed step ${names[$i]} (full output: $ROKKA_RESULTS_DIR/${names[$i]}.log)"
    tail -60 "$ROKKA_RESULTS_DIR/${names[$i]}.log"
  fi
done
if ((failed)); then
  # Broker logs that recorded an error or a panic, wherever a suite kept them.
  while IFS= read -r log; do
    step "broker log with errors: $log"
    grep -n -E 'ERROR|panicked' "$log" | tail -20
  done < <(grep -rl -E 'ERROR|panicked' --include=rokka.log "$ROKKA_RESULTS_DIR" 2>/dev/null | head -20)
fi
step "summary"
echo "$disk_at_start"
disk_report "at the end"
for i in "${!names[@]}"; do
  if [[ ${codes[$i]} == 0 ]]; then verdict=ok; else verdict="FAILED (exit ${codes[$i]})"; fi
  printf '%-24s %-18s %5s s\n' "${names[$i]}" "$verdict" "${secs[$i]}"
done
for f in "$ROKKA_RESULTS_DIR"/*reruns*.txt; do
  [[ -s $f ]] && { echo "reruns recorded in $f:"; cat "$f"; }
done
echo "results kept in $ROKKA_RESULTS_DIR"
((failed == 0))
