"""Kafka transactions crossing to RocketMQ: a RocketMQ push consumer
(rocketmq-client-rust) of a topic written by a librdkafka transactional
producer gets exactly the committed records — never an aborted one, and an
open transaction's only once it commits (as a read_committed Kafka consumer)."""
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import rocketmq_consume


def test_rocketmq_consumers_see_only_committed_kafka_transactions(rokka):
    topic = f"TxCross{uuid.uuid4().hex[:8]}"
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(10)
    p = Producer({"bootstrap.servers": rokka.bootstrap, "transactional.id": f"x-{topic}", "linger.ms": 5})
    p.init_transactions(30)

    def txn(prefix, n, commit):
        p.begin_transaction()
        for i in range(n):
            p.produce(topic, f"{prefix}-{i}".encode(), partition=i % 2)
        p.flush(10)
        (p.commit_transaction if commit else p.abort_transaction)(30)

    txn("c", 20, True)
    txn("a", 10, False)
    txn("d", 5, True)
    # Left open while the RocketMQ consumer runs.
    p.begin_transaction()
    for i in range(6):
        p.produce(topic, f"o-{i}".encode(), partition=i % 2)
    p.flush(10)
    committed = sorted([f"c-{i}" for i in range(20)] + [f"d-{i}" for i in range(5)])
    got = rocketmq_consume(rokka, topic, f"txg-{topic}", len(committed))
    bodies = sorted(d.body.decode() for d in got)
    assert bodies == committed, bodies
    p.commit_transaction(30)
    got = rocketmq_consume(rokka, topic, f"txg2-{topic}", len(committed) + 6)
    bodies = sorted(d.body.decode() for d in got)
    assert bodies == sorted(committed + [f"o-{i}" for i in range(6)]), bodies
