"""Kafka transactions through a failover (librdkafka's transactional
producer): the coordinator's state goes with the replication stream, so
after the master is SIGKILLed the new master knows the open transaction —
read_committed readers are held at its first offset, an aborted
transaction stays hidden — and the same producer commits it there."""
import time

import pytest
from confluent_kafka import Producer
from conftest import Cluster, read_topic

TOPIC = "txn-failover"


@pytest.fixture(scope="module")
def cluster():
    c = Cluster("txn-failover")
    yield c
    c.close()


def read_committed(cluster, partitions=2):
    return read_topic(cluster.bootstrap(), TOPIC, partitions, **{"isolation.level": "read_committed"})


def test_an_open_transaction_survives_the_masters_death_and_commits_on_the_new_one(cluster):
    p = Producer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "transactional.id": "txn-failover-1",
            "transaction.timeout.ms": 60000,
            "message.timeout.ms": 60000,
        }
    )
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(50):
        p.produce(TOPIC, key=str(i).encode(), value=f"committed-{i}".encode())
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(50):
        p.produce(TOPIC, key=str(i).encode(), value=f"aborted-{i}".encode())
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(50):
        p.produce(TOPIC, key=str(i).encode(), value=f"open-{i}".encode())
    assert p.flush(30) == 0
    time.sleep(1)  # the coordinator's state reaches the replicas within 200 ms

    old = cluster.master()
    cluster.nodes[old].kill()
    cluster.master(timeout=30, exclude=(old,))

    # The new master holds read_committed readers before the open
    # transaction and hides the aborted one.
    seen = read_committed(cluster)
    assert sorted(seen) == sorted(f"committed-{i}" for i in range(50)), sorted(set(v.split("-")[0] for v in seen))

    # The same producer commits its transaction on the new coordinator.
    p.commit_transaction(60)
    seen = read_committed(cluster)
    want = [f"committed-{i}" for i in range(50)] + [f"open-{i}" for i in range(50)]
    assert sorted(seen) == sorted(want), sorted(set(v.split("-")[0] for v in seen))
    cluster.nodes[old].start()
