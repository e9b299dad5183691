"""Small requests that ask for a lot: a Metadata request naming one topic
tens of thousands of times, a Fetch naming one partition as often, a
JoinGroup listing a hundred thousand assignors. Each is answered at the cost
of what it names once (or refused), and a real librdkafka producer and
consumer keep working beside them."""
import os
import socket
import struct
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402
from test_hostile import kafka_frame, uvarint  # noqa: E402
from test_names import call, kstr  # noqa: E402

TOPIC = "amplify"
PARTITIONS = 8
REPEATS = 50_000


@pytest.fixture(scope="module")
def rokka():
    with running("hostile", "amplify", group_extra="max_member_protocols = 16\ninitial_rebalance_delay_ms = 0") as r:
        yield r


def produce_some(rokka, n=50):
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all", "message.timeout.ms": 20000})
    for i in range(n):
        p.produce(TOPIC, value=f"v{i}".encode(), partition=i % PARTITIONS)
    return p.flush(30)


def create_topic(rokka):
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    for f in a.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)]).values():
        f.result(30)


def test_metadata_naming_a_topic_again_and_again_answers_it_once(rokka):
    create_topic(rokka)
    # Metadata v1: topics array of strings.
    body = struct.pack(">i", REPEATS) + kstr(TOPIC) * REPEATS
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=30) as s:
        resp = call(s, kafka_frame(3, 1, body))
    # One topic entry of 8 partitions (each repeat would add ~250 bytes: ~12 MB).
    assert len(resp) < 4096, f"Metadata response of {len(resp)} bytes"
    assert resp.count(TOPIC.encode()) == 1
    assert produce_some(rokka) == 0


def test_a_fetch_naming_a_partition_again_and_again_stalls_no_producer(rokka):
    # Fetch v4: replica, max_wait, min_bytes, max_bytes, isolation, then
    # one topic whose partitions array names partition 0 of an empty topic
    # REPEATS times at offset 0 (nothing to read: it waits on them).
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    for f in a.create_topics([NewTopic("amplify-wait", num_partitions=1, replication_factor=1)]).values():
        f.result(30)
    part = struct.pack(">iqi", 0, 0, 1024)
    body = struct.pack(">iiiib", -1, 20000, 1, 1 << 20, 0)
    body += struct.pack(">i", 1) + kstr("amplify-wait") + struct.pack(">i", REPEATS) + part * REPEATS
    done = {}

    def fetch():
        t = time.time()
        with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=60) as s:
            done["resp"] = call(s, kafka_frame(1, 4, body))
        done["secs"] = time.time() - t

    th = threading.Thread(target=fetch)
    th.start()
    time.sleep(1)
    assert th.is_alive(), "the fetch did not wait"
    # While it waits registered on that partition, appends to other
    # partitions go on, and an append to its partition wakes it.
    t = time.time()
    assert produce_some(rokka, 200) == 0
    produced_in = time.time() - t
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all"})
    p.produce("amplify-wait", value=b"wake", partition=0)
    assert p.flush(30) == 0
    th.join(60)
    assert not th.is_alive(), "the fetch was never answered"
    assert produced_in < 15, f"producing beside the fetch took {produced_in:.1f} s"
    # Woken by the append, well before its 20 s wait ran out.
    assert "resp" in done and done["secs"] < 15, done.get("secs")
    assert b"wake" in done["resp"]


def test_a_join_listing_too_many_protocols_is_refused_and_a_group_still_forms(rokka):
    n = 100_000
    protocols = b"".join(kstr(f"p{i}") + struct.pack(">i", 0) for i in range(n))
    body = kstr("amplify-group") + struct.pack(">i", 10000) + kstr("") + kstr("consumer")
    body += struct.pack(">i", n) + protocols
    t = time.time()
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=30) as s:
        resp = call(s, kafka_frame(11, 0, body))
    err = struct.unpack(">h", resp[4:6])[0]
    assert err == 23, f"JoinGroup with {n} protocols: error {err}"
    assert time.time() - t < 10

    def refused():
        return sum(
            v
            for k, v in rokka.metric_values().items()
            if k.startswith("rokka_group_joins_refused_total") and 'reason="max_member_protocols"' in k
        )

    # (The group counters are brought up to date by the coordinator's tick.)
    deadline = time.time() + 20
    while refused() < 1 and time.time() < deadline:
        time.sleep(0.5)
    assert refused() == 1, refused()
    # A real consumer group on the same name forms and reads.
    assert produce_some(rokka, 8) == 0
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": "amplify-group",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    try:
        c.subscribe([TOPIC])
        got = 0
        deadline = time.time() + 60
        while got == 0 and time.time() < deadline:
            m = c.poll(0.5)
            got += m is not None and m.error() is None
        assert got, "the consumer group read nothing"
    finally:
        c.close()


