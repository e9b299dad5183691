#!/usr/bin/env bash
# Kafka compatibility suite: real clients (confluent-kafka/librdkafka,
# kafka-python, kafkajs, Debian's kcat) against a rokka started per test module on
# free loopback ports. Installs its own clients.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/compat-venv"

if ! command -v kcat >/dev/null 2>&1; then
  echo "installing kcat (Debian package)"
  if command -v sudo >/dev/null 2>&1 && [[ $(id -u) != 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq kcat >/dev/null
fi
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"

# The workspace tests built the debug binary already; build it if not.
if [[ -z ${ROKKA_BIN:-} ]]; then
  (cd "$root" && cargo build -q -p rokka-server --locked)
  export ROKKA_BIN="$root/target/debug/rokka"
fi
cd "$here"
"$venv/bin/python" -m pytest -q --timeout 120 -p no:cacheprovider "$@"

# kafka-python's own integration suite: allow-listed tests must pass.
"$venv/bin/python" "$here/suites/run_suite.py" kafka-python

# kafkajs, with node's own test runner.
(cd "$here/js" && npm ci --no-audit --no-fund --silent)
timeout 600 node --test --test-concurrency=1 "$here/js/"
