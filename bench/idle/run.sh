#!/usr/bin/env bash
# Broker memory with 10,000 idle connections: starts a release rokka with
# its defaults (per-address limit 2,000), opens 2,500 connections from each
# of four loopback source addresses to one listener (Kafka by default, or
# `broker` for the RocketMQ broker port), and prints rokka's RSS before,
# with all of them open, and after they close.
#   bash bench/idle/run.sh [kafka|broker] [connections]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
listener=${1:-kafka}
total=${2:-10000}
(cd "$root" && cargo build --release -q -p rokka-server --locked)
dir=$(mktemp -d -p "$root/target")
trap 'rm -rf "$dir"' EXIT
cat > "$dir/rokka.toml" <<EOT
[log]
level = "warn"
[metrics]
listen = "127.0.0.1:0"
[store]
data_dir = "$dir/data"
preallocate = false
[kafka]
listen = "127.0.0.1:0"
max_connections_per_ip = 2500
[rocketmq]
namesrv_listen = "127.0.0.1:0"
broker_listen = "127.0.0.1:0"
max_connections_per_ip = 2500
EOT
"$root/target/release/rokka" --config "$dir/rokka.toml" --ports-file "$dir/ports.json" > "$dir/rokka.log" 2>&1 &
pid=$!
for _ in $(seq 300); do [[ -s $dir/ports.json ]] && break; sleep 0.1; done
rc=0
python3 - "$dir/ports.json" "$listener" "$total" "$pid" <<'PY' || rc=$?
import json, resource, socket, sys, time
ports = json.load(open(sys.argv[1]))
listener, total, pid = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
host, port = ports[listener].rsplit(":", 1)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, total + 1024), hard))
def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
before = rss()
socks = []
for i in range(total):
    src = f"127.0.0.{2 + i % 4}"
    s = socket.socket()
    s.bind((src, 0))
    s.connect((host, int(port)))
    socks.append(s)
time.sleep(2)
with_all = rss()
# Still serving: one more connection from a fifth address gets an answer.
probe = socket.create_connection((host, int(port)), timeout=5)
probe.close()
print(f"{listener}: {len(socks)} idle connections open")
print(f"rokka RSS: {before / 1024:.1f} MiB before, {with_all / 1024:.1f} MiB with them open "
      f"({(with_all - before) / len(socks):.1f} KiB per connection)")
for s in socks:
    s.close()
time.sleep(2)
print(f"rokka RSS after they closed: {rss() / 1024:.1f} MiB")
PY
kill -TERM $pid
code=0; wait $pid || code=$?
if [[ $code != 0 ]]; then echo "FAILED: rokka exited with $code"; tail -20 "$dir/rokka.log"; rc=1; fi
exit $rc
