"""The store with its default settings (1 GiB CommitLog segments, pages
prepared a window ahead of the writer) under a real client: every other
suite runs small segments without preparation. kafka-python produces and
reads back; the node stays small after a few messages (it used to pre-fault
two whole segments, ~2 GB resident, on the first one) and makes no next
segment yet; after a kill -9 everything acknowledged is read again."""
import os
import sys
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402


@pytest.fixture(scope="module")
def rokka():
    with running("kafka", "store_defaults", store_base="") as r:
        yield r


def resident_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def read_all(rokka, topic, n):
    c = KafkaConsumer(topic, bootstrap_servers=rokka.bootstrap, auto_offset_reset="earliest",
                      consumer_timeout_ms=10000)
    got = [m.value for _, m in zip(range(n), c)]
    c.close()
    return got


def test_default_store_serves_a_few_messages_small_and_survives_kill9(rokka):
    topic = f"defaults-{uuid.uuid4().hex[:6]}"
    bodies = [os.urandom(1024) + f"-{i}".encode() for i in range(200)]
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap, acks="all")
    for b in bodies:
        p.send(topic, b).get(timeout=10)
    p.close()
    assert read_all(rokka, topic, len(bodies)) == bodies
    # One window prepared, not two 1 GiB segments (old: ~2 000 MB).
    rss = resident_mb(rokka.proc.pid)
    assert rss < 256, f"rokka holds {rss:.0f} MB resident after 200 messages"
    segments = os.listdir(os.path.join(rokka.workdir, "data", "commitlog"))
    assert segments == ["0" * 20], segments
    rokka.kill()
    rokka.start()
    assert read_all(rokka, topic, len(bodies)) == bodies
