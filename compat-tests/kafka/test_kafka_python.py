"""kafka-python 3.0: producer/consumer without groups, compression,
offsets_for_times, admin."""
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic


def test_produce_consume_keys_headers(rokka, topic):
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap, acks="all")
    futs = [
        p.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), headers=[("h", str(i).encode())], timestamp_ms=1_650_000_000_000 + i)
        for i in range(100)
    ]
    offs = [f.get(timeout=10).offset for f in futs]
    assert offs == list(range(100))
    p.close()
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=None, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    c.assign([TopicPartition(topic, 0)])
    got = list(c)
    c.close()
    assert [(m.key, m.value, m.offset) for m in got] == [(f"k{i}".encode(), f"v{i}".encode(), i) for i in range(100)]
    assert [m.headers for m in got] == [[("h", str(i).encode())] for i in range(100)]
    assert [m.timestamp for m in got] == [1_650_000_000_000 + i for i in range(100)]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression(rokka, topic, codec):
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap, compression_type=codec, linger_ms=20)
    for i in range(300):
        p.send(topic, f"{codec}-{i}".encode())
    p.flush(30)
    p.close()
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=None, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    c.assign([TopicPartition(topic, 0)])
    got = [m.value for m in c]
    c.close()
    assert got == [f"{codec}-{i}".encode() for i in range(300)]


def test_offsets_for_times_and_end_offsets(rokka, topic):
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap)
    base = 1_700_000_000_000
    for i in range(30):
        p.send(topic, b"x", timestamp_ms=base + i * 10)
    p.flush(10)
    p.close()
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=None)
    tp = TopicPartition(topic, 0)
    assert c.end_offsets([tp])[tp] == 30
    assert c.beginning_offsets([tp])[tp] == 0
    assert c.offsets_for_times({tp: base + 105})[tp].offset == 11
    c.close()


def test_admin_create_and_delete(rokka, topic):
    a = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    a.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    assert topic in a.list_topics()
    a.delete_topics([topic])
    deadline = time.time() + 5
    while topic in a.list_topics() and time.time() < deadline:
        time.sleep(0.1)
    assert topic not in a.list_topics()
    a.close()


def test_offset_metadata_is_bounded(rokka, topic):
    """Kafka's offset.metadata.max.bytes (4096): a longer metadata string is
    refused with OFFSET_METADATA_TOO_LARGE and nothing is stored."""
    from kafka.errors import OffsetMetadataTooLargeError
    from kafka.structs import OffsetAndMetadata

    admin = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    admin.close()
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=f"{topic}-g", enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    with pytest.raises(OffsetMetadataTooLargeError):
        c.commit({tp: OffsetAndMetadata(3, "m" * 4097, -1)})
    c.commit({tp: OffsetAndMetadata(2, "m" * 4096, -1)})
    assert c.committed(tp) == 2
    c.close()


def test_api_version_inference_finds_kafka_4(rokka, topic):
    """kafka-python with api_version unset infers the broker's release from
    the versions ApiVersions lists: Rokka answers as a Kafka 4.x broker."""
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=None)
    try:
        assert c.config["api_version"][:1] == (4,), c.config["api_version"]
        # And the newest ListOffsets it then speaks works.
        p = KafkaProducer(bootstrap_servers=rokka.bootstrap)
        p.send(topic, b"x").get(timeout=10)
        p.close()
        tp = TopicPartition(topic, 0)
        assert c.end_offsets([tp])[tp] == 1
        assert c.beginning_offsets([tp])[tp] == 0
    finally:
        c.close()
