"""A compacted topic written by both protocols: Kafka records (key = the
Kafka key) and RocketMQ messages (key = KEYS) are compacted together, and
after compaction a RocketMQ push consumer and a Kafka consumer both read
exactly the latest message per key. (Compaction is per partition, as in
Kafka: the topic has one, so both producers' messages for a key meet.)"""
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import harness, rocketmq_consume
from realclients import metric, read_topic, wait_for

TOPIC = "CompactedCross"
KEYS = [f"key-{i}" for i in range(20)]


def test_both_protocols_read_the_latest_message_per_key(rokka):
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    config = {"cleanup.policy": "compact", "delete.retention.ms": "0"}
    a.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1, config=config)])[TOPIC].result(10)
    # RocketMQ first: key-0 .. key-9, bodies rmq-<i>-é.
    harness(rokka, "cross-produce", TOPIC, 10)
    # Then Kafka overwrites key-0 .. key-4, deletes key-5 and adds key-10 .. key-19.
    p = Producer({"bootstrap.servers": rokka.bootstrap, "linger.ms": 10})
    for k in KEYS[:5]:
        p.produce(TOPIC, key=k.encode(), value=f"kafka-{k}".encode())
    p.produce(TOPIC, key=b"key-5", value=None)
    for k in KEYS[10:]:
        p.produce(TOPIC, key=k.encode(), value=f"kafka-{k}".encode())
    p.flush(15)
    p.produce(TOPIC, key=b"end", value=b"end")
    assert p.flush(15) == 0

    want = {f"key-{i}": f"rmq-{i}-é" for i in range(6, 10)}
    want.update({k: f"kafka-{k}" for k in KEYS[:5] + KEYS[10:]})
    want["end"] = "end"

    def kafka_view():
        records = read_topic(rokka, TOPIC)
        return sorted(v.decode() for _, _, v in records if v is not None)

    compacted = wait_for("compaction", lambda: kafka_view() == sorted(want.values()), timeout=40, every=0.5)
    assert compacted, f"Kafka reads {kafka_view()}"
    assert metric(rokka, "rokka_compaction_passes_total") >= 1

    got = rocketmq_consume(rokka, TOPIC, "compacted-cross", len(want))
    seen = {d.keys: d.body.decode() for d in got}
    assert len(got) == len(want), [(d.keys, d.body) for d in got]
    assert seen == want
