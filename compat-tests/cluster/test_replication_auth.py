"""The replication port serves the set's whole log: only to a node of the
cluster. Plaintext (no `replication_certificate`), a node proves it knows
the cluster secret (in etcd) by an HMAC over its HELLO; a stranger that
names a live member's id — it can read the ids in Metadata — without it
is refused and counted (`rokka_replication_unauthenticated_total`), and the
real replicas keep replicating."""
import base64
import json
import socket
import struct
import time

from confluent_kafka import Producer
from conftest import Cluster, etcd_get, read_topic, signed_hello

HELLO, REFUSE = 1, 3


def replication_addr(cluster, node):
    """Where node `node` serves replicas (its registration in etcd)."""
    info = json.loads(etcd_get(cluster.etcd.endpoint, f"/rokka/{cluster.name}/nodes/{node}"))
    host, port = info["replication"].rsplit(":", 1)
    return host, int(port)


def hello_answer(addr, hello):
    """Sends a HELLO frame: the answer's (kind, payload)."""
    payload = json.dumps(hello).encode()
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(struct.pack(">IB", len(payload) + 1, HELLO) + payload)
        n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
        data = s.recv(n, socket.MSG_WAITALL)
    return data[0], data[1:]


def test_a_stranger_naming_a_member_is_not_served_the_log():
    name = "repl-auth"
    cluster = Cluster(name, n=2, min_isr=2)
    try:
        assert cluster.wait_in_sync(size=2)
        m = cluster.master()
        other = next(i for i in cluster.nodes if i != m)
        addr = replication_addr(cluster, m)
        base = {
            "cluster": name,
            "set": "broker-a",
            "node_id": other,
            "epochs": [],
            "end": 0,
            "segment_bytes": 67108864,  # the fixture's store.commitlog_segment_bytes
        }
        forged = {**base, "at": int(time.time() * 1000), "proof": base64.b64encode(b"x" * 32).decode()}
        other_secret = json.loads(signed_hello(cluster, other, secret=b"y" * 32))
        for hello in (base, forged, other_secret):
            kind, why = hello_answer(addr, hello)
            assert kind == REFUSE, f"{hello}: answered {kind} {why[:200]!r}"
            assert b"cluster secret" in why, why
        seen = cluster.nodes[m].metric_values()
        assert seen.get('rokka_replication_unauthenticated_total{side="master"}', 0) >= 3, seen
        # Signed with the cluster's secret, a HELLO passes the proof and is
        # judged on what it says (node 99 is no member): what is refused
        # above is the proof, nothing else.
        kind, why = hello_answer(addr, json.loads(signed_hello(cluster, 99)))
        assert kind == REFUSE and b"not a live member" in why, why
        # The real replica still replicates: acks=all needs it.
        p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "message.timeout.ms": 20000})
        acked = []
        for i in range(5):
            p.produce("auth", value=f"v{i}".encode(), on_delivery=lambda e, msg: e is None and acked.append(msg))
        p.flush(30)
        assert len(acked) == 5
        assert cluster.wait_in_sync(size=2)
        assert sorted(read_topic(cluster.bootstrap(), "auth", 2)) == [f"v{i}" for i in range(5)]
    finally:
        cluster.close()