def test_a_fetch_asking_for_no_bytes_is_answered_at_once(rokka):
    """Kafka answers a Fetch at once when min_bytes are there — min_bytes 0
    at once — rather than after max_wait_ms (here 60 s, past the socket's
    10 s: a wait would fail the read)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    empty = "amplify-empty"
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    for f in a.create_topics([NewTopic(empty, num_partitions=1, replication_factor=1)]).values():
        f.result(30)
    # At its end (offset 0 of an empty partition): nothing to read.
    body = struct.pack(">iiiib", -1, 60_000, 0, 1 << 20, 0)
    body += struct.pack(">i", 1) + kstr(empty) + struct.pack(">i", 1) + struct.pack(">iqi", 0, 0, 1 << 20)
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=10) as s:
        resp = call(s, kafka_frame(1, 4, body))
    assert len(resp) > 8


def test_admin_requests_naming_one_thing_again_and_again_answer_it_once(rokka):
    create_topic_if_missing(rokka)
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=60) as s:
        # DescribeConfigs v1: [resource type, name, keys (null)], synonyms.
        body = struct.pack(">i", REPEATS) + (b"\x02" + kstr(TOPIC) + struct.pack(">i", -1)) * REPEATS + b"\x00"
        resp = call(s, kafka_frame(32, 1, body))
        # One topic's configs (each repeat would add them all again: ~100 MB).
        assert len(resp) < 64 * 1024, f"DescribeConfigs response of {len(resp)} bytes"
        # DescribeLogDirs v1: one topic, partition 0 named REPEATS times.
        body = struct.pack(">i", 1) + kstr(TOPIC) + struct.pack(">i", REPEATS) + struct.pack(">i", 0) * REPEATS
        resp = call(s, kafka_frame(35, 1, body))
        assert len(resp) < 4096, f"DescribeLogDirs response of {len(resp)} bytes"
        # TxnOffsetCommit v0 for 200 000 partitions of a topic that does not
        # exist: answered (each refused) without a pass over the refusals per
        # partition, which took minutes.
        n = 200_000
        parts = b"".join(struct.pack(">iqh", i, 0, -1) for i in range(n))
        body = kstr("tx-amplify") + kstr("g-amplify") + struct.pack(">qh", 1, 0)
        body += struct.pack(">i", 1) + kstr("no-such-topic") + struct.pack(">i", n) + parts
        t0 = time.time()
        s.settimeout(60)
        resp = call(s, kafka_frame(28, 0, body))
        assert time.time() - t0 < 20, "TxnOffsetCommit of many refused partitions took too long"
        assert len(resp) > n * 6
    assert produce_some(rokka) == 0


def create_topic_if_missing(rokka):
    from confluent_kafka.admin import AdminClient

    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    if TOPIC not in a.list_topics(timeout=10).topics:
        create_topic(rokka)


def test_a_topic_named_twice_in_one_create_or_delete_is_an_invalid_request(rokka):
    from confluent_kafka.admin import AdminClient

    name = "named-twice"
    # CreateTopics v2: [name, partitions, replication, assignments, configs], timeout, validate_only.
    topic = kstr(name) + struct.pack(">ihii", 1, 1, 0, 0)
    body = struct.pack(">i", 2) + topic + topic + struct.pack(">ib", 10000, 0)
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=30) as s:
        resp = call(s, kafka_frame(19, 2, body))
        # correlation, throttle, one topic: name, error 42 (INVALID_REQUEST), message.
        count = struct.unpack(">i", resp[8:12])[0]
        off = 12 + 2 + len(name)
        assert (count, struct.unpack(">h", resp[off : off + 2])[0]) == (1, 42), resp[:80]
        assert name not in AdminClient({"bootstrap.servers": rokka.bootstrap}).list_topics(timeout=10).topics
        # DeleteTopics v1 of a topic named twice: the same answer, and the topic stays.
        create_topic_if_missing(rokka)
        body = struct.pack(">i", 2) + kstr(TOPIC) + kstr(TOPIC) + struct.pack(">i", 10000)
        resp = call(s, kafka_frame(20, 1, body))
        count = struct.unpack(">i", resp[8:12])[0]
        off = 12 + 2 + len(TOPIC)
        assert (count, struct.unpack(">h", resp[off : off + 2])[0]) == (1, 42), resp[:80]
    assert TOPIC in AdminClient({"bootstrap.servers": rokka.bootstrap}).list_topics(timeout=10).topics


def test_metadata_naming_a_topic_with_many_ids_answers_it_once(rokka):
    """Metadata v12 names a topic by name and by id: the same name with
    REPEATS different ids is still one topic (answered by name)."""
    create_topic_if_missing(rokka)
    name = TOPIC.encode()
    entry = os.urandom(16) + uvarint(len(name) + 1) + name + b"\x00"
    body = uvarint(REPEATS + 1) + b"".join(os.urandom(16) + entry[16:] for _ in range(REPEATS)) + b"\x00\x00\x00"
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=30) as s:
        resp = call(s, kafka_frame(3, 12, body, flexible=True))
    assert len(resp) < 4096, f"Metadata response of {len(resp)} bytes"
    assert resp.count(name) == 1
    assert produce_some(rokka) == 0


def test_an_offset_fetch_naming_a_partition_again_and_again_answers_it_once(rokka):
    """Each answer of an OffsetFetch repeats the commit's metadata (up to
    4 KiB): a partition named REPEATS times is answered once."""
    from confluent_kafka import TopicPartition

    create_topic_if_missing(rokka)
    group = "amplify-offsets"
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(TOPIC, 0, 1, metadata="m" * 4000)], asynchronous=False)
    c.close()
    # OffsetFetch v1: group, [topic, [partition]].
    body = kstr(group) + struct.pack(">i", 1) + kstr(TOPIC) + struct.pack(">i", REPEATS) + struct.pack(">i", 0) * REPEATS
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=30) as s:
        resp = call(s, kafka_frame(9, 1, body))
    assert len(resp) < 16 * 1024, f"OffsetFetch response of {len(resp)} bytes"
    assert resp.count(b"m" * 4000) == 1


def test_list_offsets_naming_a_partition_again_and_again_looks_it_up_once(rokka):
    """A partition asked for many times in one ListOffsets (librdkafka asks
    twice, validating a fetch from a follower) is looked up once per
    timestamp and the answer repeated: a lookup by time may decode the
    partition's batches, so repeats must not repeat it."""
    create_topic_if_missing(rokka)
    n = 20_000
    # ListOffsets v1: replica_id, [topic, [partition, timestamp]].
    body = struct.pack(">i", -1) + struct.pack(">i", 1) + kstr(TOPIC) + struct.pack(">i", n + 1)
    body += struct.pack(">iq", 0, 0) * n + struct.pack(">iq", 1, -1)
    t0 = time.time()
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=30) as s:
        resp = call(s, kafka_frame(2, 1, body))
    assert time.time() - t0 < 10
    # correlation, [topic: name, [partition, error, timestamp, offset]]
    off = 4 + 4
    tlen = struct.unpack(">h", resp[off:off + 2])[0]
    off += 2 + tlen
    count = struct.unpack(">i", resp[off:off + 4])[0]
    off += 4
    answers = []
    for _ in range(count):
        answers.append(resp[off:off + 4 + 2 + 8 + 8])
        off += 4 + 2 + 8 + 8
    assert len(answers) == n + 1
    assert len(set(answers[:n])) == 1, "a repeated partition got different answers"
    part, err = struct.unpack(">ih", answers[0][:6])
    assert (part, err) == (0, 0)
