"""etcd (Debian's etcd-server) and a set of rokka nodes in cluster mode, on
loopback ports, for the cluster suite."""
import base64
import hashlib
import hmac
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request

from confluent_kafka import Consumer, KafkaError, TopicPartition

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import Rokka, free_port, results_dir  # noqa: E402

ETCD = os.environ.get("ROKKA_ETCD_BIN", shutil.which("etcd") or "/usr/bin/etcd")


class Etcd:
    """One etcd member with a temporary data directory."""

    def __init__(self, workdir, args=()):
        """`args`: more etcd flags."""
        self.workdir = workdir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.log = open(os.path.join(workdir, "etcd.log"), "ab")
        url = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.endpoint = url
        self.proc = subprocess.Popen(
            [
                ETCD,
                "--name", "e0",
                "--data-dir", os.path.join(workdir, "etcd-data"),
                "--listen-client-urls", url,
                "--advertise-client-urls", url,
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"e0={peer}",
                *args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if json.load(r).get("health") == "true":
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}")
            time.sleep(0.1)
        raise RuntimeError("etcd not healthy within 20 s")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        shutil.rmtree(os.path.join(self.workdir, "etcd-data"), ignore_errors=True)


def read_topic(bootstrap, topic, partitions, timeout=60, **conf):
    """Every value (decoded) of `topic` from offset 0 to each partition's
    end (its last stable offset under read_committed), in poll order."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{time.time_ns()}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **conf,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values, eof = [], set()
    deadline = time.time() + timeout
    while len(eof) < partitions and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                eof.add(m.partition())
            continue
        values.append(m.value().decode())
    c.close()
    assert len(eof) == partitions, f"end of {sorted(eof)} of {partitions} partitions within {timeout} s"
    return values


def remoting(port, code, ext, timeout=5, version=475, body=b""):
    """One raw RocketMQ remoting call: (response code, ext fields, body)."""
    header = json.dumps(
        {"code": code, "language": "JAVA", "version": version, "opaque": 1, "flag": 0, "extFields": ext}
    ).encode()
    frame = struct.pack(">I", 4 + len(header) + len(body)) + struct.pack(">I", len(header)) + header + body
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(frame)
        n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
        data = b""
        while len(data) < n:
            data += s.recv(n - len(data))
    hlen = struct.unpack(">I", data[:4])[0] & 0xFFFFFF
    h = json.loads(data[4 : 4 + hlen])
    return h["code"], h.get("extFields") or {}, data[4 + hlen :].decode()



def etcd_get(endpoint, key):
    """The value of `key` in etcd (its v3 JSON gateway), or None."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    req = urllib.request.Request(f"{endpoint}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        kvs = json.load(r).get("kvs") or []
    return base64.b64decode(kvs[0]["value"]) if kvs else None


def signed_hello(cluster, node_id, set_name="broker-a", segment_bytes=67108864, secret=None):
    """A replication HELLO (JSON) as node `node_id` with an empty log,
    signed as a node signs it: HMAC-SHA256 under the cluster secret (from
    etcd, unless `secret`, raw bytes, is given) of its fields."""
    if secret is None:
        secret = base64.b64decode(etcd_get(cluster.etcd.endpoint, f"/rokka/{cluster.name}/internal/secret"))
    hello = {"cluster": cluster.name, "set": set_name, "node_id": node_id, "epochs": [], "end": 0,
             "segment_bytes": segment_bytes, "at": int(time.time() * 1000)}
    content = "\n".join(
        ["rokka-replication-hello", cluster.name, set_name, str(node_id), str(hello["at"]), "0",
         str(segment_bytes), "[]"]
    ).encode()
    hello["proof"] = base64.b64encode(hmac.new(secret, content, hashlib.sha256).digest()).decode()
    return json.dumps(hello).encode()


class Cluster:
    """Nodes 1..n of one broker set."""

    def __init__(self, name, n=3, min_isr=2, extra="", metrics_extra="", kafka_extra="", grpc=False, store_base=None,
                 lease_ttl=2, etcd_args=()):
        """`extra`: more `[cluster]` lines, or a function of the node id
        returning them; `grpc`: each node serves RocketMQ 5 clients too;
        `store_base`: the `[store]` lines (the fixture's shared ones when
        None); `etcd_args`: more etcd flags."""
        self.name = name
        self.dir = results_dir("cluster", name)
        self.etcd = Etcd(self.dir, etcd_args)
        self.nodes = {}
        self._make = lambda i, more="": Rokka(
            os.path.join(self.dir, f"node{i}"),
            broker_extra="default_partitions = 2",
            group_extra="initial_rebalance_delay_ms = 0\nmin_session_timeout_ms = 1000",
            metrics_extra=metrics_extra,
            kafka_extra=kafka_extra,
            grpc_extra="" if grpc else None,
            **({} if store_base is None else {"store_base": store_base}),
            cluster_extra=(
                f'etcd_endpoints = ["{self.etcd.endpoint}"]\nname = "{name}"\nnode_id = {i}\n'
                f'min_insync_replicas = {min_isr}\nlease_ttl_secs = {lease_ttl}\n'
                f'{extra(i) if callable(extra) else extra}\n{more}'
            ),
        )
        for i in range(1, n + 1):
            os.makedirs(os.path.join(self.dir, f"node{i}"), exist_ok=True)
            self.nodes[i] = self._make(i)
        for node in self.nodes.values():
            node.start()

    def add_node(self, i, more=""):
        """Node `i` (with `more` [cluster] lines), started now."""
        os.makedirs(os.path.join(self.dir, f"node{i}"), exist_ok=True)
        self.nodes[i] = self._make(i, more)
        self.nodes[i].start()
        return self.nodes[i]

    def bootstrap(self):
        return ",".join(n.bootstrap for n in self.nodes.values() if n.proc)

    def role(self, i):
        try:
            m = self.nodes[i].metric_values()
        except OSError:
            return None
        return {0.0: "unknown", 1.0: "master", 2.0: "replica", 3.0: "fenced"}.get(m.get("rokka_cluster_role"))

    def master(self, timeout=20, exclude=()):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for i, n in self.nodes.items():
                if n.proc and i not in exclude and self.role(i) == "master":
                    return i
            time.sleep(0.1)
        raise AssertionError(f"no master within {timeout} s")

    def wait_in_sync(self, size=3, timeout=30):
        """Whether the master's sync state set reached `size` members."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for i, n in self.nodes.items():
                if not n.proc:
                    continue
                try:
                    m = n.metric_values()
                except OSError:
                    continue
                if m.get("rokka_cluster_role") == 1.0 and m.get("rokka_cluster_sync_state_set_size") == float(size):
                    return True
            time.sleep(0.2)
        return False

    def close(self):
        codes = {}
        for i, n in self.nodes.items():
            codes[i] = n.close()
        self.etcd.close()
        return codes


SETS = {1: "set-a", 2: "set-a", 3: "set-b", 4: "set-b"}


class TwoSets(Cluster):
    """Two broker sets of two nodes (1, 2: set-a; 3, 4: set-b) behind one
    etcd, each set taking writes with one in-sync member (min ISR 1)."""

    def __init__(self, name, metrics_extra="", kafka_extra="", sections="", grpc=False):
        """`sections`: whole config tables after the others (`[security]`...)."""
        super().__init__(
            name,
            n=4,
            min_isr=1,
            extra=lambda i: f'broker_set = "{SETS[i]}"\n{sections}',
            metrics_extra=metrics_extra,
            kafka_extra=kafka_extra,
            grpc=grpc,
        )

    def sets_known(self, i):
        try:
            return self.nodes[i].metric_values().get("rokka_cluster_sets")
        except OSError:
            return None

    def masters(self, timeout=30, exclude=()):
        """{set: master node id} once both sets have one and every running
        node knows both sets (a set a node has not seen yet takes none of
        the topics it creates)."""
        deadline = time.time() + timeout
        found = {}
        while time.time() < deadline:
            found = {
                SETS[i]: i for i, n in self.nodes.items() if n.proc and i not in exclude and self.role(i) == "master"
            }
            if len(found) == 2 and all(self.sets_known(i) == 2 for i, n in self.nodes.items() if n.proc):
                return found
            time.sleep(0.2)
        raise AssertionError(f"masters within {timeout} s: {found}")


class AsOneBroker:
    """A two-set cluster where a suite written for one rokka expects one:
    the Kafka bootstrap lists every node, RocketMQ clients use node 1's name
    server, and the metrics are the masters' summed (each master exports
    its own set's queues)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.bootstrap = cluster.bootstrap()
        self.namesrv_port = cluster.nodes[1].namesrv_port
        self.workdir = cluster.dir

    def metrics(self):
        total = {}
        for i in self.cluster.masters().values():
            for line in self.cluster.nodes[i].metrics().splitlines():
                if line and not line.startswith("#"):
                    k, v = line.rsplit(" ", 1)
                    total[k] = total.get(k, 0.0) + float(v)
        return "\n".join(f"{k} {v}" for k, v in total.items())

    def metric_values(self):
        return {k: float(v) for k, v in (l.rsplit(" ", 1) for l in self.metrics().splitlines())}


def sasl_conf(node, user, password):
    """A SCRAM-SHA-512 client of `node`'s SASL_PLAINTEXT listener."""
    return {
        "bootstrap.servers": f"127.0.0.1:{node.sasl_port}",
        "security.protocol": "sasl_plaintext",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
    }
