"""One set of consumer groups, two protocols — but not two assignment
authorities in one group: a RocketMQ client allocates its queues itself,
a Kafka consumer-protocol (KIP-848) member takes the broker's assignment.
While a group has members of one kind, a member of the other is refused
(librdkafka gets GROUP_ID_NOT_FOUND with the reason; the RocketMQ client's
heartbeat is answered SYSTEM_ERROR), so nothing is consumed twice."""
import time

from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient, NewTopic

from realclients import Harness, metric, wait_for


def test_a_consumer_protocol_member_cannot_join_a_group_with_rocketmq_members(rokka):
    topic, group = "Mix848", "mix848-g"
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(10)
    member = Harness(rokka, "rmq-member", "cross-member", topic, group, 25)
    try:
        # The RocketMQ member is in the group once DescribeGroups lists it.
        wait_for(
            "the RocketMQ member in DescribeGroups",
            lambda: member.running() and len(a.describe_consumer_groups([group])[group].result(10).members) > 0,
            30,
        )
        c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "group.protocol": "consumer"})
        c.subscribe([topic])
        errors = []
        deadline = time.time() + 20
        while time.time() < deadline and not errors:
            m = c.poll(0.5)
            if m is not None and m.error() is not None:
                errors.append(m.error())
        c.close()
        assert errors, "the KIP-848 member was let in beside a RocketMQ member"
        # librdkafka makes it fatal for that consumer: "ConsumerGroupHeartbeat
        # fatal error: Broker: The group id does not exist".
        assert any(
            e.code() == KafkaError.GROUP_ID_NOT_FOUND or "group id does not exist" in e.str() for e in errors
        ), errors
        assert metric(rokka, "rokka_mixed_group_conflicts_total", group=group, side="kafka") >= 1
    finally:
        member.kill()


def test_a_consumer_protocol_group_hands_over_to_rocketmq_clients(rokka):
    """Stop-then-start across the protocols: a KIP-848 member reads half of a
    topic and commits; once it has left, a RocketMQ consumer of the same
    group carries on from the committed offset — nothing re-read, nothing
    skipped."""
    from confluent_kafka import Producer, TopicPartition

    from conftest import rocketmq_consume

    topic, group = "Mix848Hand", "mix848-hand"
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(10)
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for i in range(20):
        p.produce(topic, f"m{i}".encode(), partition=0)
    assert p.flush(10) == 0
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([topic])
    got = []
    deadline = time.time() + 30
    while len(got) < 10 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value().decode())
    assert got == [f"m{i}" for i in range(10)], got
    c.commit(offsets=[TopicPartition(topic, 0, 10)], asynchronous=False)
    c.close()
    deliveries = rocketmq_consume(rokka, topic, group, 10)
    assert sorted(d.body.decode() for d in deliveries) == sorted(f"m{i}" for i in range(10, 20))
