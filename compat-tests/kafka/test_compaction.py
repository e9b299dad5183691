"""Compacted topics with real clients: a topic created with
cleanup.policy=compact is read back after compaction with exactly the
latest value per key (librdkafka with CRC checks on, and kafka-python),
deleted keys gone, offsets kept (gaps where records were removed), the
same after a restart; keyless records are refused with INVALID_RECORD; an
existing topic altered to compact describes and behaves as compacted."""
import os
import sys
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402

KEYS = [f"k{i:02d}" for i in range(50)]
DELETED = KEYS[:10]
ROUNDS = 3


@pytest.fixture(scope="module")
def rokka():
    with running("kafka", "compaction", broker_extra="compaction_interval_ms = 200") as r:
        yield r


def admin(rokka):
    return AdminClient({"bootstrap.servers": rokka.bootstrap})


def passes(rokka):
    return sum(v for k, v in rokka.metric_values().items() if k.startswith("rokka_compaction_passes_total"))


def produce_rounds(rokka, topic, partitions):
    p = Producer({"bootstrap.servers": rokka.bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for r in range(ROUNDS):
        for k in KEYS:
            last = r == ROUNDS - 1
            value = None if (last and k in DELETED) else f"{k}-r{r}".encode()
            p.produce(topic, key=k.encode(), value=value)
        p.flush(30)
    # One newest record per partition: the newest entry is never cleaned,
    # so this makes every record above cleanable.
    for part in range(partitions):
        p.produce(topic, key=f"end-{part}".encode(), value=b"end", partition=part)
    assert p.flush(30) == 0


def read_all(rokka, topic, partitions):
    """Every record of the topic from the start: {partition: [(offset, key, value)]}."""
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": f"reader-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "check.crcs": True,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = {p: [] for p in range(partitions)}
    eof = set()
    deadline = time.time() + 30
    while len(eof) < partitions and time.time() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                eof.add(m.partition())
                continue
            raise KafkaException(m.error())
        key = m.key().decode() if m.key() is not None else None
        value = m.value().decode() if m.value() is not None else None
        out[m.partition()].append((m.offset(), key, value))
    c.close()
    assert len(eof) == partitions, f"did not reach the end: {eof}"
    return out


def latest_view(records):
    """{key: value} of the last record per key (None = tombstone)."""
    view = {}
    for recs in records.values():
        for _, k, v in recs:
            view[k] = v
    return view


def check_compacted(records, partitions):
    want = {k: f"{k}-r{ROUNDS - 1}" for k in KEYS if k not in DELETED}
    want.update({f"end-{p}": "end" for p in range(partitions)})
    keys = [k for recs in records.values() for _, k, _ in recs]
    assert sorted(keys) == sorted(want), "exactly one record per live key, deleted keys gone"
    assert latest_view(records) == want
    for part, recs in records.items():
        offsets = [o for o, _, _ in recs]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), part
        # Offsets are kept: the survivors sit where they were written, with
        # gaps where compaction removed records.
        assert offsets[-1] + 1 > len(offsets), (part, offsets)


def wait_compacted(rokka, topic, partitions):
    deadline = time.time() + 40
    while True:
        records = read_all(rokka, topic, partitions)
        try:
            check_compacted(records, partitions)
            return records
        except AssertionError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def test_a_compacted_topic_reads_back_the_latest_value_per_key(rokka):
    a = admin(rokka)
    topic = "compacted"
    config = {"cleanup.policy": "compact", "delete.retention.ms": "0"}
    a.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1, config=config)])[topic].result(10)
    res = ConfigResource(ResourceType.TOPIC, topic)
    assert a.describe_configs([res])[res].result(10)["cleanup.policy"].value == "compact"
    before = passes(rokka)
    produce_rounds(rokka, topic, 2)
    produced = read_all(rokka, topic, 2)
    assert sum(len(r) for r in produced.values()) >= ROUNDS * len(KEYS) or passes(rokka) > before
    records = wait_compacted(rokka, topic, 2)
    assert passes(rokka) > before
    m = rokka.metric_values()
    removed = sum(v for k, v in m.items() if k.startswith("rokka_compaction_records_removed_total"))
    assert removed >= (ROUNDS - 1) * len(KEYS), m
    # The same after a restart (the clean logs are on disk).
    rokka.restart()
    assert read_all(rokka, topic, 2) == records
    # A committed group offset inside a removed range still works: a
    # consumer there reads on from the next survivor.
    first = records[0][0][0]
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "mid", "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, max(first - 1, 0))])
    got = None
    deadline = time.time() + 15
    while got is None and time.time() < deadline:
        msg = c.poll(1.0)
        if msg is not None and not msg.error():
            got = msg.offset()
    c.close()
    assert got == first


