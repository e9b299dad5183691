#!/usr/bin/env bash
# Replicated produce throughput: the librdkafka driver of bench/kafka
# (1 KiB, acks=all, idempotent) against a three-node set in cluster mode
# (etcd from Debian's etcd-server, all on loopback, release build), then
# against one node without cluster mode, alternated, two rounds; prints
# each and the ratio. Not part of CI. Needs /usr/bin/etcd.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
(cd "$root" && cargo build --release -q -p rokka-server)
(cd "$root/bench/kafka" && cargo build --release -q)
bench="$root/bench/kafka/target/release/rokka-kafka-bench"
rokka="$root/target/release/rokka"
etcd_bin=$(command -v etcd || echo /usr/bin/etcd)
MESSAGES=${MESSAGES:-300000}
args=(--size 1024 --messages "$MESSAGES" --acks all --idempotent --produce-only --warmup 50000 --warmup-pause-s 3)
# shellcheck source=bench/cluster/lib.sh
source "$here/lib.sh"

node_config() { # dir id etcd_endpoint(or empty)
  cat > "$1/rokka.toml" <<EOT
[log]
level = "warn"
[metrics]
listen = "127.0.0.1:0"
[store]
data_dir = "$1/data"
[broker]
default_partitions = 4
[kafka]
listen = "127.0.0.1:0"
[rocketmq]
enabled = false
EOT
  if [[ -n $3 ]]; then cat >> "$1/rokka.toml" <<EOT
[cluster]
enabled = true
etcd_endpoints = ["$3"]
name = "bench"
node_id = $2
replication_listen = "127.0.0.1:0"
EOT
  fi
}
result() { grep -o '[0-9]* msg/s' | head -1 | cut -d' ' -f1; }

run_cluster() {
  local dir; dir=$(mktemp -d "$root/target/cbench.XXXX")
  start_etcd "$dir"
  local boot=()
  for i in 1 2 3; do mkdir -p "$dir/n$i"; node_config "$dir/n$i" "$i" "$etcd_url"; start_node "$dir/n$i"; boot+=("$addr"); done
  sleep 3
  local list; list=$(IFS=,; echo "${boot[*]}")
  local out; out=$("$bench" --brokers "$list" --topic "c$RANDOM" "${args[@]}")
  echo "# three-node set: $out" >&2
  cleanup; pids=()
  rm -rf "$dir"
  echo "$out" | result
}
run_single() {
  local dir; dir=$(mktemp -d "$root/target/cbench.XXXX")
  node_config "$dir" 0 ""
  local addr; start_node "$dir"
  local out; out=$("$bench" --brokers "$addr" --topic "s$RANDOM" "${args[@]}")
  echo "# one node: $out" >&2
  cleanup; pids=()
  rm -rf "$dir"
  echo "$out" | result
}
for round in 1 2; do
  s=$(run_single); c=$(run_cluster)
  python3 -c "import sys; s,c=float(sys.argv[1]),float(sys.argv[2]); print(f'round $round: one node {s:.0f} msg/s, three-node set {c:.0f} msg/s, ratio {c/s:.2f}')" "$s" "$c"
done
