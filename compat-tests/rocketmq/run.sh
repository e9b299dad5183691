#!/usr/bin/env bash
# RocketMQ compatibility suite: the crates.io client rocketmq-client-rust
# 1.0.0 (built once, ~10 minutes on 2 cores) against rokka started on free
# loopback ports; each case gets a fresh data directory.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
(cd "$here/harness" && cargo build --profile ci -q --locked)
harness="$here/harness/target/ci/rokka-rocketmq-compat"
if [[ -z ${ROKKA_BIN:-} ]]; then
  (cd "$root" && cargo build -q -p rokka-server --locked)
  ROKKA_BIN="$root/target/debug/rokka"
fi
results="${ROKKA_RESULTS_DIR:-$root/target/compat-results}/rocketmq"
mkdir -p "$results"
wait_file() { for _ in $(seq 600); do [[ -s $1 ]] && return 0; kill -0 "$2" 2>/dev/null || return 1; sleep 0.05; done; return 1; }
# port KEY: the port rokka reported for a listener (ports.json of the last start).
port() { python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))[sys.argv[2]].rsplit(":",1)[1])' "$dir/ports.json" "$1"; }

# metric_sum NAME LABEL: the sum of rokka's NAME samples whose labels hold
# LABEL (e.g. 'result="ok"'), from the case's metrics port.
metric_sum() {
  python3 - "$mp" "$1" "$2" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print(int(sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
              if l.startswith(sys.argv[2] + "{") and sys.argv[3] in l)))
EOF
}

# new_case NAME: a kept directory under the results directory (rokka.log,
# client.log; the data is removed when the case passes).
case_n=0
new_case() {
  case_n=$((case_n + 1))
  dir="$results/$case_n-$1"
  rm -rf "$dir"; mkdir -p "$dir"
  ns=0; br=0; kp=0; mp=0
}
# write_config [extra TOML lines]: the case's config; port 0 until a first
# start reported the ports, which later starts bind again (clients keep
# their name-server address across a restart).
write_config() {
  extra=("$@")
  cat > "$dir/rokka.toml" <<EOT
[metrics]
listen = "127.0.0.1:$mp"
[store]
data_dir = "$dir/data"
commitlog_segment_bytes = 67108864
preallocate = false
# The suites share the machine's disk with the build: its fill level is not
# what they test (cross/test_retention.py and the store's fault tests do).
disk_max_used_percent = 0
disk_refuse_writes_percent = 0
[kafka]
listen = "127.0.0.1:$kp"
[rocketmq]
namesrv_listen = "127.0.0.1:$ns"
broker_listen = "127.0.0.1:$br"
$(printf '%s\n' "${extra[@]}")
EOT
}
start_rokka() {
  rm -f "$dir/ports.json"
  echo "--- rokka start $(date +%T)" >> "$dir/rokka.log"
  "$ROKKA_BIN" --config "$dir/rokka.toml" --ports-file "$dir/ports.json" "$@" >> "$dir/rokka.log" 2>&1 &
  pid=$!
  if ! wait_file "$dir/ports.json" "$pid"; then
    echo "FAILED - rokka did not start (log: $dir/rokka.log)"; tail -20 "$dir/rokka.log"; return 1
  fi
  if [[ $ns == 0 ]]; then
    ns=$(port namesrv); br=$(port broker); kp=$(port kafka); mp=$(port metrics)
    write_config "${extra[@]}"
  fi
}
# stop_rokka PID: SIGTERM and its exit status (a panic or a failed shutdown
# is a failure of the case, not something to ignore).
stop_rokka() {
  kill -TERM "$1" 2>/dev/null || true
  local code=0
  wait "$1" || code=$?
  if [[ $code != 0 ]]; then echo "FAILED - rokka exited with $code (log: $dir/rokka.log)"; tail -20 "$dir/rokka.log"; return 1; fi
}
# end_case RC: keep the logs, drop the data of a passing case.
end_case() { verdict "$1" "$2"; if [[ $1 == 0 ]]; then rm -rf "$dir/data" "$dir/offsets"; fi; }

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
  echo "FAILED - rocketmq $name (logs: $dir; client and rokka log tails follow)"
  grep -v 'INFO' "$dir/client.log" | tail -30 || true
  tail -20 "$dir/rokka.log"
  return 1
}
verdict() {
  if [[ $1 == 0 ]]; then echo "ok - rocketmq $2"; passed=$((passed + 1)); else echo "not ok - rocketmq $2"; failed=$((failed + 1)); fi
}

