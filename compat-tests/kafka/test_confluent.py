"""confluent-kafka (librdkafka 2.16): producer acks, keys/headers/timestamps,
compression, assign-mode consumption, offsets, admin, seek by timestamp."""
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic


def produce(rokka, topic, msgs, **conf):
    p = Producer({"bootstrap.servers": rokka.bootstrap, "linger.ms": 5, **conf})
    delivered = []

    def cb(err, msg):
        assert err is None, err
        delivered.append((msg.partition(), msg.offset()))

    for m in msgs:
        p.produce(topic, on_delivery=cb, **m)
    assert p.flush(30) == 0
    return delivered


def consume_all(rokka, topic, partitions, n, group="g-assign", start=0):
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(topic, p, start) for p in partitions])
    got = []
    deadline = time.time() + 30
    while len(got) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    c.close()
    return got


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(rokka, topic, acks):
    msgs = [{"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in range(200)]
    delivered = produce(rokka, topic, msgs, acks=acks)
    assert len(delivered) == 200
    got = consume_all(rokka, topic, [0], 200)
    assert [(m.key(), m.value()) for m in got] == [(m["key"], m["value"]) for m in msgs]
    assert [m.offset() for m in got] == list(range(200))


def test_keys_headers_timestamps_byte_exact(rokka, topic):
    msgs = [
        {
            "key": bytes([i, 0, 255 - i]),
            "value": bytes(range(256)) * (i + 1),
            "headers": [("h", bytes([i])), ("empty", b""), ("dup", b"1"), ("dup", b"2")],
            "timestamp": 1_600_000_000_000 + i,
        }
        for i in range(20)
    ]
    produce(rokka, topic, msgs)
    got = consume_all(rokka, topic, [0], 20)
    for m, want in zip(got, msgs):
        assert m.key() == want["key"]
        assert m.value() == want["value"]
        assert m.headers() == want["headers"]
        assert m.timestamp()[1] == want["timestamp"]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression(rokka, topic, codec):
    msgs = [{"value": (f"{codec} message {i} " * 20).encode()} for i in range(500)]
    produce(rokka, topic, msgs, **{"compression.codec": codec, "linger.ms": 50})
    got = consume_all(rokka, topic, [0], 500)
    assert [m.value() for m in got] == [m["value"] for m in msgs]


def test_admin_create_partitions_delete(rokka, topic):
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(10)
    md = a.list_topics(topic, timeout=10)
    assert len(md.topics[topic].partitions) == 3
    with pytest.raises(Exception) as e:
        a.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(10)
    assert e.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    a.create_partitions([NewPartitions(topic, 5)])[topic].result(10)
    assert len(a.list_topics(topic, timeout=10).topics[topic].partitions) == 5
    produce(rokka, topic, [{"value": b"x", "partition": 4}])
    a.delete_topics([topic])[topic].result(10)
    assert topic not in a.list_topics(timeout=10).topics


def test_partitions_and_watermarks(rokka, topic):
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])[topic].result(10)
    msgs = [{"value": f"{i}".encode(), "partition": i % 4} for i in range(400)]
    produce(rokka, topic, msgs)
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "wm"})
    for p in range(4):
        assert c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) == (0, 100)
    c.close()
    got = consume_all(rokka, topic, range(4), 400)
    assert sorted(int(m.value()) for m in got) == list(range(400))
    for m in got:
        assert int(m.value()) % 4 == m.partition()


def test_commit_and_fetch_offsets(rokka, topic):
    produce(rokka, topic, [{"value": b"x"}] * 10)
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"commit-{topic}", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
    got = c.committed([TopicPartition(topic, 0)], timeout=10)
    assert got[0].offset == 7
    c.close()


def test_seek_by_timestamp(rokka, topic):
    base = 1_700_000_000_000
    produce(rokka, topic, [{"value": f"{i}".encode(), "timestamp": base + i * 1000} for i in range(50)], **{"linger.ms": 100})
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "ts"})
    res = c.offsets_for_times([TopicPartition(topic, 0, base + 20_500)], timeout=10)
    assert res[0].offset == 21
    res = c.offsets_for_times([TopicPartition(topic, 0, base + 10**9)], timeout=10)
    assert res[0].offset == -1
    c.close()


def test_long_poll_wakes_on_produce(rokka, topic):
    produce(rokka, topic, [{"value": b"first"}])
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "lp", "fetch.wait.max.ms": 5000})
    c.assign([TopicPartition(topic, 0, 1)])
    c.poll(0.5)
    t0 = time.time()
    produce(rokka, topic, [{"value": b"second"}])
    m = None
    while m is None and time.time() - t0 < 10:
        m = c.poll(0.1)
    assert m is not None and m.value() == b"second"
    # Woken by the append, not by the 5 s max wait.
    assert time.time() - t0 < 3
    c.close()


def test_idempotent_producer(rokka, topic):
    msgs = [{"key": f"{i}".encode(), "value": f"v{i}".encode()} for i in range(2000)]
    delivered = produce(rokka, topic, msgs, **{"enable.idempotence": True, "linger.ms": 1, "batch.num.messages": 50})
    assert sorted(o for _, o in delivered) == list(range(2000))
    got = consume_all(rokka, topic, [0], 2000)
    assert [m.value() for m in got] == [m["value"] for m in msgs]
    # The batches carry the producer id and sequences Rokka checked.
    assert "rokka_kafka_requests_total{api=\"InitProducerId\"}" in rokka.metrics()
