"""A three-node set: one master elected, Kafka Metadata names it with the
set as replicas and ISR, acks=all produce goes through it and a consumer
reads from it; replicas refuse writes."""
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from conftest import Cluster, signed_hello


@pytest.fixture(scope="module")
def cluster():
    c = Cluster("smoke")
    yield c
    c.close()


def test_one_master_and_metadata_names_the_set(cluster):
    m = cluster.master()
    # The other nodes follow once their next controller step reads the
    # state the master wrote (a poll interval, more on a loaded machine).
    deadline = time.time() + 15
    while True:
        roles = {i: cluster.role(i) for i in cluster.nodes}
        if sorted(roles.values()) == ["master", "replica", "replica"] or time.time() > deadline:
            break
        time.sleep(0.1)
    assert sorted(roles.values()) == ["master", "replica", "replica"], roles
    assert roles[m] == "master", roles
    a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "enable.idempotence": True})
    for i in range(100):
        p.produce("smoke", key=str(i).encode(), value=f"v{i}".encode())
    assert p.flush(30) == 0
    md = a.list_topics("smoke", timeout=10)
    assert sorted(md.brokers) == [1, 2, 3]
    for part in md.topics["smoke"].partitions.values():
        assert part.leader == m
        assert sorted(part.replicas) == [1, 2, 3]
    deadline = time.time() + 15
    while time.time() < deadline:
        isr = sorted(a.list_topics("smoke", timeout=10).topics["smoke"].partitions[0].isrs)
        if isr == [1, 2, 3]:
            break
        time.sleep(0.2)
    assert isr == [1, 2, 3]
    c = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": "smoke", "auto.offset.reset": "earliest"})
    c.subscribe(["smoke"])
    got = set()
    deadline = time.time() + 30
    while len(got) < 100 and time.time() < deadline:
        msg = c.poll(0.5)
        if msg is not None and not msg.error():
            got.add(msg.value())
    c.close()
    assert len(got) == 100


def test_a_topics_min_insync_replicas_is_held_against_the_sync_state_set(cluster):
    """min.insync.replicas=2 or 3 (a common production setting) on a topic
    of a three-node set: acks=all writes go through while the sync state
    set has that many; 4 is more than the set has: NOT_ENOUGH_REPLICAS
    before anything is appended, as Kafka refuses below its ISR."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic

    cluster.wait_in_sync(3)
    a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    topics = {n: f"smoke-minisr-{n}" for n in (2, 3, 4)}
    fs = a.create_topics([NewTopic(t, 1, config={"min.insync.replicas": str(n)}) for n, t in topics.items()])
    for f in fs.values():
        f.result(15)
    for n, t in topics.items():
        errors = []
        p = Producer({
            "bootstrap.servers": cluster.bootstrap(), "acks": "all", "enable.idempotence": True,
            "message.timeout.ms": 5000,
        })
        for i in range(5):
            p.produce(t, value=f"v{i}".encode(), on_delivery=lambda e, m: errors.append(e))
        p.flush(20)
        if n <= 3:
            assert errors == [None] * 5, (n, errors)
        else:
            assert len(errors) == 5 and all(e is not None for e in errors), errors
            assert any(e.code() in (KafkaError.NOT_ENOUGH_REPLICAS, KafkaError._MSG_TIMED_OUT) for e in errors), errors


def test_a_long_poll_is_answered_once_the_replicas_have_the_records(cluster):
    """A fetch sees what the high watermark covers: a consumer waiting in a
    long poll (fetch.wait.max.ms 5 s here) is answered when the set's
    replicas have taken new records and the watermark moved — not at the
    end of its poll (the append itself comes before the watermark)."""
    from confluent_kafka import TopicPartition

    topic = "smoke-latency"
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "linger.ms": 0, "enable.idempotence": True})
    p.produce(topic, b"first", partition=0)
    assert p.flush(30) == 0
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "group.id": "smoke-latency",
            "fetch.wait.max.ms": 5000,
            "enable.auto.commit": False,
        }
    )
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.time() + 30
        first = None
        while first is None and time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                first = m.value()
        assert first == b"first"
        waits = []
        for i in range(4):
            # The consumer is in its next long poll by now.
            time.sleep(1.0)
            t0 = time.time()
            p.produce(topic, f"m{i}".encode(), partition=0)
            assert p.flush(30) == 0
            got = None
            while got != f"m{i}".encode() and time.time() < t0 + 15:
                m = c.poll(0.1)
                if m is not None and m.error() is None:
                    got = m.value()
            assert got == f"m{i}".encode()
            waits.append(time.time() - t0)
        assert max(waits) < 2.0, f"records reached the consumer after {waits} s (its poll is 5 s)"
    finally:
        c.close()


def list_offsets(port, topic, current_leader_epoch):
    """ListOffsets v4 (latest) with a current leader epoch, raw over a socket
    with kafka-python's own request and response classes: (error, leader_epoch)."""
    import io
    import socket
    import struct

    from kafka.protocol.old.list_offsets import ListOffsetsRequest_v4, ListOffsetsResponse_v4

    req = ListOffsetsRequest_v4(
        replica_id=-1, isolation_level=0, topics=[(topic, [(0, current_leader_epoch, -1)])]
    )
    client = b"epoch-test"
    body = struct.pack(">hhih", 2, 4, 7, len(client)) + client + req.encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        n = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        data = b""
        while len(data) < n:
            data += s.recv(n - len(data))
    resp = ListOffsetsResponse_v4.decode(io.BytesIO(data[4:]))
    part = resp.topics[0][1][0]
    return part[1], part[4]


