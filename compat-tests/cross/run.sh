#!/usr/bin/env bash
# Cross-protocol suite: Kafka clients (kafka-python, confluent-kafka) and the
# RocketMQ clients (rocketmq-client-rust, the compat harness; ali-ons, npm) on
# one rokka. Installs its own clients: the Kafka suite's venv, the harness
# build and the npm packages.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/compat-venv"
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/compat-tests/kafka/requirements.txt"
# The web console's test: Debian's headless chromium and its chromedriver,
# driven by selenium (given the driver's path, it downloads nothing).
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "installing chromium and chromium-driver (Debian packages)"
  if command -v sudo >/dev/null 2>&1 && [[ $(id -u) != 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
"$venv/bin/pip" install -q --disable-pip-version-check selenium==4.50.0
(cd "$root/compat-tests/rocketmq/harness" && cargo build --profile ci -q --locked)
# ali-ons, a RocketMQ remoting client in JavaScript (test_alions.py).
(cd "$here/js" && npm ci --silent --no-audit --no-fund)
if [[ -z ${ROKKA_BIN:-} ]]; then
  (cd "$root" && cargo build -q -p rokka-server --locked)
  export ROKKA_BIN="$root/target/debug/rokka"
fi
cd "$here"
"$venv/bin/python" -m pytest -q --timeout 300 -p no:cacheprovider "$@"
