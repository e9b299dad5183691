"""The RocketMQ 5 Node.js client (rocketmq-client-nodejs) against rokka's
gRPC listener: its producer and SimpleConsumer, and crossings with the
Python client."""
import json
import os
import subprocess
import uuid

from conftest import receive_all
from test_grpc import Clients, message

JS = os.path.join(os.path.dirname(__file__), "js", "client.mjs")


def node(rokka, *args, timeout=90):
    p = subprocess.run(
        ["node", JS, args[0], f"127.0.0.1:{rokka.grpc_port}", *[str(a) for a in args[1:]]],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    assert p.returncode == 0, f"node {args} failed: {lines[-3:]} {p.stderr[-2000:]}"
    return lines


def test_node_producer_to_node_and_python_consumers(rokka):
    topic = f"g5-node-{uuid.uuid4().hex[:8]}"
    sent = [l for l in node(rokka, "produce", topic, 9, "nd") if "sent" in l]
    assert len(sent) == 9 and len({l["sent"] for l in sent}) == 9
    got = [l for l in node(rokka, "consume", topic, f"g5-node-g-{uuid.uuid4().hex[:6]}", 9) if "id" in l]
    assert sorted(bytes.fromhex(l["body"]) for l in got) == sorted(f"nd-{i}-é".encode() for i in range(9))
    for l in got:
        i = int(l["props"]["n"])
        assert l["tag"] == "TagN" and l["keys"] == [f"nk-{i}"] and l["props"]["from"] == "node"
        assert l["group"] == (f"order-{i % 2}" if i % 3 == 1 else "") or (l["group"] is None and i % 3 != 1)
        assert l["attempt"] == 1 and l["corrupted"] is False, l
    assert {l["id"] for l in got} == {l["sent"] for l in sent}
    # The same messages through the Python client.
    clients = Clients(rokka)
    try:
        c = clients.consumer(f"g5-node-py-{uuid.uuid4().hex[:6]}", topic)
        py = receive_all(c, 9)
    finally:
        clients.close()
    assert sorted(m.body for m in py) == sorted(f"nd-{i}-é".encode() for i in range(9))
    assert all(not m.corrupted for m in py)


def test_python_producer_to_node_consumer(rokka):
    topic = f"g5-pynode-{uuid.uuid4().hex[:8]}"
    clients = Clients(rokka)
    try:
        p = clients.producer(topic)
        bodies = [os.urandom(32) for _ in range(6)]
        for i, b in enumerate(bodies):
            p.send(message(topic, b, tag="TagP", keys=f"pk-{i}", props={"i": str(i)}))
    finally:
        clients.close()
    got = [l for l in node(rokka, "consume", topic, f"g5-pynode-g-{uuid.uuid4().hex[:6]}", 6) if "id" in l]
    assert sorted(bytes.fromhex(l["body"]) for l in got) == sorted(bodies)
    for l in got:
        i = int(l["props"]["i"])
        assert bytes.fromhex(l["body"]) == bodies[i]
        assert l["tag"] == "TagP" and l["keys"] == [f"pk-{i}"] and not l["corrupted"]
