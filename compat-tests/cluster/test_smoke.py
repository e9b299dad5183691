"""A three-node set: one master elected, Kafka Metadata names it with the
set as replicas and ISR, acks=all produce goes through it and a consumer
reads from it; replicas refuse writes."""
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from conftest import Cluster


@pytest.fixture(scope="module")
def cluster():
    c = Cluster("smoke")
    yield c
    c.close()


def test_one_master_and_metadata_names_the_set(cluster):
    m = cluster.master()
    roles = {i: cluster.role(i) for i in cluster.nodes}
    assert sorted(roles.values()) == ["master", "replica", "replica"], roles
    a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "enable.idempotence": True})
    for i in range(100):
        p.produce("smoke", key=str(i).encode(), value=f"v{i}".encode())
    assert p.flush(30) == 0
    md = a.list_topics("smoke", timeout=10)
    assert sorted(md.brokers) == [1, 2, 3]
    for part in md.topics["smoke"].partitions.values():
        assert part.leader == m
        assert sorted(part.replicas) == [1, 2, 3]
    deadline = time.time() + 15
    while time.time() < deadline:
        isr = sorted(a.list_topics("smoke", timeout=10).topics["smoke"].partitions[0].isrs)
        if isr == [1, 2, 3]:
            break
        time.sleep(0.2)
    assert isr == [1, 2, 3]
    c = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": "smoke", "auto.offset.reset": "earliest"})
    c.subscribe(["smoke"])
    got = set()
    deadline = time.time() + 30
    while len(got) < 100 and time.time() < deadline:
        msg = c.poll(0.5)
        if msg is not None and not msg.error():
            got.add(msg.value())
    c.close()
    assert len(got) == 100
