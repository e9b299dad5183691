#!/usr/bin/env bash
# RocketMQ 5 gRPC suite: the apache/rocketmq-clients Python client
# (rocketmq-python-client, PyPI) against rokka's gRPC listener, with the
# remoting harness (rocketmq-client-rust) and kafka-python for crossings.
# Installs its own clients: a venv of its own (the Python client pins a
# newer protobuf than the Kafka suite's), the harness build, and Apache's
# Rust 5.x client (crates.io `rocketmq`) built in rust/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/rmq5-venv"
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
(cd "$here/js" && npm ci --silent --no-audit --no-fund)
(cd "$root/compat-tests/rocketmq/harness" && cargo build --profile ci -q --locked)
# Apache's Rust RocketMQ 5 client (test_rust.py): ~1.5 min cold on 2 cores.
(cd "$here/rust" && cargo build --profile ci -q --locked)
if [[ -z ${ROKKA_BIN:-} ]]; then
  (cd "$root" && cargo build -q -p rokka-server --locked)
  export ROKKA_BIN="$root/target/debug/rokka"
fi
cd "$here"
"$venv/bin/python" -m pytest -q --timeout 300 -p no:cacheprovider -W ignore::DeprecationWarning "$@"
