"""Admin APIs with real clients: DescribeConfigs, DescribeCluster,
DeleteRecords (confluent-kafka and kafka-python), OffsetDelete and group
offsets (kafka-python)."""
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from kafka import KafkaAdminClient
from kafka import TopicPartition as KTP


def fill(rokka, topic, n, partitions=1):
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(10)
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for i in range(n):
        p.produce(topic, f"{i}".encode(), partition=i % partitions)
    assert p.flush(20) == 0
    return a


def test_describe_configs_and_cluster(rokka, topic):
    a = fill(rokka, topic, 1)
    res = ConfigResource(ResourceType.TOPIC, topic)
    configs = a.describe_configs([res])[res].result(10)
    assert configs["cleanup.policy"].value == "delete"
    assert int(configs["retention.ms"].value) == 72 * 3600 * 1000
    b = ConfigResource(ResourceType.BROKER, "0")
    assert a.describe_configs([b])[b].result(10)["num.partitions"].value == "1"
    cluster = a.describe_cluster().result(10)
    assert cluster.cluster_id == "rokka-cluster"
    assert [n.id for n in cluster.nodes] == [0]


def test_the_brokers_own_topics_are_not_created_or_deleted_by_clients(rokka):
    """SCHEDULE_TOPIC_XXXX, the half topic, the timer wheel: the broker
    makes them, lazily, with its own configs — one made first by a client
    with retention.ms=1000 would lose every delayed message, one deleted
    every pending one. Refused (INVALID_TOPIC_EXCEPTION), as Apache's
    updateAndCreateTopic and deleteTopic refuse system topics."""
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    own = ["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_wheel_timer"]
    fs = a.create_topics([NewTopic(t, num_partitions=1, config={"retention.ms": "1000"}) for t in own])
    for t, f in fs.items():
        with pytest.raises(KafkaException) as e:
            f.result(10)
        assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, (t, e.value)
    for t, f in a.delete_topics(own, operation_timeout=10).items():
        with pytest.raises(KafkaException) as e:
            f.result(10)
        assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, (t, e.value)
    # Nor are their configs altered (nor their records deleted: DeleteRecords
    # is refused too, which librdkafka cannot send for a topic not made yet).
    res = ConfigResource(ResourceType.TOPIC, own[0], set_config={"retention.ms": "1000"})
    with pytest.raises(KafkaException) as e:
        a.alter_configs([res])[res].result(10)
    assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, e.value
    # Nor grown (CreatePartitions).
    from confluent_kafka.admin import NewPartitions

    for t, f in a.create_partitions([NewPartitions(t, 8) for t in own[:2]]).items():
        with pytest.raises(KafkaException) as e:
            f.result(10)
        assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, (t, e.value)


def test_create_partitions_checks_its_replica_assignments(rokka, topic):
    """One assignment per partition added, naming the broker (set) holding
    it, as Kafka's createPartitions checks (they were ignored)."""
    from confluent_kafka.admin import NewPartitions

    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    for assignment in ([[5]], [[0]]):  # an unknown broker; one assignment for two partitions
        with pytest.raises(KafkaException) as e:
            a.create_partitions([NewPartitions(topic, 3, replica_assignment=assignment)])[topic].result(10)
        assert e.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT, (assignment, e.value)
    a.create_partitions([NewPartitions(topic, 3, replica_assignment=[[0], [0]])])[topic].result(10)
    md = a.list_topics(topic, timeout=10)
    assert len(md.topics[topic].partitions) == 3


def test_a_replication_factor_past_the_brokers_is_refused(rokka, topic):
    """One node: a partition has one replica; 2 is more than there are
    (INVALID_REPLICATION_FACTOR, as Kafka), -1 is the broker's (1)."""
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    with pytest.raises(KafkaException) as e:
        a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=2)])[topic].result(10)
    assert e.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
    a.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(10)


def test_delete_records_moves_the_log_start(rokka, topic):
    a = fill(rokka, topic, 20)
    res = a.delete_records([TopicPartition(topic, 0, 5)])
    assert res[TopicPartition(topic, 0, 5)].result(10).low_watermark == 5
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "dr", "auto.offset.reset": "earliest"})
    assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (5, 20)
    c.assign([TopicPartition(topic, 0, 0)])  # below the start: reset to earliest (5)
    got = []
    deadline = time.time() + 20
    while len(got) < 15 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(int(m.value()))
    c.close()
    assert got == list(range(5, 20))
    # kafka-python too.
    k = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    out = k.delete_records({KTP(topic, 0): 8})
    assert list(out.values())[0]["low_watermark"] == 8
    k.close()


