"""A broker out of file descriptors: rokka runs under an open-file limit of
NOFILE (soft and hard, so it cannot raise it) and idle sockets take every
descriptor it has left. Accepts fail with EMFILE on every listener that is
connected to; each listener pauses 100 ms after a failure, counts it
(`rokka_accept_errors_total{listener}`) and logs at most once a minute —
not ten lines a second, as before. Nothing else breaks: once the idle
sockets go, real Kafka and RocketMQ clients connect, produce and consume
(the metrics endpoint, out of descriptors as well, is scraped after).
"""
import os
import socket
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import harness, running  # noqa: E402
from test_names import metric  # noqa: E402

NOFILE = 160


@pytest.fixture(scope="module")
def rokka():
    with running("hostile", "fd_exhaustion", nofile=NOFILE) as r:
        yield r


def test_descriptors_running_out_are_counted_logged_once_and_outlived(rokka):
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all"})
    p.produce("fds", b"before")
    assert p.flush(20) == 0
    del p
    socks = []
    try:
        # More idle connections than rokka has descriptors, to both protocols.
        for i in range(NOFILE + 40):
            port = rokka.kafka_port if i % 2 else rokka.broker_port
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break
        # Rokka keeps failing accepts for a while (the kernel queues the
        # connections it cannot take).
        time.sleep(4)
        with open(rokka.log_path, errors="replace") as f:
            lines = [l for l in f if "accept failed" in l]
        # One per listener that ran out, not one per failure.
        assert 1 <= len(lines) <= 3, lines[:5]
    finally:
        for s in socks:
            s.close()
    # Descriptors come back (the metrics endpoint could not take a scrape
    # either while they were gone): the failures were counted.
    time.sleep(1)
    failed = metric(rokka, "rokka_accept_errors_total")
    assert failed >= 10, f"accepts did not fail: {failed}"
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all"})
    for i in range(100):
        p.produce("fds", b"after-%d" % i)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "fds", "enable.auto.commit": False})
    c.assign([TopicPartition("fds", 0, 0)])
    got = []
    deadline = time.time() + 30
    while len(got) < 101 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert got[0] == b"before" and len(got) == 101
    assert "sent 20" in harness(rokka, "cross-produce", "fds", "20")
