#!/usr/bin/env bash
# RocketMQ compatibility suite: the crates.io client rocketmq-client-rust
# 1.0.0 (built once, ~10 minutes on 2 cores) against rokka started on free
# loopback ports; each case gets a fresh data directory.
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
wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; return 1; }

# new_case: a directory and ports; write_config [extra TOML lines]: its config.
new_case() {
  dir=$(mktemp -d)
  ns=$(free_port); br=$(free_port); kp=$(free_port); mp=$(free_port)
}
write_config() {
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
$(printf '%s\n' "$@")
EOT
}
start_rokka() {
  "$ROKKA_BIN" --config "$dir/rokka.toml" "$@" >> "$dir/rokka.log" 2>&1 &
  pid=$!
  wait_port "$ns"
}
stop_rokka() { kill -TERM "$1" 2>/dev/null || true; wait "$1" || true; }

passed=0; failed=0
# run_client NAME ARGS...: the harness (the client logs INFO to stdout
# whatever RUST_LOG says: keep only its verdict unless it fails).
run_client() {
  local name=$1; shift
  local start=$SECONDS
  if timeout 180 "$@" >> "$dir/client.log" 2>&1; then
    grep '^compat: ' "$dir/client.log" | sed "s/^compat: /#   /" || true
    echo "#   ($name: $((SECONDS - start)) s)"
    : > "$dir/client.log"
    return 0
  fi
  echo "FAILED - rocketmq $name (client and rokka log tails follow)"
  grep -v 'INFO' "$dir/client.log" | tail -30 || true
  tail -20 "$dir/rokka.log"
  return 1
}
verdict() {
  if [[ $1 == 0 ]]; then echo "ok - rocketmq $2"; passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

# One scenario on a fresh embedded name server + broker.
for scenario in send-consume tag-filter send-kinds ordered group lite-pull broadcast delay timer retry-dlq query orderly-group; do
  new_case; write_config; start_rokka
  rc=0; run_client "$scenario" env "rocketmq.client.localOffsetStoreDir=$dir/offsets" \
    "$harness" "127.0.0.1:$ns" "$scenario" || rc=1
  stop_rokka "$pid"; verdict $rc "$scenario"; rm -rf "$dir"
done

# ROCKETMQ binary headers: the client is switched by its environment, and
# rokka's frame counter shows the headers really were binary.
new_case; write_config; start_rokka
rc=0; run_client binary-headers env ROCKETMQ_SERIALIZE_TYPE=ROCKETMQ "$harness" "127.0.0.1:$ns" send-consume || rc=1
if [[ $rc == 0 ]]; then
  frames=$(python3 - "$mp" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
n = {"json": 0, "rocketmq": 0}
for line in text.splitlines():
    if line.startswith("rokka_rocketmq_frames_total{"):
        for k in n:
            if f'serialize="{k}"' in line:
                n[k] += float(line.rsplit(" ", 1)[1])
print(int(n["rocketmq"]), int(n["json"]))
EOF
  )
  read -r bin json <<<"$frames"
  echo "# binary-headers: $bin ROCKETMQ frames, $json JSON frames"
  if [[ $bin -lt 100 || $json -ne 0 ]]; then echo "FAILED - rocketmq binary-headers: frames $frames"; rc=1; fi
fi
stop_rokka "$pid"; verdict $rc binary-headers; rm -rf "$dir"

# Committed offsets survive a restart.
new_case; write_config; start_rokka
rc=0; run_client resume-1 "$harness" "127.0.0.1:$ns" resume-1 || rc=1
stop_rokka "$pid"
if [[ $rc == 0 ]]; then
  start_rokka
  run_client resume-2 "$harness" "127.0.0.1:$ns" resume-2 || rc=1
  stop_rokka "$pid"
fi
verdict $rc restart-resume; rm -rf "$dir"

# Transactions: commit, rollback, and a check-back (short check timings).
new_case; write_config "transaction_timeout_ms = 2000" "transaction_check_interval_ms = 500"; start_rokka
rc=0; run_client transactions "$harness" "127.0.0.1:$ns" transactions || rc=1
stop_rokka "$pid"; verdict $rc transactions; rm -rf "$dir"

# A transaction left open across a restart is checked afterwards; nothing resolves twice.
new_case; write_config "transaction_timeout_ms = 2000" "transaction_check_interval_ms = 500"; start_rokka
rc=0; run_client tx-restart-1 "$harness" "127.0.0.1:$ns" tx-restart-1 || rc=1
stop_rokka "$pid"
if [[ $rc == 0 ]]; then
  start_rokka
  run_client tx-restart-2 "$harness" "127.0.0.1:$ns" tx-restart-2 || rc=1
  stop_rokka "$pid"
fi
verdict $rc transaction-restart; rm -rf "$dir"

# Delayed messages survive a restart (durable delivery progress).
new_case; write_config; start_rokka
rc=0; run_client delay-restart-1 "$harness" "127.0.0.1:$ns" delay-restart-1 || rc=1
stop_rokka "$pid"
if [[ $rc == 0 ]]; then
  start_rokka
  run_client delay-restart-2 "$harness" "127.0.0.1:$ns" delay-restart-2 || rc=1
  stop_rokka "$pid"
fi
verdict $rc delay-restart; rm -rf "$dir"

# A name server alone (rokka --namesrv-only) and a broker registering with it.
new_case
nsdir=$dir/ns; mkdir -p "$nsdir"
cat > "$nsdir/rokka.toml" <<EOT
[metrics]
enabled = false
[rocketmq]
namesrv_listen = "127.0.0.1:$ns"
EOT
"$ROKKA_BIN" --config "$nsdir/rokka.toml" --namesrv-only >> "$dir/rokka.log" 2>&1 &
nspid=$!
wait_port "$ns"
write_config "namesrv_enabled = false" "namesrv_addr = \"127.0.0.1:$ns\""
"$ROKKA_BIN" --config "$dir/rokka.toml" >> "$dir/rokka.log" 2>&1 &
pid=$!
wait_port "$br"
rc=0; run_client external-namesrv "$harness" "127.0.0.1:$ns" send-consume || rc=1
stop_rokka "$pid"; stop_rokka "$nspid"
if [[ $rc == 0 ]] && ! grep -q "broker unregistered" "$dir/rokka.log"; then
  echo "FAILED - rocketmq external-namesrv: the broker did not unregister at shutdown"; rc=1
fi
verdict $rc external-namesrv; rm -rf "$dir"

echo "rocketmq: $passed passed, $failed failed"
[[ $failed == 0 ]]
