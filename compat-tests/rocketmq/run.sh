#!/usr/bin/env bash
# RocketMQ compatibility suite: the crates.io client rocketmq-client-rust
# 1.0.0 (built once, ~10 minutes on 2 cores) against a rokka started on free
# loopback ports, one scenario per run of the harness.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
(cd "$here/harness" && cargo build --release -q --locked)
harness="$here/harness/target/release/rokka-rocketmq-compat"
if [[ -z ${ROKKA_BIN:-} ]]; then
  (cd "$root" && cargo build -q -p rokka-server --locked)
  ROKKA_BIN="$root/target/debug/rokka"
fi
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

passed=0; failed=0
for scenario in send-consume tag-filter send-kinds; do
  dir=$(mktemp -d)
  ns=$(free_port); br=$(free_port); kp=$(free_port); mp=$(free_port)
  cat > "$dir/rokka.toml" <<EOT
[metrics]
listen = "127.0.0.1:$mp"
[store]
data_dir = "$dir/data"
commitlog_segment_bytes = 67108864
preallocate = false
[kafka]
listen = "127.0.0.1:$kp"
[rocketmq]
namesrv_listen = "127.0.0.1:$ns"
broker_listen = "127.0.0.1:$br"
EOT
  "$ROKKA_BIN" --config "$dir/rokka.toml" > "$dir/rokka.log" 2>&1 &
  pid=$!
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$ns) 2>/dev/null && break; sleep 0.1; done
  # The client logs INFO to stdout whatever RUST_LOG says: keep only its verdict.
  if timeout 180 "$harness" "127.0.0.1:$ns" "$scenario" > "$dir/client.log" 2>&1; then
    echo "ok - rocketmq $scenario"; passed=$((passed + 1))
  else
    echo "FAILED - rocketmq $scenario (client log tail follows)"; tail -20 "$dir/client.log"; failed=$((failed + 1))
  fi
  kill -TERM $pid; wait $pid || true
  rm -rf "$dir"
done
echo "rocketmq: $passed passed, $failed failed"
[[ $failed == 0 ]]