# One scenario on a fresh embedded name server + broker.
for scenario in send-consume tag-filter send-kinds ordered group lite-pull broadcast delay timer retry-dlq query request-reply orderly-group; do
  new_case "$scenario"; write_config; rc=0; start_rokka || rc=1
  if [[ $rc == 0 ]]; then
    run_client "$scenario" env "rocketmq.client.localOffsetStoreDir=$dir/offsets" \
      "$harness" "127.0.0.1:$ns" "$scenario" || rc=1
    stop_rokka "$pid" || rc=1
  fi
  end_case $rc "$scenario"
done

# The C++-core client (PyPI rocketmq 0.4.4, librocketmq bundled): a new
# push-consumer group on a topic that already holds messages reads them from
# the start, as against Apache RocketMQ (QUERY_CONSUMER_OFFSET answers 0).
venv="$root/target/compat-venv"
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check rocketmq==0.4.4
new_case cpp-new-group; write_config; rc=0; start_rokka || rc=1
if [[ $rc == 0 ]]; then
  (cd "$dir" && run_client cpp-new-group env HOME="$dir" "$venv/bin/python" "$here/cpp/cpp_client.py" "127.0.0.1:$ns") || rc=1
  stop_rokka "$pid" || rc=1
fi
end_case $rc cpp-new-group

# ROCKETMQ binary headers: the client is switched by its environment, and
# rokka's frame counter shows the headers really were binary.
new_case binary-headers; write_config; rc=0; start_rokka || rc=1
if [[ $rc == 0 ]]; then
  run_client binary-headers env ROCKETMQ_SERIALIZE_TYPE=ROCKETMQ "$harness" "127.0.0.1:$ns" send-consume || rc=1
  if [[ $rc == 0 ]]; then
    bin=$(metric_sum rokka_rocketmq_frames_total 'serialize="rocketmq"')
    json=$(metric_sum rokka_rocketmq_frames_total 'serialize="json"')
    echo "# binary-headers: $bin ROCKETMQ frames, $json JSON frames"
    if [[ $bin -lt 100 || $json -ne 0 ]]; then echo "FAILED - rocketmq binary-headers: frames $bin $json"; rc=1; fi
  fi
  stop_rokka "$pid" || rc=1
fi
end_case $rc binary-headers

# TLS on the name server and broker listeners (rocketmq.tls_mode), with
# certificates made here with openssl: the client with use_tls, trusting
# the suite's CA (it checks the certificate and that it names 127.0.0.1),
# sends and consumes; a client trusting another CA and a plaintext client
# get nothing; with a client CA, only a client presenting a certificate it
# signed; permissive serves plaintext and TLS clients on the same ports.
# tls_counts RESULT: rokka's count of RocketMQ TLS handshakes with RESULT.
tls_counts() { metric_sum rokka_rocketmq_tls_handshakes_total "result=\"$1\""; }
# refused NAME ARGS...: the client must fail (within 60 s).
refused() {
  local name=$1; shift
  if timeout 60 "$@" >> "$dir/client.log" 2>&1; then
    echo "FAILED - rocketmq $name: the client was served"; return 1
  fi
  echo "#   ($name: refused, as it should be)"; : > "$dir/client.log"
}
# tls_case NAME MODE CLIENT_CA [config lines]: a case with fresh
# certificates, rokka started.
tls_case() {
  local name=$1 mode=$2 client_ca=$3; shift 3
  new_case "$name"; mkdir -p "$dir/pki"
  python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from pki import make_pki; make_pki(sys.argv[2])' \
    "$root/compat-tests/common" "$dir/pki"
  local lines=("tls_mode = \"$mode\"" "tls_certificate = \"$dir/pki/server.pem\"" "tls_key = \"$dir/pki/server.key\"")
  [[ -n $client_ca ]] && lines+=("tls_client_ca = \"$dir/pki/ca.pem\"")
  write_config "${lines[@]}" "$@"; rc=0; start_rokka || rc=1
}
tls_case tls-enforcing enforcing ""
if [[ $rc == 0 ]]; then
  run_client tls-send-consume env COMPAT_TLS_CA="$dir/pki/ca.pem" "$harness" "127.0.0.1:$ns" send-consume || rc=1
  refused tls-untrusted-ca env COMPAT_TLS_CA="$dir/pki/other-ca.pem" "$harness" "127.0.0.1:$ns" send-consume || rc=1
  refused tls-plaintext-client "$harness" "127.0.0.1:$ns" send-consume || rc=1
  ok=$(tls_counts ok); bad=$(tls_counts failed); plain=$(tls_counts plaintext_refused)
  echo "# tls-enforcing: handshakes ok $ok, failed $bad, plaintext refused $plain"
  if [[ $ok -lt 2 || $bad -lt 1 || $plain -lt 1 ]]; then echo "FAILED - rocketmq tls-enforcing: handshake counts"; rc=1; fi
  stop_rokka "$pid" || rc=1
