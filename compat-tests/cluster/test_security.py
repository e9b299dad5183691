"""Kafka SASL in cluster mode (docs/security.md): two broker sets behind
etcd, every node with a SASL listener. A user created on one node's
plaintext listener reaches every node through etcd's users table; a SCRAM
client bootstrapping at another set's node is told every node's SASL
listener (not the plaintext ones) and produces to and consumes from
partitions on both sets; a deleted user is refused everywhere."""
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from conftest import TwoSets


@pytest.fixture(scope="module")
def cluster():
    c = TwoSets("security", kafka_extra='sasl_listen = "127.0.0.1:0"')
    yield c
    c.close()


def sasl_conf(node, user, password):
    return {
        "bootstrap.servers": f"127.0.0.1:{node.sasl_port}",
        "security.protocol": "sasl_plaintext",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
    }


def test_a_user_made_on_one_node_logs_in_everywhere(cluster):
    cluster.masters(60)
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    ups = [UserScramCredentialUpsertion("erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"erin-pw")]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(15)
    for f in admin.create_topics([NewTopic("secure-spread", 4, 1)]).values():
        f.result(15)
    # Every node takes the user from etcd within its poll interval.
    deadline = time.time() + 20
    for i, node in cluster.nodes.items():
        while True:
            try:
                md = AdminClient(sasl_conf(node, "erin", "erin-pw")).list_topics(timeout=5)
                break
            except KafkaException:
                assert time.time() < deadline, f"node {i} never accepted erin"
        # Metadata over SASL names the nodes' SASL listeners.
        assert sorted(b.port for b in md.brokers.values()) == sorted(n.sasl_port for n in cluster.nodes.values()), i
    conf = sasl_conf(cluster.nodes[3], "erin", "erin-pw")
    p = Producer(conf)
    for i in range(40):
        p.produce("secure-spread", value=f"s-{i}".encode(), partition=i % 4)
    assert p.flush(30) == 0
    c = Consumer({**conf, "group.id": "secure-group", "auto.offset.reset": "earliest"})
    c.subscribe(["secure-spread"])
    got, deadline = [], time.time() + 40
    while len(got) < 40 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition("secure-spread", q) for q in range(4)], timeout=10)
    c.close()
    assert sorted(got) == sorted(f"s-{i}" for i in range(40))
    assert sum(tp.offset for tp in committed) == 40
    # Deleted on node 4: refused on node 1 too, once etcd's table reaches it.
    admin4 = AdminClient({"bootstrap.servers": cluster.nodes[4].bootstrap})
    for f in admin4.alter_user_scram_credentials([UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_512)]).values():
        f.result(15)
    deadline = time.time() + 20
    while True:
        try:
            AdminClient(sasl_conf(cluster.nodes[1], "erin", "erin-pw")).list_topics(timeout=3)
        except KafkaException:
            break
        assert time.time() < deadline, "node 1 still accepts a deleted user"
        time.sleep(0.5)