def test_group_offsets_alter_list_delete(rokka, topic):
    fill(rokka, topic, 10, partitions=2)
    group = f"offs-{topic}"
    k = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    from kafka.structs import OffsetAndMetadata

    k.alter_group_offsets(group, {KTP(topic, 0): OffsetAndMetadata(3, "m", -1), KTP(topic, 1): OffsetAndMetadata(4, "", -1)})
    offs = k.list_group_offsets(group)[group]
    assert {tp.partition: om.offset for tp, om in offs.items()} == {0: 3, 1: 4}
    from kafka.errors import NoError, UnknownTopicOrPartitionError

    res = k.delete_group_offsets(group, [KTP(topic, 0), KTP(topic, 7), KTP(topic, -1), KTP("no-such-topic-x", 0)])
    assert res == {
        KTP(topic, 0): NoError,
        KTP(topic, 7): UnknownTopicOrPartitionError,
        KTP(topic, -1): UnknownTopicOrPartitionError,
        KTP("no-such-topic-x", 0): UnknownTopicOrPartitionError,
    }, res
    offs = k.list_group_offsets(group)[group]
    # Partition -1 named no offset: partition 1's stays.
    assert {tp.partition: om.offset for tp, om in offs.items() if om.offset >= 0} == {1: 4}
    k.close()


def test_list_offsets_max_timestamp_is_the_record_with_the_highest_time(rokka, topic):
    from confluent_kafka.admin import OffsetSpec

    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(10)
    # One batch (linger) of three records timed 100, 400, 250: the highest
    # time is the middle record's, offset 1 — not the batch's base offset.
    p = Producer({"bootstrap.servers": rokka.bootstrap, "linger.ms": 500})
    for ts in (100, 400, 250):
        p.produce(topic, b"x", partition=0, timestamp=ts)
    assert p.flush(20) == 0
    tp = TopicPartition(topic, 0)
    got = a.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(10)
    assert (got.offset, got.timestamp) == (1, 400)
    # A later batch with lower times leaves the answer where it is; a
    # higher one moves it.
    for ts in (300, 50):
        p.produce(topic, b"y", partition=0, timestamp=ts)
    assert p.flush(20) == 0
    got = a.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(10)
    assert (got.offset, got.timestamp) == (1, 400)
    p.produce(topic, b"z", partition=0, timestamp=900)
    assert p.flush(20) == 0
    got = a.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(10)
    assert (got.offset, got.timestamp) == (5, 900)
    assert a.list_offsets({tp: OffsetSpec.latest()})[tp].result(10).offset == 6


def test_validate_only_answers_what_creating_would(rokka, topic):
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewPartitions

    a = fill(rokka, topic, 1)
    # More partitions than broker.max_partitions (1024): refused alike with
    # and without validate_only, and nothing is made.
    for validate in (True, False):
        f = a.create_topics([NewTopic(f"{topic}-big", num_partitions=5000, replication_factor=1)], validate_only=validate)
        with pytest.raises(KafkaException) as e:
            f[f"{topic}-big"].result(10)
        assert e.value.args[0].code() == KafkaError.INVALID_PARTITIONS, e.value
        f = a.create_partitions([NewPartitions(topic, 5000)], validate_only=validate)
        with pytest.raises(KafkaException) as e:
            f[topic].result(10)
        assert e.value.args[0].code() == KafkaError.INVALID_PARTITIONS, e.value
    assert f"{topic}-big" not in a.list_topics(timeout=10).topics
    assert len(a.list_topics(timeout=10).topics[topic].partitions) == 1
    # Within it, validate_only says yes and changes nothing.
    a.create_partitions([NewPartitions(topic, 3)], validate_only=True)[topic].result(10)
    assert len(a.list_topics(timeout=10).topics[topic].partitions) == 1


def test_topic_names_kafka_refuses_are_refused(rokka):
    """Through the Kafka API a topic is named as Kafka names one (its
    Topic.validate): at most 249 characters of [A-Za-z0-9._-], and no name
    colliding with an existing one once '.' and '_' are taken as one."""
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic("names_a.b", 1, 1)])["names_a.b"].result(10)
    for bad in ["x" * 250, "has%percent", "has|bar", "names.a_b"]:
        with pytest.raises(KafkaException) as e:
            a.create_topics([NewTopic(bad, 1, 1)])[bad].result(10)
        assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, (bad[:20], e.value)
    a.create_topics([NewTopic("x" * 249, 1, 1)])["x" * 249].result(10)
    # Metadata: an invalid name is TOPIC_EXCEPTION whether or not the client
    # asks for auto-creation (as Kafka's Topic.validate there), and a
    # producer's auto-creation of a colliding name is refused the same way.
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for name in ["has%percent", "names.a_b"]:
        md = p.list_topics(topic=name, timeout=10).topics[name]
        assert md.error is not None and md.error.code() == KafkaError.TOPIC_EXCEPTION, (name, md.error)
        md = a.list_topics(topic=name, timeout=10).topics[name]
        assert md.error is not None, (name, md.error)
    assert "names.a_b" not in a.list_topics(timeout=10).topics


def test_altered_configs_are_checked_together(rokka, topic):
    """Each key alone may pass while the result does not: a topic created
    with min.compaction.lag.ms=60000 given max.compaction.lag.ms=1000 is
    INVALID_CONFIG, as Kafka checks the merged config."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"})])[
        topic
    ].result(10)
    res = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("max.compaction.lag.ms", "1000", incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(KafkaException) as e:
        a.incremental_alter_configs([res])[res].result(10)
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG, e.value
    d = ConfigResource(ResourceType.TOPIC, topic)
    assert a.describe_configs([d])[d].result(10)["max.compaction.lag.ms"].value != "1000"