def test_kafka_python_reads_the_compacted_topic(rokka):
    from kafka import KafkaConsumer

    records = read_all(rokka, "compacted", 2)
    c = KafkaConsumer(
        bootstrap_servers=rokka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
        check_crcs=True,
    )
    from kafka import TopicPartition as KTP

    c.assign([KTP("compacted", 0), KTP("compacted", 1)])
    c.seek_to_beginning()
    seen = {0: [], 1: []}
    for m in c:
        seen[m.partition].append((m.offset, m.key.decode(), m.value.decode() if m.value is not None else None))
    c.close()
    assert seen == records


def test_keyless_records_are_refused_on_a_compacted_topic(rokka):
    p = Producer({"bootstrap.servers": rokka.bootstrap, "retries": 0})
    errors = []
    p.produce("compacted", value=b"no key", on_delivery=lambda err, msg: errors.append(err))
    p.flush(15)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == KafkaError.INVALID_RECORD, errors[0]
    # A keyed record to the same topic still goes in.
    p.produce("compacted", key=b"k10", value=b"again", on_delivery=lambda err, msg: errors.append(err))
    p.flush(15)
    assert errors[1] is None


def test_a_topic_altered_to_compact_is_compacted(rokka):
    a = admin(rokka)
    topic = "altered"
    a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(10)
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for r in range(3):
        for k in ("a", "b"):
            p.produce(topic, key=k.encode(), value=f"{k}{r}".encode())
        p.flush(15)
    res = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    a.incremental_alter_configs([res])[res].result(10)
    p.produce(topic, key=b"end", value=b"end")
    p.flush(15)
    deadline = time.time() + 30
    while True:
        recs = read_all(rokka, topic, 1)[0]
        if [(k, v) for _, k, v in recs] == [("a", "a2"), ("b", "b2"), ("end", "end")]:
            break
        assert time.time() < deadline, recs
        time.sleep(0.5)
    with pytest.raises(KafkaException):
        p2 = Producer({"bootstrap.servers": rokka.bootstrap, "retries": 0})
        errs = []
        p2.produce(topic, value=b"x", on_delivery=lambda err, msg: errs.append(err))
        p2.flush(15)
        if errs and errs[0] is not None:
            raise KafkaException(errs[0])


def test_compaction_keeps_each_records_headers_repeated_keys_included(rokka):
    """A batch compaction rewrites (one of its records removed; zstd) keeps
    the others' headers as produced — a key twice included (tracing
    headers): the records are filtered as bytes, not decoded into a header
    map; librdkafka checks the rewritten batch's CRC."""
    a = admin(rokka)
    topic = "compacted-headers"
    config = {"cleanup.policy": "compact", "delete.retention.ms": "0", "min.cleanable.dirty.ratio": "0.01"}
    a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, config=config)])[topic].result(10)
    hdrs = [("trace", b"1"), ("trace", b"2"), ("other", b"x")]
    p = Producer({"bootstrap.servers": rokka.bootstrap, "linger.ms": 200, "enable.idempotence": True,
                  "compression.codec": "zstd"})
    for key, value in ((b"k", b"old"), (b"k", b"new"), (b"j", b"j")):
        p.produce(topic, key=key, value=value, headers=hdrs, partition=0)
    assert p.flush(30) == 0
    p.produce(topic, key=b"end", value=b"end", partition=0)
    assert p.flush(30) == 0
    deadline = time.time() + 40
    while True:
        c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"h-{time.time_ns()}",
                      "enable.partition.eof": True, "enable.auto.commit": False, "check.crcs": True})
        c.assign([TopicPartition(topic, 0, 0)])
        got = []
        while True:
            m = c.poll(2.0)
            if m is None or (m.error() and m.error().code() == KafkaError._PARTITION_EOF):
                break
            if not m.error():
                got.append((m.key(), m.value(), m.headers()))
        c.close()
        if [k for k, _, _ in got].count(b"k") == 1:
            break
        assert time.time() < deadline, f"not compacted: {[(k, v) for k, v, _ in got]}"
        time.sleep(0.5)
    assert [(k, v) for k, v, _ in got] == [(b"k", b"new"), (b"j", b"j"), (b"end", b"end")]
    for k, _, h in got[:2]:
        assert h == hdrs, (k, h)
