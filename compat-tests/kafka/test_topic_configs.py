"""Topic configs with real clients: CreateTopics with configs and explicit
assignments, DescribeConfigs sources and synonyms, AlterConfigs and
IncrementalAlterConfigs round trips (confluent-kafka admin, kafka-python
admin), and the configs Rokka enforces: max.message.bytes,
message.timestamp.type=LogAppendTime, compression.type, min.insync.replicas,
retention.ms and retention.bytes."""
import os
import sys
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import Rokka, results_dir, running  # noqa: E402


@pytest.fixture(scope="module")
def rokka():
    with running("kafka", "topic_configs", store_extra="retention_check_interval_ms = 300") as r:
        yield r


def admin(rokka):
    return AdminClient({"bootstrap.servers": rokka.bootstrap})


def describe(a, topic):
    res = ConfigResource(ResourceType.TOPIC, topic)
    return a.describe_configs([res])[res].result(10)


def test_create_with_configs_describes_them_as_set_on_the_topic(rokka):
    a = admin(rokka)
    t = NewTopic("cfg-create", num_partitions=2, replication_factor=1, config={"compression.type": "gzip", "retention.ms": "3600000"})
    a.create_topics([t])["cfg-create"].result(10)
    c = describe(a, "cfg-create")
    assert c["compression.type"].value == "gzip"
    assert c["compression.type"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert c["retention.ms"].value == "3600000"
    # Not set: the broker's value — STATIC_BROKER_CONFIG where rokka.toml
    # changed it (this suite's segment size), DEFAULT_CONFIG otherwise.
    assert c["segment.bytes"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert c["max.message.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert c["cleanup.policy"].value == "delete"
    assert c["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    # Synonyms: the topic's value first, then the broker setting it overrides.
    syn = c["retention.ms"].synonyms
    assert [s for s in syn] == ["retention.ms", "log.retention.ms"], syn
    # Survives a restart.
    rokka.restart()
    a = admin(rokka)
    assert describe(a, "cfg-create")["compression.type"].value == "gzip"


def test_unknown_and_invalid_configs_are_refused(rokka):
    a = admin(rokka)
    for config, words in (
        ({"no.such.setting": "1"}, "Unknown topic config"),
        ({"retention.ms": "soon"}, "retention.ms"),
        ({"compression.type": "brotli"}, "compression.type"),
    ):
        f = a.create_topics([NewTopic("cfg-bad", num_partitions=1, replication_factor=1, config=config)])["cfg-bad"]
        with pytest.raises(KafkaException) as e:
            f.result(10)
        err = e.value.args[0]
        assert err.code() == KafkaError.INVALID_CONFIG, err
        assert words in err.str(), err
    md = a.list_topics(timeout=10)
    assert "cfg-bad" not in md.topics


def test_described_defaults_alter_back_and_kafkas_ranges_hold(rokka):
    """Every value DescribeConfigs reports for a topic is accepted back by
    an alter (local.retention.* -2, compression.gzip.level -1, as Kafka's
    LogConfig allows); what Kafka refuses is refused: tiered storage (off
    here), a codec level out of range, min.compaction.lag.ms above
    max.compaction.lag.ms."""
    a = admin(rokka)
    a.create_topics([NewTopic("cfg-ranges", num_partitions=1, replication_factor=1)])["cfg-ranges"].result(10)
    described = describe(a, "cfg-ranges")
    res = ConfigResource(
        ResourceType.TOPIC,
        "cfg-ranges",
        incremental_configs=[
            ConfigEntry(name, e.value, incremental_operation=AlterConfigOpType.SET)
            for name, e in described.items()
            if e.value is not None and not e.is_read_only
        ],
    )
    a.incremental_alter_configs([res])[res].result(10)
    for config, words in (
        ({"remote.storage.enable": "true"}, "Tiered Storage"),
        ({"compression.gzip.level": "10"}, "compression.gzip.level"),
        ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}, "conflict"),
    ):
        f = a.create_topics([NewTopic("cfg-range-bad", num_partitions=1, replication_factor=1, config=config)])["cfg-range-bad"]
        with pytest.raises(KafkaException) as e:
            f.result(10)
        err = e.value.args[0]
        assert err.code() == KafkaError.INVALID_CONFIG and words in err.str(), err


def test_deleting_a_config_name_not_set_is_a_no_op(rokka):
    """IncrementalAlterConfigs DELETE of a name the topic does not set —
    even one Rokka does not know — succeeds, as Kafka answers it (tools
    that reset a list of names send them whatever the topic has)."""
    a = admin(rokka)
    a.create_topics([NewTopic("cfg-del", num_partitions=1, replication_factor=1)])["cfg-del"].result(10)
    res = ConfigResource(
        ResourceType.TOPIC,
        "cfg-del",
        incremental_configs=[
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry("some.future.setting", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    a.incremental_alter_configs([res])[res].result(10)


def test_explicit_replica_assignment_sets_the_partition_count(rokka):
    a = admin(rokka)
    a.create_topics([NewTopic("cfg-assign", num_partitions=3, replica_assignment=[[0], [0], [0]])])["cfg-assign"].result(10)
    assert len(a.list_topics("cfg-assign", timeout=10).topics["cfg-assign"].partitions) == 3
    # Replicas on a broker that does not exist are refused.
    f = a.create_topics([NewTopic("cfg-assign2", num_partitions=1, replica_assignment=[[0, 1]])])["cfg-assign2"]
    with pytest.raises(KafkaException) as e:
        f.result(10)
    assert e.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT


def test_incremental_and_whole_alter_configs_round_trip(rokka):
    a = admin(rokka)
    a.create_topics([NewTopic("cfg-alter", num_partitions=1, replication_factor=1)])["cfg-alter"].result(10)
    res = ConfigResource(
        ResourceType.TOPIC,
        "cfg-alter",
        incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("max.message.bytes", "50000", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    a.incremental_alter_configs([res])[res].result(10)
    c = describe(a, "cfg-alter")
    assert (c["retention.ms"].value, c["max.message.bytes"].value) == ("7200000", "50000")
    res = ConfigResource(
        ResourceType.TOPIC,
        "cfg-alter",
        incremental_configs=[ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)],
    )
    a.incremental_alter_configs([res])[res].result(10)
    c = describe(a, "cfg-alter")
    assert c["retention.ms"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert c["max.message.bytes"].value == "50000"
    # An invalid value changes nothing.
    bad = ConfigResource(
        ResourceType.TOPIC,
        "cfg-alter",
        incremental_configs=[ConfigEntry("max.message.bytes", "-5", incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(KafkaException):
        a.incremental_alter_configs([bad])[bad].result(10)
    assert describe(a, "cfg-alter")["max.message.bytes"].value == "50000"
    # kafka-python's AlterConfigs (incremental=False): the request carries
    # the whole set, which replaces the topic's overrides (the client adds
    # the keys already set, as it must).
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KRes, ConfigResourceType

    before = rokka.metric_values().get('rokka_kafka_requests_total{api="AlterConfigs"}', 0)
    k = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    try:
        k.alter_configs([KRes(ConfigResourceType.TOPIC, "cfg-alter", configs={"retention.bytes": "123456"})], incremental=False)
    finally:
        k.close()
    assert rokka.metric_values().get('rokka_kafka_requests_total{api="AlterConfigs"}', 0) == before + 1
    c = describe(a, "cfg-alter")
    assert (c["retention.bytes"].value, c["max.message.bytes"].value) == ("123456", "50000")
    assert c["retention.ms"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def produce_one(rokka, topic, value, **conf):
    p = Producer({"bootstrap.servers": rokka.bootstrap, **conf})
    out = []
    p.produce(topic, value, partition=0, on_delivery=lambda err, msg: out.append((err, msg)))
    p.flush(20)
    return out[0]


def read(rokka, topic, n, start=0):
    c = Consumer(
        {"bootstrap.servers": rokka.bootstrap, "group.id": f"r-{topic}", "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    )
    c.assign([TopicPartition(topic, 0, start)])
    got = []
    deadline = time.time() + 20
    while len(got) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m)
    c.close()
    return got


def test_enforced_configs(rokka):
    a = admin(rokka)
    topics = {
        "cfg-small": {"max.message.bytes": "1000"},
        "cfg-lat": {"message.timestamp.type": "LogAppendTime"},
        "cfg-isr": {"min.insync.replicas": "2"},
    }
    for t, conf in topics.items():
        a.create_topics([NewTopic(t, num_partitions=1, replication_factor=1, config=conf)])[t].result(10)
    err, _ = produce_one(rokka, "cfg-small", b"x" * 5000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    err, _ = produce_one(rokka, "cfg-small", b"x" * 100)
    assert err is None, err
    err, _ = produce_one(rokka, "cfg-lat", b"stamped", **{"linger.ms": 0})
    assert err is None
    (m,) = read(rokka, "cfg-lat", 1)
    kind, ts = m.timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME and abs(ts - time.time() * 1000) < 60_000, (kind, ts)
    # ListOffsets max timestamp of a LogAppendTime topic: the batch's time,
    # at its first record.
    from confluent_kafka.admin import OffsetSpec

    tp = TopicPartition("cfg-lat", 0)
    got = a.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(10)
    assert (got.offset, got.timestamp) == (0, ts), (got.offset, got.timestamp, ts)
    err, _ = produce_one(rokka, "cfg-isr", b"x", acks="all", retries=0)
    assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS, err
    err, _ = produce_one(rokka, "cfg-isr", b"x", acks="1", **{"enable.idempotence": False})
    assert err is None, err


def test_timestamp_limits_refuse_records_too_far_from_now(rokka):
    """message.timestamp.before.max.ms / after.max.ms on a CreateTime
    topic: a record stamped further in the past or future than allowed is
    INVALID_TIMESTAMP (Kafka's LogValidator), one within range is stored."""
    a = admin(rokka)
    t = "cfg-ts-range"
    conf = {"message.timestamp.before.max.ms": "3600000", "message.timestamp.after.max.ms": "60000"}
    a.create_topics([NewTopic(t, num_partitions=1, replication_factor=1, config=conf)])[t].result(10)
    now = int(time.time() * 1000)

    def send(ts):
        p = Producer({"bootstrap.servers": rokka.bootstrap, "retries": 0, "message.timeout.ms": 10000})
        out = []
        p.produce(t, b"v", partition=0, timestamp=ts, on_delivery=lambda err, msg: out.append(err))
        p.flush(20)
        return out[0]

    assert send(now - 2 * 86_400_000).code() == KafkaError.INVALID_TIMESTAMP
    assert send(now + 86_400_000).code() == KafkaError.INVALID_TIMESTAMP
    assert send(now - 60_000) is None
    assert len(read(rokka, t, 1)) == 1


def test_compression_type_recompresses_what_is_stored(rokka):
    from kafka.net.compat import KafkaNetClient
    from kafka.protocol.consumer import FetchRequest
    from kafka.record.memory_records import MemoryRecords

    a = admin(rokka)
    a.create_topics([NewTopic("cfg-zstd", num_partitions=1, replication_factor=1, config={"compression.type": "zstd"})])[
        "cfg-zstd"
    ].result(10)
    p = Producer({"bootstrap.servers": rokka.bootstrap, "compression.type": "none", "linger.ms": 200})
    for i in range(50):
        p.produce("cfg-zstd", f"value-{i}".encode() * 20, partition=0)
    assert p.flush(20) == 0
    c = KafkaNetClient(bootstrap_servers=rokka.bootstrap)
    try:
        c.check_version()
        node = c.least_loaded_node()
        T = FetchRequest.FetchTopic
        req = FetchRequest(
            replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1 << 22, isolation_level=0,
            topics=[T(topic="cfg-zstd", partitions=[T.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 22)])],
            max_version=10,
        )
        part = c.send_and_receive(node, req, timeout_ms=10000).responses[0].partitions[0]
    finally:
        c.close()
    records = MemoryRecords(part.records)
    codecs, values = set(), []
    while (b := records.next_batch()) is not None:
        codecs.add(b.compression_type)
        values += [r.value for r in b]
    assert codecs == {4}, f"stored codecs {codecs} (4 = zstd)"
    assert values == [f"value-{i}".encode() * 20 for i in range(50)]


def test_topic_retention_moves_the_log_start(rokka):
    a = admin(rokka)
    a.create_topics([NewTopic("cfg-ret", num_partitions=1, replication_factor=1, config={"retention.ms": "3000"})])[
        "cfg-ret"
    ].result(10)
    a.create_topics([NewTopic("cfg-bytes", num_partitions=1, replication_factor=1, config={"retention.bytes": "20000"})])[
        "cfg-bytes"
    ].result(10)
    p = Producer({"bootstrap.servers": rokka.bootstrap, "linger.ms": 0})
    for i in range(10):
        p.produce("cfg-ret", b"old", partition=0)
    for i in range(100):
        p.produce("cfg-bytes", b"b" * 1000, partition=0)
        p.flush(5)
    assert p.flush(20) == 0
    time.sleep(3.2)
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "ret"})
    deadline = time.time() + 15
    while time.time() < deadline:
        low, high = c.get_watermark_offsets(TopicPartition("cfg-ret", 0), timeout=10)
        if low == 10:
            break
        time.sleep(0.3)
    assert (low, high) == (10, 10), "the expired records are behind the log start"
    low, high = c.get_watermark_offsets(TopicPartition("cfg-bytes", 0), timeout=10)
    c.close()
    assert high == 100
    # About 20 kB of ~1 kB records remain (entry headers included).
    assert 80 <= low <= 90, (low, high)
    # A record produced now is served (reading from offset 0 lands on the log start).
    p.produce("cfg-ret", b"new", partition=0)
    assert p.flush(20) == 0
    got = read(rokka, "cfg-ret", 1, start=0)
    assert [(m.offset(), m.value()) for m in got] == [(10, b"new")]


def test_dynamic_broker_configs_set_topic_defaults(rokka):
    """IncrementalAlterConfigs on the BROKER resource changes the default of
    topics without their own value, at once and across a restart;
    DescribeConfigs shows where each value comes from; a key that is not
    dynamic is refused. (The cluster-wide default, resource name "", is
    what Kafka's own kafka-configs --entity-default sends; confluent-kafka
    and kafka-python refuse an empty broker name, so
    protocols/kafka/tests/wire.rs covers it.)"""
    a = admin(rokka)
    topic = "cfg-dynamic"
    a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(10)

    def alter(name, key, value, op=AlterConfigOpType.SET):
        res = ConfigResource(ResourceType.BROKER, name, incremental_configs=[ConfigEntry(key, value, incremental_operation=op)])
        return a.incremental_alter_configs([res])[res].result(10)

    alter("0", "message.max.bytes", "2000")
    c = describe(a, topic)["max.message.bytes"]
    assert (c.value, c.source) == ("2000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    # Synonyms name the broker setting it comes from (confluent-kafka keys
    # them by name, so the chain of values is checked in wire.rs).
    assert "message.max.bytes" in c.synonyms, c.synonyms
    b = ConfigResource(ResourceType.BROKER, "0")
    broker = a.describe_configs([b])[b].result(10)
    assert broker["message.max.bytes"].value == "2000"
    assert broker["message.max.bytes"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert not broker["message.max.bytes"].is_read_only

    # Enforced: a 5 kB record no longer fits a topic without its own value.
    p = Producer({"bootstrap.servers": rokka.bootstrap, "retries": 0, "message.max.bytes": 100000})
    errs = []
    p.produce(topic, value=b"x" * 5000, on_delivery=lambda err, msg: errs.append(err))
    p.flush(15)
    assert errs and errs[0] is not None and errs[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, errs

    rokka.restart()
    a = admin(rokka)
    assert describe(a, topic)["max.message.bytes"].value == "2000"
    # Deleting this broker's value falls back to the static one.
    alter("0", "message.max.bytes", None, AlterConfigOpType.DELETE)
    c = describe(a, topic)["max.message.bytes"]
    assert c.source == ConfigSource.DEFAULT_CONFIG.value
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    errs = []
    p.produce(topic, value=b"x" * 5000, on_delivery=lambda err, msg: errs.append(err))
    p.flush(15)
    assert errs == [None]

    # Not a dynamic key: refused, nothing changes.
    with pytest.raises(KafkaException) as e:
        alter("0", "num.io.threads", "16")
    assert e.value.args[0].code() == KafkaError.INVALID_REQUEST
    with pytest.raises(KafkaException) as e:
        alter("0", "log.retention.ms", "soon")
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