fi
end_case $rc tls-enforcing
tls_case tls-client-certificates enforcing yes
if [[ $rc == 0 ]]; then
  run_client tls-mutual env COMPAT_TLS_CA="$dir/pki/ca.pem" COMPAT_TLS_CERT="$dir/pki/client.pem" \
    COMPAT_TLS_KEY="$dir/pki/client.key" "$harness" "127.0.0.1:$ns" send-consume || rc=1
  refused tls-no-client-certificate env COMPAT_TLS_CA="$dir/pki/ca.pem" "$harness" "127.0.0.1:$ns" send-consume || rc=1
  stop_rokka "$pid" || rc=1
fi
end_case $rc tls-client-certificates
tls_case tls-permissive permissive ""
if [[ $rc == 0 ]]; then
  run_client tls-permissive-plaintext "$harness" "127.0.0.1:$ns" send-consume || rc=1
  run_client tls-permissive-tls env COMPAT_TLS_CA="$dir/pki/ca.pem" "$harness" "127.0.0.1:$ns" tag-filter || rc=1
  ok=$(tls_counts ok); plain=$(tls_counts plaintext)
  echo "# tls-permissive: handshakes ok $ok, plaintext served $plain"
  if [[ $ok -lt 2 || $plain -lt 2 ]]; then echo "FAILED - rocketmq tls-permissive: handshake counts"; rc=1; fi
  stop_rokka "$pid" || rc=1
fi
end_case $rc tls-permissive
# A client certificate names the principal the ACLs decide for (as Kafka's
# SSL principal, `User:<subject DN>`): the certificate's CN=alice is a super
# user, a plaintext client beside it on the permissive port is
# User:ANONYMOUS and refused (NO_PERMISSION).
tls_case tls-certificate-principal permissive yes "[security]" "authorization = true" 'super_users = ["User:CN=alice"]'
if [[ $rc == 0 ]]; then
  run_client tls-alice-certificate env COMPAT_TLS_CA="$dir/pki/ca.pem" COMPAT_TLS_CERT="$dir/pki/client.pem" \
    COMPAT_TLS_KEY="$dir/pki/client.key" "$harness" "127.0.0.1:$ns" send-consume || rc=1
  refused tls-anonymous-plaintext "$harness" "127.0.0.1:$ns" send-consume || rc=1
  denied=$(metric_sum rokka_authorization_denied_total 'protocol="rocketmq"')
  echo "# tls-certificate-principal: RocketMQ requests denied: $denied"
  if [[ $denied -lt 1 ]]; then echo "FAILED - rocketmq tls-certificate-principal: nothing denied"; rc=1; fi
  stop_rokka "$pid" || rc=1
fi
end_case $rc tls-certificate-principal

# two_phase NAME FIRST SECOND [config lines]: FIRST, a restart, then SECOND
# on the same data (and the same ports).
two_phase() {
  local name=$1 first=$2 second=$3; shift 3
  new_case "$name"; write_config "$@"; rc=0; start_rokka || rc=1
  if [[ $rc == 0 ]]; then
    run_client "$first" "$harness" "127.0.0.1:$ns" "$first" || rc=1
    stop_rokka "$pid" || rc=1
  fi
  if [[ $rc == 0 ]]; then
    start_rokka || rc=1
    if [[ $rc == 0 ]]; then
      run_client "$second" "$harness" "127.0.0.1:$ns" "$second" || rc=1
      stop_rokka "$pid" || rc=1
    fi
  fi
  end_case $rc "$name"
}

# Committed offsets survive a restart.
two_phase restart-resume resume-1 resume-2

# Transactions: commit, rollback, and a check-back (short check timings).
new_case transactions; write_config "transaction_timeout_ms = 2000" "transaction_check_interval_ms = 500"
rc=0; start_rokka || rc=1
if [[ $rc == 0 ]]; then
  run_client transactions "$harness" "127.0.0.1:$ns" transactions || rc=1
  stop_rokka "$pid" || rc=1
fi
end_case $rc transactions

# A transaction left open across a restart is checked afterwards; nothing resolves twice.
two_phase transaction-restart tx-restart-1 tx-restart-2 "transaction_timeout_ms = 2000" "transaction_check_interval_ms = 500"

# Delayed messages survive a restart (durable delivery progress).
two_phase delay-restart delay-restart-1 delay-restart-2

