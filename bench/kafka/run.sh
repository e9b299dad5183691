#!/usr/bin/env bash
# Kafka throughput benchmark: builds rokka (release) and this librdkafka
# driver, starts rokka on free loopback ports with a temp data dir, runs the
# cases and prints the numbers for docs/benchmarks.md. Not part of CI.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# librdkafka builds with its own configure script (rdkafka-sys), needing only make and a C compiler.
(cd "$root" && cargo build --release -q -p rokka-server)
(cd "$here" && cargo build --release -q)
bench="$here/target/release/rokka-kafka-bench"

failures=0
run_case() { # flush_mode then bench args; a failed driver or broker fails the run
  # (STORE_EXTRA: more [store] lines, e.g. "verify_reads = false")
  local mode=$1; shift
  local dir; dir=$(mktemp -d "$root/target/kbench.XXXX")
  cat > "$dir/rokka.toml" <<EOT
[log]
level = "warn"
[metrics]
enabled = false
[store]
data_dir = "$dir/data"
flush_mode = "$mode"
${STORE_EXTRA:-}
[broker]
default_partitions = 4
[kafka]
listen = "127.0.0.1:0"
[rocketmq]
enabled = false
EOT
  "$root/target/release/rokka" --config "$dir/rokka.toml" --ports-file "$dir/ports.json" & local pid=$!
  for _ in $(seq 300); do [[ -s $dir/ports.json ]] && break; sleep 0.1; done
  local kafka; kafka=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["kafka"])' "$dir/ports.json")
  echo "# flush_mode=$mode ${STORE_EXTRA:-} $*"
  local rc=0
  "$bench" --brokers "$kafka" --topic "b$RANDOM" "$@" || { rc=$?; echo "FAILED: the driver exited with $rc"; }
  kill -TERM $pid
  local code=0; wait $pid || code=$?
  if [[ $code != 0 ]]; then echo "FAILED: rokka exited with $code"; rc=1; fi
  if [[ $rc != 0 ]]; then failures=$((failures + 1)); fi
  rm -rf "$dir"
}

if [[ ${1:-} == txn ]]; then
  # Transactional produce (commit every 1,000 messages) against idempotent
  # produce of the same 1 KiB messages, alternated, two rounds.
  for round in 1 2; do
    run_case async --size 1024 --messages 500000 --acks all --idempotent
    run_case async --size 1024 --messages 500000 --acks all --transactional-every 1000
  done
  [[ $failures == 0 ]] || { echo "$failures benchmark case(s) failed"; exit 1; }
  exit 0
fi
if [[ ${1:-} == verify ]]; then
  # The read check's cost end to end: the same 1 KiB produce-then-fetch
  # with store.verify_reads on and off, alternated so both see the same
  # machine state.
  for round in 1 2; do
    for v in true false; do
      STORE_EXTRA="verify_reads = $v" run_case async --size 1024 --messages 1000000 --acks 1
    done
  done
  [[ $failures == 0 ]] || { echo "$failures benchmark case(s) failed"; exit 1; }
  exit 0
fi

run_case async --size 100 --messages 4000000 --acks 1
run_case async --size 1024 --messages 1000000 --acks 1
run_case async --size 100 --messages 2000000 --acks all
run_case async --size 1024 --messages 1000000 --acks all
run_case sync --size 1024 --messages 500000 --acks all --produce-only
[[ $failures == 0 ]] || { echo "$failures benchmark case(s) failed"; exit 1; }
