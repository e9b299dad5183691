"""Kafka connections that declare the largest frame they may (100 MiB,
`kafka.max_request_bytes`) and send nothing more: each reserves its
declared size from the listener's budget (256 MiB) before reading. Two
fit; the third waits for room. That waiter must not hold up every other
connection's small requests behind it (it did: the budget served waiters in
order) — librdkafka produces and consumes while they hang on. And a Fetch
asking to wait for days waits `kafka.max_fetch_wait_ms` at most."""
import os
import socket
import struct
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402
from test_hostile import kafka_frame, recv_exact  # noqa: E402
from test_names import metric  # noqa: E402

DECLARED = 100 * 1024 * 1024


@pytest.fixture(scope="module")
def rokka():
    with running("hostile", "declared_frames", kafka_extra="max_fetch_wait_ms = 2000") as r:
        yield r


def test_a_waiting_large_frame_does_not_hold_up_small_requests(rokka):
    hogs = []
    try:
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=10)
            s.sendall(struct.pack(">i", DECLARED) + b"\x00\x03")  # the length and two bytes of it
            hogs.append(s)
        time.sleep(1)
        topic = f"declared-{uuid.uuid4().hex[:8]}"
        t0 = time.time()
        p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all", "message.timeout.ms": 20000})
        for i in range(50):
            p.produce(topic, b"v%d" % i)
        assert p.flush(25) == 0, "records not delivered while the large frames wait"
        c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": topic, "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, 0)])
        got = []
        while len(got) < 50 and time.time() - t0 < 40:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
        c.close()
        assert len(got) == 50
    finally:
        for s in hogs:
            s.close()


def test_a_fetch_asking_to_wait_for_days_waits_the_cap(rokka):
    # Fetch v4: replica -1, max_wait 2^31-1 ms, min_bytes 2^31-1, max_bytes,
    # isolation 0, one topic with one partition at offset 0.
    topic = f"longwait-{uuid.uuid4().hex[:8]}"
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    p.produce(topic, b"x")
    assert p.flush(10) == 0
    t = topic.encode()
    body = (
        struct.pack(">iiiib", -1, 2**31 - 1, 2**31 - 1, 1 << 20, 0)
        + struct.pack(">i", 1)
        + struct.pack(">h", len(t))
        + t
        + struct.pack(">i", 1)
        + struct.pack(">iqi", 0, 0, 1 << 20)
    )
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=30) as s:
        t0 = time.time()
        s.sendall(kafka_frame(1, 4, body, correlation=9))
        n = struct.unpack(">i", recv_exact(s, 4))[0]
        recv_exact(s, n)
        waited = time.time() - t0
    assert 1.5 <= waited < 10, f"answered after {waited:.1f} s"
    assert metric(rokka, "rokka_kafka_fetch_waits_capped_total") >= 1
