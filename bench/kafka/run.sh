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

run_case() { # flush_mode then bench args
  local mode=$1; shift
  local dir; dir=$(mktemp -d "$root/target/kbench.XXXX")
  local port; port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  cat > "$dir/rokka.toml" <<EOT
[log]
level = "warn"
[metrics]
enabled = false
[store]
data_dir = "$dir/data"
flush_mode = "$mode"
[broker]
default_partitions = 4
[kafka]
listen = "127.0.0.1:$port"
[rocketmq]
enabled = false
EOT
  "$root/target/release/rokka" --config "$dir/rokka.toml" & local pid=$!
  sleep 1
  echo "# flush_mode=$mode $*"
  "$bench" --brokers "127.0.0.1:$port" --topic "b$RANDOM" "$@" || true
  kill -TERM $pid; wait $pid || true
  rm -rf "$dir"
}

run_case async --size 100 --messages 4000000 --acks 1
run_case async --size 1024 --messages 1000000 --acks 1
run_case async --size 100 --messages 2000000 --acks all
run_case async --size 1024 --messages 1000000 --acks all
run_case sync --size 1024 --messages 500000 --acks all --produce-only
