#!/usr/bin/env bash
# RocketMQ benchmark with the real client (rocketmq-client-rust 1.0.0, the
# compat harness's `bench` scenario) against a release rokka with async
# flush on free loopback ports. Usage: bash bench/rocketmq/run.sh [scale] [stages]
# (scale multiplies every message count; 1 = the numbers in docs/benchmarks.md;
# stages: all, or a comma list of sync, oneway, consume — the batch stage always
# runs, it fills the topic the consumers read; SKIP_BUILD=1 measures the rokka
# already at target/release/rokka, e.g. a copy of another commit's build).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
scale=${1:-1}
stages=${2:-all}
[[ -n ${SKIP_BUILD:-} ]] || (cd "$root" && cargo build --release -q -p rokka-server --locked)
(cd "$root/compat-tests/rocketmq/harness" && cargo build --release -q --locked)
dir=$(mktemp -d -p "$root/target")
trap 'rm -rf "$dir"' EXIT
cat > "$dir/rokka.toml" <<EOT
[log]
level = "warn"
[metrics]
listen = "127.0.0.1:0"
[store]
data_dir = "$dir/data"
flush_mode = "async"
[kafka]
listen = "127.0.0.1:0"
[rocketmq]
namesrv_listen = "127.0.0.1:0"
broker_listen = "127.0.0.1:0"
EOT
"$root/target/release/rokka" --config "$dir/rokka.toml" --ports-file "$dir/ports.json" > "$dir/rokka.log" 2>&1 &
pid=$!
for _ in $(seq 300); do [[ -s $dir/ports.json ]] && break; sleep 0.1; done
port() { python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))[sys.argv[2]].rsplit(":",1)[1])' "$dir/ports.json" "$1"; }
ns=$(port namesrv); mp=$(port metrics)
rc=0
BENCH_ROKKA_PID=$pid timeout 900 "$root/compat-tests/rocketmq/harness/target/release/rokka-rocketmq-compat" "127.0.0.1:$ns" bench "$scale" "$stages" \
  > "$dir/client.log" 2>&1 || rc=$?
grep '^compat: ' "$dir/client.log" | sed 's/^compat: //'
echo "rokka CPU: $(ps -o times= -p $pid) s"
# Server-side handling time per request code (mean), to tell rokka's share
# of a round trip from the client's.
python3 - "$mp" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
sums, counts = {}, {}
for line in text.splitlines():
    for kind, d in (("_sum{", sums), ("_count{", counts)):
        if line.startswith("rokka_rocketmq_request_seconds" + kind):
            code = line.split('code="')[1].split('"')[0]
            d[code] = float(line.rsplit(" ", 1)[1])
for code in sorted(counts, key=lambda c: -counts[c]):
    if counts.get(code):
        print(f"rokka handling code {code}: {counts[code]:.0f} requests, mean {sums[code] / counts[code] * 1e6:.1f} µs")
PY
kill -TERM $pid
code=0; wait $pid || code=$?
if [[ $rc != 0 ]]; then echo "FAILED: the driver exited with $rc (or did not get every message back)"; tail -20 "$dir/client.log"; fi
if [[ $code != 0 ]]; then echo "FAILED: rokka exited with $code"; tail -20 "$dir/rokka.log"; rc=1; fi
exit $rc
