"""`unclean_election`: when no member of the sync state set is alive, a
node outside it is elected only if the operator allowed it. The set is
brought down to its master alone (both replicas killed, the sync state set
shrinks after `replica_lag_max_ms`), the master takes acknowledged writes
(`min_insync_replicas = 1`), then dies and a stale replica comes back.

Off (the default): the stale node is not elected; the old master, back,
is master again with every message. On: the stale node is elected (a
counted election) and the old master, back, truncates what only it had
and follows — the loss the setting's documentation warns of."""
import time

from confluent_kafka import Producer
from conftest import Cluster, read_topic

TOPIC = "unclean"


def shrink_to_master(cluster):
    """Kills both replicas; returns (master, [replicas]) once the sync
    state set is the master alone."""
    m = cluster.master()
    others = [i for i in cluster.nodes if i != m]
    for i in others:
        cluster.nodes[i].kill()
    deadline = time.time() + 30
    while time.time() < deadline:
        if cluster.nodes[m].metric_values().get("rokka_cluster_sync_state_set_size") == 1.0:
            return m, others
        time.sleep(0.2)
    raise AssertionError("the sync state set did not shrink to the master")


def produce(cluster, n):
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "message.timeout.ms": 20000})
    acked = []
    for i in range(n):
        p.produce(TOPIC, value=f"u{i}".encode(), on_delivery=lambda e, m: e is None and acked.append(m.value()))
    p.flush(30)
    return len(acked)


def count(cluster, partitions=2):
    return len(read_topic(cluster.bootstrap(), TOPIC, partitions, timeout=30))


def lose_the_set(cluster):
    """10 messages on all three, the replicas killed, 100 more on the
    master alone, the master killed, a stale replica started: (old master,
    stale node)."""
    assert cluster.wait_in_sync(), "the three nodes never were in sync"
    assert produce(cluster, 10) == 10
    m, (b, _c) = shrink_to_master(cluster)
    assert produce(cluster, 100) == 100
    cluster.nodes[m].kill()
    cluster.nodes[b].start()
    return m, b


def test_off_no_stale_node_is_elected(tmp_path):
    cluster = Cluster("unclean-off", min_isr=1, extra="replica_lag_max_ms = 1500\n")
    try:
        m, b = lose_the_set(cluster)
        deadline = time.time() + 8
        while time.time() < deadline:
            assert cluster.role(b) != "master", "a node outside the sync state set was elected"
            time.sleep(0.2)
        cluster.nodes[m].start()
        assert cluster.master(timeout=30) == m
        assert count(cluster) == 110
    finally:
        cluster.close()


def test_on_a_stale_node_is_elected_and_the_old_master_truncates(tmp_path):
    cluster = Cluster("unclean-on", min_isr=1, extra="replica_lag_max_ms = 1500\nunclean_election = true\n")
    try:
        m, b = lose_the_set(cluster)
        assert cluster.master(timeout=30, exclude=(m,)) == b
        assert cluster.nodes[b].metric_values().get("rokka_cluster_elections_total", 0) >= 1
        cluster.nodes[m].start()
        deadline = time.time() + 30
        while time.time() < deadline and cluster.role(m) != "replica":
            time.sleep(0.2)
        assert cluster.role(m) == "replica"
        deadline = time.time() + 30
        while time.time() < deadline and not cluster.nodes[m].metric_values().get("rokka_replication_truncations_total"):
            time.sleep(0.2)
        assert cluster.nodes[m].metric_values().get("rokka_replication_truncations_total", 0) >= 1
        # Only what the stale node had is left.
        assert count(cluster) == 10
    finally:
        cluster.close()
