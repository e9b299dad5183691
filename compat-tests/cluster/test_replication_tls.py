"""TLS on the replication stream (docs/cluster.md, docs/security.md): a set
of two nodes whose replication port takes only peers holding a certificate
the cluster CA signed, and whose replica checks the master's. Acknowledged
writes (acks=all, two in sync) reach the replica over TLS and survive the
master's kill -9; a plaintext peer, a TLS peer without a certificate and
one with a certificate of another CA get no stream."""
import json
import socket
import ssl
import struct
import time

import pytest
from confluent_kafka import Producer
from conftest import Cluster, read_topic, results_dir, signed_hello
from pki import make_pki

HELLO = 1
REFUSE = 3


@pytest.fixture(scope="module")
def cluster():
    pki = make_pki(results_dir("cluster", "replication-tls-pki"))
    tls = (
        f'replication_certificate = "{pki["node.pem"]}"\nreplication_key = "{pki["node.key"]}"\n'
        f'replication_ca = "{pki["ca.pem"]}"\n'
    )
    c = Cluster("replication-tls", n=2, min_isr=2, extra=tls)
    c.pki = pki
    yield c
    c.close()


def handshakes(node, side, result):
    return sum(
        v
        for k, v in node.metric_values().items()
        if k.startswith("rokka_replication_tls_handshakes_total{") and f'side="{side}"' in k and f'result="{result}"' in k
    )


def hello_frame(cluster, node_id):
    """A HELLO signed with the cluster secret: what a node of the cluster
    sends (the certificate is then what decides)."""
    body = signed_hello(cluster, node_id)
    return struct.pack(">IB", len(body) + 1, HELLO) + body


def read_frame(s):
    head = b""
    while len(head) < 5:
        chunk = s.recv(5 - len(head))
        if not chunk:
            return None
        head += chunk
    n, kind = struct.unpack(">IB", head)
    body = b""
    while len(body) < n - 1:
        chunk = s.recv(n - 1 - len(body))
        if not chunk:
            return None
        body += chunk
    return kind, body


def tls_hello(cluster, port, ca, cert=None, key=None, node_id=99):
    """A HELLO over TLS: the answer frame, or None when the connection
    ends first (the master refused the handshake)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(hello_frame(cluster, node_id))
                return read_frame(s)
        except (ssl.SSLError, ConnectionError):
            return None


def test_only_peers_with_a_cluster_certificate_get_the_stream(cluster):
    m = cluster.master()
    assert cluster.wait_in_sync(size=2), "the replica joins the sync state set over TLS"
    master = cluster.nodes[m]
    replica = next(n for i, n in cluster.nodes.items() if i != m)
    assert handshakes(master, "master", "ok") >= 1
    assert handshakes(replica, "replica", "ok") >= 1
    port = master.ports["replication"]
    failed = handshakes(master, "master", "failed")

    # Plaintext: no frame back, at most a TLS alert.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(hello_frame(cluster, 99))
        got = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except ConnectionError:
            pass
    assert got == b"" or got[0] == 0x15, f"a plaintext HELLO got {got[:40]!r}"

    pki = cluster.pki
    assert tls_hello(cluster, port, pki["ca.pem"]) is None, "a peer without a certificate"
    assert tls_hello(cluster, port, pki["ca.pem"], pki["rogue-node.pem"], pki["rogue-node.key"]) is None, "another CA's node"
    # A certificate of the cluster's CA gets through TLS to the protocol,
    # which still checks who the node is.
    kind, body = tls_hello(cluster, port, pki["ca.pem"], pki["node.pem"], pki["node.key"])
    assert kind == REFUSE and b"not a live member" in body, (kind, body)
    # A certificate of the cluster's CA for someone else (alice's client
    # certificate) cannot pass for the live replica.
    replica_id = next(i for i in cluster.nodes if i != m)
    kind, body = tls_hello(cluster, port, pki["ca.pem"], pki["client.pem"], pki["client.key"], node_id=replica_id)
    assert kind == REFUSE and b"certificate is for" in body, (kind, body)
    assert cluster.wait_in_sync(size=2), "the real replica's stream goes on"

    deadline = time.time() + 10
    while handshakes(master, "master", "failed") < failed + 3 and time.time() < deadline:
        time.sleep(0.2)
    assert handshakes(master, "master", "failed") >= failed + 3


def test_acknowledged_writes_reach_the_replica_over_tls_and_survive_a_kill(cluster):
    m = cluster.master()
    assert cluster.wait_in_sync(size=2)
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "enable.idempotence": True})
    for i in range(200):
        p.produce("tls-repl", key=str(i).encode(), value=f"v{i}".encode())
    assert p.flush(30) == 0
    cluster.nodes[m].kill()
    new = cluster.master(exclude=(m,))
    got = read_topic(cluster.nodes[new].bootstrap, "tls-repl", 2)
    assert sorted(got) == sorted(f"v{i}" for i in range(200))
