"""The set's state in etcd is the controller's word; these cases are
etcd's state going wrong under running nodes.

Older than the nodes' epoch histories (etcd wiped, or restored from an
older backup): the next master's epoch goes past every epoch the nodes
wrote under (an epoch number reused would put two masters' writes under
one number, which a replica's truncation cannot tell apart), and no
acknowledged message is lost through it or a failover after it.

Unreadable: no node acts on it (no election on bytes nobody can read),
every node says so (`rokka_cluster_state_unreadable`) and keeps its role,
writes go on; once repaired, the gauge clears."""
import base64
import json
import time
import urllib.request

from confluent_kafka import Producer
from conftest import Cluster, read_topic

TOPIC = "epochs"


def etcd(cluster, op, **body):
    """One call of etcd's v3 JSON gateway (keys and values base64)."""
    enc = {k: base64.b64encode(v.encode()).decode() for k, v in body.items()}
    req = urllib.request.Request(
        f"{cluster.etcd.endpoint}/v3/kv/{op}", data=json.dumps(enc).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def state_key(name):
    return f"/rokka/{name}/sets/broker-a/state"


def produce(cluster, tag, n=10):
    acked = []
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "message.timeout.ms": 30000})
    for i in range(n):
        p.produce(TOPIC, value=f"{tag}-{i}".encode(), on_delivery=lambda e, m: e is None and acked.append(m))
    p.flush(40)
    assert len(acked) == n, f"{len(acked)} of {n} acknowledged"


def epoch_of(cluster, i):
    return cluster.nodes[i].metric_values().get("rokka_cluster_epoch")


def wait_role(cluster, i, role, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline and cluster.role(i) != role:
        time.sleep(0.2)
    assert cluster.role(i) == role, f"node {i} is {cluster.role(i)}, not {role}"


def values(cluster):
    return sorted(read_topic(cluster.bootstrap(), TOPIC, 2, timeout=30))


def test_a_state_older_than_the_histories_starts_a_later_epoch():
    name = "epoch-back"
    cluster = Cluster(name, n=2, min_isr=1)
    try:
        assert cluster.wait_in_sync(size=2)
        produce(cluster, "a")
        # A failover: the histories reach epoch 2.
        m = cluster.master()
        cluster.nodes[m].kill()
        b = cluster.master(timeout=30, exclude=(m,))
        assert epoch_of(cluster, b) == 2.0
        produce(cluster, "b")
        cluster.nodes[m].start()
        wait_role(cluster, m, "replica")
        assert cluster.wait_in_sync(size=2)
        # Both down; etcd loses the set's state; both back.
        for n in cluster.nodes.values():
            n.stop()
        etcd(cluster, "deleterange", key=state_key(name))
        for n in cluster.nodes.values():
            n.start()
        first = cluster.master(timeout=30)
        first_epoch = epoch_of(cluster, first)
        assert first_epoch > 2.0, f"epoch {first_epoch} reuses a number the histories have"
        assert cluster.wait_in_sync(size=2)
        produce(cluster, "c")
        want = sorted(f"{t}-{i}" for t in "abc" for i in range(10))
        assert values(cluster) == want
        # A failover after it loses nothing either.
        cluster.nodes[first].kill()
        second = cluster.master(timeout=30, exclude=(first,))
        assert epoch_of(cluster, second) > first_epoch
        assert values(cluster) == want
    finally:
        cluster.close()


def test_an_unreadable_state_stops_no_node_and_elects_nobody():
    name = "state-garbled"
    cluster = Cluster(name, n=2, min_isr=1)
    try:
        assert cluster.wait_in_sync(size=2)
        m = cluster.master()
        other = next(i for i in cluster.nodes if i != m)
        got = etcd(cluster, "range", key=state_key(name))
        good = base64.b64decode(got["kvs"][0]["value"]).decode()
        etcd(cluster, "put", key=state_key(name), value="{not json")
        for i in cluster.nodes:
            deadline = time.time() + 10
            while time.time() < deadline and cluster.nodes[i].metric_values().get("rokka_cluster_state_unreadable") != 1.0:
                time.sleep(0.2)
            assert cluster.nodes[i].metric_values().get("rokka_cluster_state_unreadable") == 1.0, f"node {i}"
        # Roles stay; writes go on.
        time.sleep(1)
        assert cluster.role(m) == "master" and cluster.role(other) == "replica"
        produce(cluster, "g")
        etcd(cluster, "put", key=state_key(name), value=good)
        for i in cluster.nodes:
            deadline = time.time() + 10
            while time.time() < deadline and cluster.nodes[i].metric_values().get("rokka_cluster_state_unreadable") != 0.0:
                time.sleep(0.2)
            assert cluster.nodes[i].metric_values().get("rokka_cluster_state_unreadable") == 0.0, f"node {i}"
        assert cluster.role(m) == "master"
        assert values(cluster) == sorted(f"g-{i}" for i in range(10))
    finally:
        cluster.close()


def test_a_state_deleted_under_a_live_master_is_written_again_by_it():
    """etcd loses the set's state while its nodes run: the live master
    writes it again as it stands (its epoch, its sync state set) and stays
    master; the replica, which has a history, waits for it instead of
    taking the set (a replica behind the master taking it would make the
    master cut its log). No election, no new epoch, writes go on."""
    name = "state-gone"
    cluster = Cluster(name, n=2, min_isr=1)
    try:
        assert cluster.wait_in_sync(size=2)
        produce(cluster, "a")
        m = cluster.master()
        epoch = epoch_of(cluster, m)
        etcd(cluster, "deleterange", key=state_key(name))
        deadline = time.time() + 15
        while time.time() < deadline and not etcd(cluster, "range", key=state_key(name)).get("kvs"):
            time.sleep(0.2)
        kvs = etcd(cluster, "range", key=state_key(name)).get("kvs")
        assert kvs, "the state was not written again"
        st = json.loads(base64.b64decode(kvs[0]["value"]))
        assert st["master"] == m and float(st["epoch"]) == epoch, st
        time.sleep(3)
        assert cluster.master() == m and epoch_of(cluster, m) == epoch
        assert cluster.wait_in_sync(size=2)
        produce(cluster, "b")
        assert values(cluster) == sorted(f"{t}-{i}" for t in "ab" for i in range(10))
    finally:
        cluster.close()


def test_a_fresh_node_does_not_take_a_set_whose_state_is_missing_from_a_node_with_a_history():
    """Both nodes of a set down, etcd loses the set's state, the replica
    (with its history) and a brand-new node start: the new node must not
    take the set — the replica would follow it and cut its log to nothing.
    The node with the history takes it (after two lease lives, in case a
    live master writes the state again) and the new one follows it."""
    name = "fresh-node"
    cluster = Cluster(name, n=2, min_isr=1)
    try:
        assert cluster.wait_in_sync(size=2)
        produce(cluster, "a")
        m = cluster.master()
        r = next(i for i in cluster.nodes if i != m)
        for n in cluster.nodes.values():
            n.stop()
        etcd(cluster, "deleterange", key=state_key(name))
        cluster.nodes[r].start()
        time.sleep(0.5)
        cluster.add_node(3)
        first = cluster.master(timeout=30, exclude=(m,))
        assert first == r, f"node {first} took the set, not the node with the history ({r})"
        assert values(cluster) == sorted(f"a-{i}" for i in range(10))
        wait_role(cluster, 3, "replica")
    finally:
        cluster.close()
