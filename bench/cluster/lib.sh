# Shared by bench/cluster/run.sh and sets.sh (sourced): free ports, the
# processes a run started (stopped on exit), a rokka node and an etcd.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
nodes=()
start_node() { # dir -> $addr (its Kafka address); its pid joins $pids and $nodes (not in a subshell: the pid must reach them)
  "$rokka" --config "$1/rokka.toml" --ports-file "$1/ports.json" > "$1/rokka.log" 2>&1 & pids+=($!); nodes+=($!)
  for _ in $(seq 300); do [[ -s $1/ports.json ]] && break; sleep 0.1; done
  addr=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["kafka"])' "$1/ports.json")
}
start_etcd() { # dir -> $etcd_url
  local cp pp; cp=$(port); pp=$(port)
  "$etcd_bin" --name e0 --data-dir "$1/etcd" --listen-client-urls "http://127.0.0.1:$cp" \
    --advertise-client-urls "http://127.0.0.1:$cp" --listen-peer-urls "http://127.0.0.1:$pp" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pp" --initial-cluster "e0=http://127.0.0.1:$pp" \
    > "$1/etcd.log" 2>&1 & pids+=($!)
  etcd_url="http://127.0.0.1:$cp"
  sleep 2
}
