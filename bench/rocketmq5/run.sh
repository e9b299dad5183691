#!/usr/bin/env bash
# RocketMQ 5 benchmark: the Python client (rocketmq-python-client, gRPC)
# against a release rokka with async flush, then in the same run the
# remoting path with rocketmq-client-rust (the compat harness's `bench`),
# each with rokka's CPU per message. Usage: bash bench/rocketmq5/run.sh [messages]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
n=${1:-5000}
venv="$root/target/rmq5-venv"
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/compat-tests/rocketmq5/requirements.txt"
(cd "$root" && cargo build --release -q -p rokka-server --locked)
(cd "$root/compat-tests/rocketmq/harness" && cargo build --release -q --locked)
dir=$(mktemp -d -p "$root/target")
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
cat > "$dir/rokka.toml" <<EOT
[log]
level = "warn"
[metrics]
listen = "127.0.0.1:0"
[store]
data_dir = "$dir/data"
flush_mode = "async"
# Segment preallocation (zeroing 1 GiB at start) would be counted in the
# first stage's CPU: off, for both paths.
preallocate = false
[kafka]
listen = "127.0.0.1:0"
[rocketmq]
namesrv_listen = "127.0.0.1:0"
broker_listen = "127.0.0.1:0"
[grpc]
enabled = true
listen = "127.0.0.1:0"
EOT
"$root/target/release/rokka" --config "$dir/rokka.toml" --ports-file "$dir/ports.json" > "$dir/rokka.log" 2>&1 &
pid=$!
for _ in $(seq 300); do [[ -s $dir/ports.json ]] && break; sleep 0.1; done
port() { python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))[sys.argv[2]].rsplit(":",1)[1])' "$dir/ports.json" "$1"; }
echo "== gRPC, rocketmq-python-client, $n messages of 1 KiB per send stage"
timeout 900 "$venv/bin/python" "$root/bench/rocketmq5/bench.py" "$(port grpc)" "$pid" "$n"
cpu() { awk '{print $14+$15}' "/proc/$pid/stat"; }
echo "== remoting, rocketmq-client-rust (harness bench, scale 1)"
c0=$(cpu)
timeout 900 "$root/compat-tests/rocketmq/harness/target/release/rokka-rocketmq-compat" "127.0.0.1:$(port namesrv)" bench 1 sync,consume \
  2>/dev/null | grep '^compat: ' | sed 's/^compat: //'
c1=$(cpu)
echo "rokka CPU over the remoting stages: $(( (c1 - c0) / $(getconf CLK_TCK) )) s (divide by the messages above)"
