"""Deleting a cluster's only topic: etcd's topic table is then empty, which
a master took for etcd started afresh and published its own table again —
bringing the topic back on every node. The tombstone of the deleted
incarnation keeps it deleted (docs/cluster.md, "Deleting a topic")."""
import time

import pytest
from confluent_kafka.admin import AdminClient
from conftest import TwoSets
from test_broker_sets import create_topic, leaders, masters


@pytest.fixture(scope="module")
def cluster():
    c = TwoSets("delete_last")
    yield c
    c.close()


def test_the_last_topic_deleted_stays_deleted(cluster):
    masters(cluster)
    a = create_topic(cluster, "only", 4, via=1)
    leaders(a, "only", 4)
    for f in a.delete_topics(["only"]).values():
        f.result(15)
    # Several polls of every node (200 ms each).
    time.sleep(3)
    for i, n in cluster.nodes.items():
        md = AdminClient({"bootstrap.servers": n.bootstrap}).list_topics(timeout=10).topics
        assert "only" not in md, f"node {i} lists the deleted topic again"
