"""Clients that send requests and never read the answers. Their socket
buffers fill and rokka's writes to them stop; each answer holds the request
bytes it reserved from the listener's budget (and, for RocketMQ, an
in-flight slot). A connection whose client read nothing for idle_timeout_ms
is closed (rokka_connections_write_stalled_total), so nothing stays held,
while a real client keeps producing and consuming beside it."""
import os
import socket
import struct
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402
from test_hostile import kafka_frame, rmq_frame, rss_kib  # noqa: E402
from test_names import kstr, metric  # noqa: E402

TOPIC = "unread"
RECORDS = 24
RECORD_BYTES = 512 * 1024
UNWRITTEN_CAP = 8 << 20


@pytest.fixture(scope="module")
def rokka():
    with running(
        "hostile",
        "unread",
        kafka_extra="idle_timeout_ms = 3000",
        rocketmq_extra=f"idle_timeout_ms = 3000\nmax_unwritten_bytes_per_connection = {UNWRITTEN_CAP}",
    ) as r:
        p = Producer({"bootstrap.servers": r.bootstrap, "acks": "all", "linger.ms": 5})
        for i in range(RECORDS):
            p.produce(TOPIC, value=bytes([i % 251]) * RECORD_BYTES, partition=0)
        assert p.flush(60) == 0
        yield r


def unread_socket(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A small receive window: the answers pile up in rokka's writes.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    return s


def wait_for(pred, secs):
    end = time.time() + secs
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.25)
    return False


def consume_all(rokka, group):
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([TOPIC])
    got = 0
    end = time.time() + 60
    while got < RECORDS and time.time() < end:
        m = c.poll(1.0)
        if m is not None and not m.error():
            got += 1
    c.close()
    return got


def pull_fields(group):
    """A PULL_MESSAGE's header: queue 0 of the topic from offset 0, no long
    poll, 32 messages (up to max_pull_bytes)."""
    return {
        "consumerGroup": group,
        "topic": TOPIC,
        "queueId": "0",
        "queueOffset": "0",
        "maxMsgNums": "32",
        "sysFlag": "2",
        "commitOffset": "0",
        "suspendTimeoutMillis": "0",
        "subscription": "*",
        "subVersion": "0",
        "expressionType": "TAG",
    }


def test_a_kafka_client_that_reads_no_answer_is_closed_and_frees_its_budget(rokka):
    before = metric(rokka, "rokka_connections_write_stalled_total")
    conns = metric(rokka, "rokka_kafka_connections")
    s = unread_socket(rokka.kafka_port)
    try:
        # Fetch v4 of the whole partition (12 MiB) from offset 0: the
        # answer cannot fit in the socket buffers of a client not reading.
        part = struct.pack(">iqi", 0, 0, 64 << 20)
        body = struct.pack(">iiiib", -1, 100, 1, 64 << 20, 0)
        body += struct.pack(">i", 1) + kstr(TOPIC) + struct.pack(">i", 1) + part
        s.sendall(kafka_frame(1, 4, body))
        assert wait_for(lambda: metric(rokka, "rokka_kafka_connections") > conns, 10)
        # A real consumer reads everything meanwhile.
        assert consume_all(rokka, "unread-k1") == RECORDS
        assert wait_for(lambda: metric(rokka, "rokka_connections_write_stalled_total") > before, 30), (
            "the connection of a client reading nothing was never closed"
        )
        assert wait_for(lambda: metric(rokka, "rokka_kafka_connections") <= conns, 10)
    finally:
        s.close()


def test_a_rocketmq_client_that_reads_no_answer_is_closed(rokka):
    """It keeps sending (so the reader's idle clock never runs out) and
    reads nothing: the answers it does not read close it."""
    before = metric(rokka, "rokka_connections_write_stalled_total")
    s = unread_socket(rokka.broker_port)
    s.settimeout(0.5)
    ext = pull_fields("unread-cg")
    closed = False
    try:
        # Pulls of up to max_pull_bytes (4 MiB) each, one every 100 ms:
        # the answers queue behind a stalled write.
        end = time.time() + 30
        opaque = 0
        while time.time() < end:
            opaque += 1
            try:
                s.sendall(rmq_frame(11, opaque, ext))
            except socket.timeout:
                pass  # rokka reads no more of it: still open
            except OSError:
                closed = True
                break
            if metric(rokka, "rokka_connections_write_stalled_total") > before:
                break
            time.sleep(0.1)
        stalled = {
            k: v for k, v in rokka.metric_values().items() if k.startswith("rokka_connections_write_stalled_total")
        }
        assert any('listener="rocketmq_broker"' in k and v >= 1 for k, v in stalled.items()), (closed, stalled)
        assert wait_for(lambda: metric(rokka, "rokka_rocketmq_unwritten_answers") == 0, 10)
        # The store and the listener serve on.
        assert consume_all(rokka, "unread-k2") == RECORDS
    finally:
        s.close()


def test_pulls_a_client_does_not_read_take_no_more_than_its_connections_bytes(rokka):
    """Pipelined pulls (4 MiB answers each) from a client reading nothing:
    past max_unwritten_bytes_per_connection its next requests are not read
    and its pulls get one message each, so rokka's memory does not grow by
    the answers of every pull it sent (hundreds of MiB here)."""
    waits = metric(rokka, "rokka_rocketmq_unwritten_bytes_waits_total")
    base = rss_kib(rokka.proc.pid)
    peak = base
    s = unread_socket(rokka.broker_port)
    s.settimeout(0.2)
    ext = pull_fields("unread-cg2")
    try:
        frames = b"".join(rmq_frame(11, i + 1, ext) for i in range(400))
        try:
            s.sendall(frames)
        except (socket.timeout, OSError):
            pass  # rokka stopped reading: what it took is what counts
        end = time.time() + 2.5
        while time.time() < end:
            peak = max(peak, rss_kib(rokka.proc.pid))
            time.sleep(0.05)
        waited = metric(rokka, "rokka_rocketmq_unwritten_bytes_waits_total") - waits
    finally:
        s.close()
    grown_mib = (peak - base) / 1024
    # Unbounded: up to 400 answers of 4 MiB. Bounded: the cap, plus one
    # 512 KiB message for each pull already read when the cap was reached.
    assert grown_mib < 300, f"rokka grew by {grown_mib:.0f} MiB"
    assert waited > 0
    assert wait_for(lambda: metric(rokka, "rokka_rocketmq_unwritten_bytes") == 0, 15)
