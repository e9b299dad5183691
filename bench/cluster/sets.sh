#!/usr/bin/env bash
# Several broker sets (docs/benchmarks.md, "Several broker sets"): the
# librdkafka driver of bench/kafka (1 KiB, acks=all, idempotent, 4
# partitions) against (a) one node without cluster mode, (b) one
# single-node set in cluster mode, (c) two single-node sets in cluster mode
# (the topic's partitions placed 2 + 2), alternated, three rounds; prints the
# throughput and the brokers' CPU per message (utime + stime of every
# rokka process over the measured run, after an unmeasured warm-up). Then, on (c), the latency
# of synchronous OffsetCommits from confluent-kafka for a partition on the
# coordinator's set and for one on the other set (forwarded over remoting).
# Release build, loopback only; not part of CI. Needs /usr/bin/etcd and the
# compat venv (bash compat-tests/kafka/run.sh creates it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
(cd "$root" && cargo build --release -q -p rokka-server)
(cd "$root/bench/kafka" && cargo build --release -q)
bench="$root/bench/kafka/target/release/rokka-kafka-bench"
rokka="$root/target/release/rokka"
py="$root/target/compat-venv/bin/python"
etcd_bin=$(command -v etcd || echo /usr/bin/etcd)
MESSAGES=${MESSAGES:-600000}
WARMUP=50000
args=(--size 1024 --acks all --idempotent --produce-only --warmup 0 --warmup-pause-s 0)
# shellcheck source=bench/cluster/lib.sh
source "$here/lib.sh"

node_config() { # dir id set etcd_endpoint(or empty)
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
broker_listen = "127.0.0.1:0"
namesrv_listen = "127.0.0.1:0"
EOT
  if [[ -n $4 ]]; then cat >> "$1/rokka.toml" <<EOT
[cluster]
enabled = true
etcd_endpoints = ["$4"]
name = "bench"
node_id = $2
broker_set = "$3"
min_insync_replicas = 1
replication_listen = "127.0.0.1:0"
EOT
  fi
}
# CPU time of every thread of every rokka process, in ns (schedstat).
cpu_ns() { local p; for p in "${nodes[@]}"; do cat /proc/"$p"/task/*/schedstat; done | awk '{t += $1} END {printf "%.0f\n", t}'; }
measure() { # label brokers -> "msg/s cpu_us_per_msg"
  local before after out rate topic="t$RANDOM"
  # Warm-up, unmeasured: every store prepares its first CommitLog segments
  # (whole 1 GiB files zeroed, about 3 s of CPU each: a cost per store, not
  # per message, that would otherwise dominate; issue 17).
  "$bench" --brokers "$2" --topic "$topic" --messages "$WARMUP" "${args[@]}" > /dev/null
  sleep 6
  before=$(cpu_ns)
  out=$("$bench" --brokers "$2" --topic "$topic" --messages "$MESSAGES" "${args[@]}")
  after=$(cpu_ns)
  rate=$(echo "$out" | grep -o '[0-9]* msg/s' | head -1 | cut -d' ' -f1)
  python3 -c "import sys; r,b,a,n=map(float,sys.argv[1:5]); print(f'{r:.0f} {(a-b)/1e3/n:.2f}')" \
    "$rate" "$before" "$after" "$MESSAGES"
}
scenario() { # plain|one-set|two-sets [latency]
  local dir; dir=$(mktemp -d "$root/target/cbench.XXXX")
  nodes=()
  local boot=()
  case $1 in
    plain) mkdir -p "$dir/n0"; node_config "$dir/n0" 0 "" ""; start_node "$dir/n0"; boot+=("$addr") ;;
    one-set) start_etcd "$dir"; mkdir -p "$dir/n1"; node_config "$dir/n1" 1 set-a "$etcd_url"; start_node "$dir/n1"; boot+=("$addr") ;;
    two-sets) start_etcd "$dir"
      for i in 1 2; do mkdir -p "$dir/n$i"; node_config "$dir/n$i" "$i" "set-$( [[ $i == 1 ]] && echo a || echo b)" "$etcd_url"; start_node "$dir/n$i"; boot+=("$addr"); done ;;
  esac
  sleep 3
  local list; list=$(IFS=,; echo "${boot[*]}")
  echo "$1 $(measure "$1" "$list")"
  if [[ ${2:-} == latency ]]; then "$py" "$here/commit_latency.py" "$list" >&2; fi
  cleanup; pids=(); nodes=()
  rm -rf "$dir"
}
ROUNDS=${ROUNDS:-3}
for round in $(seq "$ROUNDS"); do
  for s in plain one-set two-sets; do
    read -r name rate cpu < <(scenario "$s" "$( [[ $round == "$ROUNDS" && $s == two-sets ]] && echo latency || true)")
    echo "round $round: $name $rate msg/s, broker CPU $cpu us/msg"
  done
done
