#!/usr/bin/env bash
# Hostile-client suite: raw-socket abuse of every port while real clients
# (confluent-kafka, the RocketMQ harness) keep working. Uses the Kafka
# suite's venv and the RocketMQ harness build (built here if missing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/compat-venv"
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/compat-tests/kafka/requirements.txt"
(cd "$root/compat-tests/rocketmq/harness" && cargo build --profile ci -q --locked)
if [[ -z ${ROKKA_BIN:-} ]]; then
  (cd "$root" && cargo build -q -p rokka-server --locked)
  export ROKKA_BIN="$root/target/debug/rokka"
fi
cd "$here"
"$venv/bin/python" -m pytest -q -s --timeout 600 -p no:cacheprovider "$@"
