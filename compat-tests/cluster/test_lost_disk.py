"""A member of the sync state set whose disk was lost (its data directory
gone) comes back while the master is down: it is a live member etcd still
names, with an empty log. The election takes a member with an epoch
history instead — electing the empty one would make the other members cut
their logs to nothing and lose every acknowledged record."""
import os
import shutil
import time

from confluent_kafka import Producer
from conftest import Cluster, read_topic

TOPIC = "lost-disk"


def test_a_member_back_with_an_empty_log_is_not_elected():
    # A longer lease: the emptied node is registered again well before the
    # dead master's lease runs out, so both remaining members are
    # candidates at the election.
    cluster = Cluster("lost-disk", lease_ttl=6)
    try:
        assert cluster.wait_in_sync(), "the three nodes never were in sync"
        p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "message.timeout.ms": 20000})
        acked = []
        for i in range(200):
            p.produce(TOPIC, value=f"d{i}".encode(), on_delivery=lambda e, m: e is None and acked.append(m.value()))
        p.flush(30)
        assert len(acked) == 200
        assert cluster.wait_in_sync(), "the replicas did not hold the acknowledged records"
        m = cluster.master()
        lost, kept = sorted(i for i in cluster.nodes if i != m)
        cluster.nodes[m].kill()
        cluster.nodes[lost].kill()
        killed = time.time()
        shutil.rmtree(os.path.join(cluster.nodes[lost].workdir, "data"))
        cluster.nodes[lost].start()
        assert time.time() - killed < 4, "the emptied node came back too late to be a candidate; nothing was tested"
        # Until the dead master's lease ends no one is elected.
        new = cluster.master(timeout=30, exclude=(m,))
        assert new == kept, f"node {new} (its log emptied) was elected over node {kept}"
        values = read_topic(cluster.bootstrap(), TOPIC, 2, timeout=30)
        assert len(values) == 200, f"{len(values)} of 200 acknowledged records left"
        # The emptied node follows and gets the records back.
        assert cluster.wait_in_sync(2), "the emptied node did not catch up"
    finally:
        cluster.close()