def test_stale_and_future_leader_epochs_are_refused(cluster):
    """KIP-320 fencing with the set's epoch: the current epoch is served and
    reported, an older one is FENCED_LEADER_EPOCH, a newer one
    UNKNOWN_LEADER_EPOCH."""
    m = cluster.master()
    port = cluster.nodes[m].kafka_port
    err, epoch = list_offsets(port, "smoke", -1)
    assert err == 0 and epoch >= 1, (err, epoch)
    assert list_offsets(port, "smoke", epoch) == (0, epoch)
    assert list_offsets(port, "smoke", epoch - 1)[0] == 74  # FENCED_LEADER_EPOCH
    assert list_offsets(port, "smoke", epoch + 1)[0] == 75  # UNKNOWN_LEADER_EPOCH
    # A replica does not answer for the partition (Kafka's
    # fetchOnlyFromLeader): NOT_LEADER_OR_FOLLOWER, so a client that asked
    # it (stale metadata) looks up the leader again.
    replica = next(i for i in cluster.nodes if i != m)
    assert list_offsets(cluster.nodes[replica].kafka_port, "smoke", -1)[0] == 6


def test_the_replication_port_refuses_strangers_and_lying_lengths(cluster):
    """A frame length past the cap closes the connection before anything is
    read into memory; a HELLO from a node that is not a live member of the
    set is refused; the set keeps working."""
    import json
    import socket
    import struct

    m = cluster.master()
    port = cluster.nodes[m].ports["replication"]

    def closed(s):
        s.settimeout(5)
        try:
            return s.recv(1) == b""
        except ConnectionResetError:
            return True

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(struct.pack(">I", 0xFFFFFFF0) + b"\x01")
        assert closed(s)
    unsigned = json.dumps(
        {"cluster": "smoke", "set": "broker-a", "node_id": 99, "epochs": [], "end": 0, "segment_bytes": 67108864}
    ).encode()
    # Without the cluster secret's proof: refused before anything else is
    # said; with it, a node that is not a live member is refused.
    for hello, why in ((unsigned, b"cluster secret"), (signed_hello(cluster, 99), b"not a live member")):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(struct.pack(">I", len(hello) + 1) + b"\x01" + hello)
            n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
            frame = s.recv(n, socket.MSG_WAITALL)
            assert frame[0] == 3 and why in frame, frame
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all"})
    p.produce("smoke", value=b"after strangers")
    assert p.flush(30) == 0
