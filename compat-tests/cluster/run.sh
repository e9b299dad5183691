#!/usr/bin/env bash
# Cluster suite: etcd (Debian's etcd-server, installed here if missing,
# started by the tests on loopback ports with a temporary data dir) and
# three rokka nodes in cluster mode; real Kafka clients through failovers,
# the RocketMQ client harness (built here if missing) through a replica.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/compat-venv"

if ! command -v etcd >/dev/null 2>&1 && [[ ! -x /usr/bin/etcd ]]; then
  echo "installing etcd (Debian package etcd-server)"
  if command -v sudo >/dev/null 2>&1 && [[ $(id -u) != 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  # The package's service is not wanted: the tests start their own etcd.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
fi
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/compat-tests/kafka/requirements.txt"
# The RocketMQ client harness (test_rocketmq.py); later suites reuse the build.
(cd "$root/compat-tests/rocketmq/harness" && cargo build --profile ci -q --locked)
if [[ -z ${ROKKA_BIN:-} ]]; then
  (cd "$root" && cargo build -q -p rokka-server --locked)
  export ROKKA_BIN="$root/target/debug/rokka"
fi
cd "$here"
"$venv/bin/python" -m pytest -q -s --timeout 600 -p no:cacheprovider "$@"
# RocketMQ 5 clients on two broker sets (test_grpc_sets.py, skipped above):
# the Python client pins its own protobuf, so it runs in the rocketmq5
# suite's venv (made here if missing), with confluent-kafka for the fixture.
g_venv="$root/target/rmq5-venv"
if [[ ! -x $g_venv/bin/python ]]; then
  python3 -m venv "$g_venv"
fi
"$g_venv/bin/pip" install -q --disable-pip-version-check -r "$root/compat-tests/rocketmq5/requirements.txt" \
  "$(grep '^confluent-kafka==' "$root/compat-tests/kafka/requirements.txt")"
"$g_venv/bin/python" -m pytest -q -s --timeout 600 -p no:cacheprovider test_grpc_sets.py
# Two cases of compat-tests/cross on two broker sets: the sequential
# migration (a group moved from RocketMQ clients to Kafka clients and back)
# and a live mixed group whose RocketMQ members are replaced by Kafka ones.
cd "$root/compat-tests/cross"
ROKKA_CROSS_ON_TWO_SETS=1 "$venv/bin/python" -m pytest -q -s --timeout 600 -p no:cacheprovider \
  test_cross.py -k "group_moves_from_rocketmq_to_kafka_and_back or replaced_one_by_one"
