#!/usr/bin/env bash
# Kafka compatibility suite: real clients (confluent-kafka/librdkafka,
# kafka-python, kafkajs, Debian's kcat) against a rokka started per test module on
# free loopback ports. Installs its own clients.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/compat-venv"

# kcat, and openssl for the certificates the TLS tests make.
if ! command -v kcat >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
  echo "installing kcat and openssl (Debian packages)"
  if command -v sudo >/dev/null 2>&1 && [[ $(id -u) != 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq kcat openssl >/dev/null
fi
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
# kafka-python 2.0.2 (raw SASL tokens after SaslHandshake v0), beside the
# current one: a venv of its own (test_sasl.py runs it as a subprocess).
kp202="$root/target/kp202-venv"
if [[ ! -x $kp202/bin/python ]]; then
  python3 -m venv "$kp202"
fi
"$kp202/bin/pip" install -q --disable-pip-version-check kafka-python==2.0.2

# The workspace tests built the debug binary already; build it if not.
if [[ -z ${ROKKA_BIN:-} ]]; then
  (cd "$root" && cargo build -q -p rokka-server --locked)
  export ROKKA_BIN="$root/target/debug/rokka"
fi
cd "$here"
# Every part runs even when one fails; the suite fails if any did.
rc=0
# kafkajs first: test_kip848.py describes a group with it too.
(cd "$here/js" && npm ci --no-audit --no-fund --silent) || rc=1
"$venv/bin/python" -m pytest -q --timeout 120 -p no:cacheprovider "$@" || rc=1

# kafka-python's own integration suite: allow-listed tests must pass.
"$venv/bin/python" "$here/suites/run_suite.py" kafka-python || rc=1

# kafkajs, with node's own test runner (files named explicitly: newer Node
# versions treat a directory argument as a module to run, not a folder).
(cd "$here/js" && timeout 600 node --test --test-concurrency=1 ./*.test.mjs) || rc=1
exit $rc