# A name server alone (rokka --namesrv-only) and a broker registering with it.
new_case external-namesrv
nsdir=$dir/ns; mkdir -p "$nsdir"
cat > "$nsdir/rokka.toml" <<EOT
[metrics]
enabled = false
[rocketmq]
namesrv_listen = "127.0.0.1:0"
EOT
rc=0
"$ROKKA_BIN" --config "$nsdir/rokka.toml" --namesrv-only --ports-file "$nsdir/ports.json" >> "$dir/rokka.log" 2>&1 &
nspid=$!
if wait_file "$nsdir/ports.json" "$nspid"; then
  ns=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["namesrv"].rsplit(":",1)[1])' "$nsdir/ports.json")
  write_config "namesrv_enabled = false" "namesrv_addr = \"127.0.0.1:$ns\""
  start_rokka || rc=1
  if [[ $rc == 0 ]]; then
    run_client external-namesrv "$harness" "127.0.0.1:$ns" send-consume || rc=1
    stop_rokka "$pid" || rc=1
  fi
else
  echo "FAILED - the name server did not start (log: $dir/rokka.log)"; rc=1
fi
stop_rokka "$nspid" || rc=1
if [[ $rc == 0 ]] && ! grep -q "broker unregistered" "$dir/rokka.log"; then
  echo "FAILED - rocketmq external-namesrv: the broker did not unregister at shutdown"; rc=1
fi
end_case $rc external-namesrv

# A consumer that dies without shutting down: member A consumes a 4-queue
# topic alone (an orderly A holds every queue's lock) and is killed with
# SIGKILL, or stopped with SIGSTOP (hung: its connection stays open, its
# heartbeats stop); member B joins the group and must take A's queues over
# exactly when rokka lets go of A (at once when A's connection closed, after
# client_timeout_ms of silence when it hung, after lock_expiry_ms for the
# locks) and get every later message exactly once (the harness's `takeover`
# says how each is measured). The members renew their locks every 2 s.
# wait_line FILE REGEX PID SECONDS: until a line of FILE matches (false when
# PID exits or SECONDS pass first).
wait_line() {
  local deadline=$((SECONDS + $4))
  while ((SECONDS < deadline)); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}
# takeover_case NAME VARIANT SIGNAL CLIENT_TIMEOUT_MS LOCK_EXPIRY_MS
takeover_case() {
  local name=$1 variant=$2 signal=$3 timeout_ms=$4 expiry_ms=$5
  local lockenv=rocketmq.client.rebalance.lockInterval=2000 apid gone wrapper
  new_case "$name"; write_config "client_timeout_ms = $timeout_ms" "lock_expiry_ms = $expiry_ms"
  rc=0; start_rokka || rc=1
  if [[ $rc == 0 ]]; then
    # (A runs under a subshell that reaps it quietly: no "Killed" notice.)
    (
      env "$lockenv" "$harness" "127.0.0.1:$ns" dying-member "$variant" >> "$dir/member-a.log" 2>&1 &
      echo $! > "$dir/member-a.pid"
      wait
    ) 2>/dev/null &
    wrapper=$!
    wait_file "$dir/member-a.pid" "$wrapper" || true
    apid=$(cat "$dir/member-a.pid" 2>/dev/null || echo "$wrapper")
    if wait_line "$dir/member-a.log" '^compat: ready' "$apid" 90; then
      grep '^compat: ' "$dir/member-a.log" | sed "s/^compat: /#   A: /" || true
      kill "-$signal" "$apid"; gone=$(date +%s%3N)
      run_client "$name" env "$lockenv" "$harness" "127.0.0.1:$ns" takeover "$variant" "$gone" "$timeout_ms" "$expiry_ms" || rc=1
    else
      echo "FAILED - rocketmq $name: member A never got ready (logs: $dir)"
      grep -v INFO "$dir/member-a.log" | tail -20 || true
      rc=1
    fi
    kill -KILL "$apid" 2>/dev/null || true
    wait "$wrapper" 2>/dev/null || true
    stop_rokka "$pid" || rc=1
  fi
  if [[ $rc == 0 && $variant == hang ]]; then
    # rokka expired the hung A once (and B, heartbeating, never).
    n=$(sed 's/\x1b\[[0-9;]*m//g' "$dir/rokka.log" | grep -c 'RocketMQ client expired.*@takeover-a' || true)
    nb=$(sed 's/\x1b\[[0-9;]*m//g' "$dir/rokka.log" | grep -c 'RocketMQ client expired.*@takeover-b' || true)
    echo "#   rokka: expired A $n time(s), B $nb time(s)"
    if [[ $n != 1 || $nb != 0 ]]; then echo "FAILED - rocketmq $name: want A expired once, B never"; rc=1; fi
  fi
  if [[ $rc == 0 ]]; then : > "$dir/member-a.log"; rm -f "$dir/member-a.pid"; fi
  end_case $rc "$name"
}
takeover_case takeover-push push KILL 60000 60000
takeover_case takeover-hang hang STOP 20000 60000
takeover_case takeover-orderly orderly KILL 15000 30000

echo "rocketmq: $passed passed, $failed failed"
[[ $failed == 0 ]]
