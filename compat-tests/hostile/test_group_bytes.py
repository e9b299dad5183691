"""A client that joins many groups with as much member metadata as a
request may carry (JoinGroup v1, raw frames): what the group coordinator
holds in memory stops at `group.max_member_bytes`. Joins past it are
answered COORDINATOR_NOT_AVAILABLE (retriable), the gauge stays within the
budget, a real consumer (librdkafka) forms its group and consumes, and the
hostile members' bytes are let go when their sessions run out."""
import os
import socket
import struct
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402
from test_hostile import kafka_frame, recv_exact  # noqa: E402

BUDGET = 4 << 20
META = 100 * 1024
JOINS = 100
SESSION_MS = 6000


@pytest.fixture(scope="module")
def rokka():
    with running(
        "hostile",
        "group_bytes",
        group_extra=f"max_member_bytes = {BUDGET}\ninitial_rebalance_delay_ms = 0\n",
    ) as r:
        yield r


def kstr(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def join_v1(group):
    body = (
        kstr(group)
        + struct.pack(">ii", SESSION_MS, SESSION_MS)
        + kstr("")  # member id: a new member
        + kstr("consumer")
        + struct.pack(">i", 1)
        + kstr("range")
        + struct.pack(">i", META)
        + b"\x00" * META
    )
    return body


def gauge(rokka, name):
    for line in rokka.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def refused(rokka):
    for line in rokka.metrics().splitlines():
        if line.startswith("rokka_group_joins_refused_total") and 'reason="max_member_bytes"' in line:
            return float(line.split()[1])
    return 0.0


def test_member_metadata_stops_at_the_budget_and_real_groups_form_after(rokka):
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=30) as s:
        for i in range(JOINS):
            s.sendall(kafka_frame(11, 1, join_v1(f"fat-{i}"), correlation=i))
        codes = []
        for _ in range(JOINS):
            n = struct.unpack(">i", recv_exact(s, 4))[0]
            frame = recv_exact(s, n)
            _corr, err = struct.unpack(">ih", frame[:6])
            codes.append(err)
    taken = codes.count(0)
    assert codes.count(15) == JOINS - taken, codes  # the rest COORDINATOR_NOT_AVAILABLE
    # About BUDGET / META members fit.
    assert BUDGET // META // 2 <= taken <= BUDGET // META, codes
    # The coordinator's metrics are exported every few seconds.
    deadline = time.time() + 15
    while refused(rokka) < JOINS - taken and time.time() < deadline:
        time.sleep(0.2)
    assert refused(rokka) >= JOINS - taken
    held = gauge(rokka, "rokka_group_member_bytes")
    assert taken * META <= held <= BUDGET, held
    # A real consumer meanwhile (its small join fits in what is left, or it
    # retries until the silent members' sessions run out).
    topic = f"gb-{uuid.uuid4().hex[:8]}"
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    p.produce(topic, b"real")
    assert p.flush(10) == 0
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": f"real-{topic}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    try:
        c.subscribe([topic])
        got = None
        deadline = time.time() + SESSION_MS / 1000 + 30
        while got is None and time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got = m.value()
        assert got == b"real"
    finally:
        c.close()
    # The silent members' sessions run out and their bytes are let go.
    deadline = time.time() + SESSION_MS / 1000 + 20
    while gauge(rokka, "rokka_group_member_bytes") >= BUDGET // 2 and time.time() < deadline:
        time.sleep(0.5)
    assert gauge(rokka, "rokka_group_member_bytes") < BUDGET // 2
