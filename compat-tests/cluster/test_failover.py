"""Failover under load: a confluent-kafka producer (acks=all, idempotent)
writes while the master is SIGKILLed, five times, the killed node coming
back each time as a replica. No acknowledged message is lost, none is
duplicated, and the time from the kill to the first acknowledged write on
the new master is measured (printed; docs/benchmarks.md)."""
import os
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from conftest import Cluster, read_topic

ROUNDS = int(os.environ.get("ROKKA_FAILOVER_ROUNDS", "5"))
TOPIC = "failover"


@pytest.fixture(scope="module")
def cluster():
    c = Cluster("failover")
    yield c
    c.close()


def in_sync(cluster, ids, timeout=30):
    a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            parts = a.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions
            if all(sorted(p.isrs) == sorted(ids) for p in parts.values()):
                return True
        except Exception:  # noqa: BLE001 - metadata during a failover
            pass
        time.sleep(0.2)
    return False


def produce_acked(bootstrap, topic, values):
    """Every value (keyed by its index) produced with acks=all, all acknowledged."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i, v in enumerate(values):
        p.produce(topic, key=str(i).encode(), value=v.encode())
    assert p.flush(60) == 0


def read_all(cluster, partitions=2):
    return read_topic(cluster.bootstrap(), TOPIC, partitions)


def test_kill_the_master_under_acks_all_load(cluster):
    acked, failed = set(), []
    first_ack_after_kill = {}
    p = Producer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60000,
        }
    )
    state = {"killed_at": None, "round": 0}

    def delivered(err, msg):
        if err is None:
            acked.add(msg.value().decode())
            r = state["round"]
            if state["killed_at"] is not None and r not in first_ack_after_kill:
                first_ack_after_kill[r] = time.time() - state["killed_at"]
        else:
            failed.append((msg.value().decode(), str(err)))

    n = 0

    def produce_for(seconds):
        nonlocal n
        end = time.time() + seconds
        while time.time() < end:
            p.produce(TOPIC, key=str(n).encode(), value=f"m{n}".encode(), on_delivery=delivered)
            n += 1
            p.poll(0.002)

    produce_for(2)
    assert in_sync(cluster, [1, 2, 3]), "all three in sync before the first kill"
    for r in range(ROUNDS):
        master = cluster.master()
        state["round"], state["killed_at"] = r, None
        produce_for(1)
        state["killed_at"] = time.time()
        cluster.nodes[master].kill()
        produce_for(2)
        new = cluster.master(timeout=30, exclude=(master,))
        assert new != master
        produce_for(3)
        assert p.flush(60) == 0
        assert r in first_ack_after_kill, f"round {r}: nothing acknowledged after the kill"
        cluster.nodes[master].start()
        assert in_sync(cluster, [1, 2, 3], timeout=60), f"round {r}: node {master} did not catch up"
    assert p.flush(60) == 0
    values = read_all(cluster)
    stored = set(values)
    lost = acked - stored
    dups = len(values) - len(stored)
    times = [round(first_ack_after_kill[r], 2) for r in sorted(first_ack_after_kill)]
    print(f"\nfailover: {ROUNDS} kills, {len(acked)} acked, {len(failed)} failed, {dups} duplicates; "
          f"kill -> first ack on the new master (s): {times}")
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    assert dups == 0, f"{dups} duplicates"


def test_a_paused_master_is_fenced_and_follows(cluster):
    """SIGSTOP the master past its lease, then SIGCONT: the set has elected
    another; the old master takes no write, steps down, truncates what only
    it had and follows; every acknowledged message is there once."""
    import signal

    acked = set()
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "enable.idempotence": True, "linger.ms": 5})

    def delivered(err, msg):
        if err is None:
            acked.add(msg.value().decode())

    def produce_for(seconds, tag):
        end = time.time() + seconds
        i = 0
        while time.time() < end:
            p.produce(TOPIC, value=f"{tag}-{i}".encode(), on_delivery=delivered)
            i += 1
            p.poll(0.002)

    assert in_sync(cluster, [1, 2, 3], timeout=60)
    old = cluster.master()
    proc = cluster.nodes[old].proc
    produce_for(1, "before")
    proc.send_signal(signal.SIGSTOP)
    try:
        produce_for(6, "paused")  # lease_ttl_secs = 2: another node is elected meanwhile
        new = cluster.master(timeout=20, exclude=(old,))
        assert new != old
    finally:
        proc.send_signal(signal.SIGCONT)
    produce_for(3, "after")
    assert p.flush(60) == 0
    deadline = time.time() + 20
    while time.time() < deadline and cluster.role(old) != "replica":
        time.sleep(0.2)
    assert cluster.role(old) == "replica", cluster.role(old)
    assert in_sync(cluster, [1, 2, 3], timeout=60)
    m = cluster.nodes[old].metric_values()
    assert m.get("rokka_cluster_fenced_total", 0) >= 1 or m.get("rokka_cluster_role") == 2.0
    values = read_all(cluster)
    lost = acked - set(values)
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    import collections

    dups = sorted(v for v, n in collections.Counter(values).items() if n > 1)
    assert not dups, f"duplicates: {dups[:20]}"


def test_a_consumer_group_continues_from_its_committed_offsets_on_the_new_master(cluster):
    """Offsets committed on the master follow it: after the master is
    killed, the group's next member starts where the last one committed."""
    topic = "failover-group"
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all"})
    for i in range(4000):
        p.produce(topic, key=str(i).encode(), value=f"g{i}".encode())
    assert p.flush(60) == 0
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "group.id": "failover-g",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    seen = 0
    deadline = time.time() + 30
    while seen < 1000 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            seen += 1
    c.commit(asynchronous=False)
    committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, q) for q in range(2)], timeout=10)}
    c.close()
    assert sum(o for o in committed.values() if o >= 0) >= 1000, committed
    # Each partition holds about 2000: the group is mid-way in both or
    # has not started one (which then starts at the beginning).
    want = {q: max(o, 0) for q, o in committed.items()}
    time.sleep(1)  # offsets reach the replicas within 200 ms
    old = cluster.master()
    cluster.nodes[old].kill()
    cluster.master(timeout=30, exclude=(old,))
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "group.id": "failover-g",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    first = {}
    deadline = time.time() + 60
    while len(first) < 2 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            first.setdefault(m.partition(), m.offset())
    c.close()
    cluster.nodes[old].start()
    assert first == want, (first, committed)


def test_a_group_assigned_just_before_its_coordinators_kill_keeps_its_generation(cluster):
    """A member is told its assignment only once the set's in-sync replicas
    hold the group's new generation (Kafka answers SyncGroup after the
    group's record is written with acks=all): the master, which coordinates
    the group, is SIGKILLed the moment librdkafka hands the assignment to
    the application, and the member goes on with the new master without a
    rebalance (no revocation, no second assignment)."""
    topic = "failover-assigned"
    assert in_sync(cluster, [1, 2, 3], timeout=60)
    produce_acked(cluster.bootstrap(), topic, [f"a{i}" for i in range(200)])
    assert in_sync(cluster, [1, 2, 3], timeout=60)
    old = cluster.master()
    events = []

    def assigned(consumer, parts):
        events.append(("assign", sorted(tp.partition for tp in parts)))
        if len(events) == 1:
            cluster.nodes[old].kill()

    def revoked(consumer, parts):
        events.append(("revoke", sorted(tp.partition for tp in parts)))

    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "group.id": "failover-assigned-g",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 30000,
        }
    )
    c.subscribe([topic], on_assign=assigned, on_revoke=revoked)
    got = set()
    try:
        deadline = time.time() + 90
        while len(got) < 200 and time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.add(m.value().decode())
        # Heartbeats reach the new coordinator (every 3 s by default).
        settle = time.time() + 8
        while time.time() < settle:
            c.poll(0.5)
    finally:
        c.close()
        cluster.nodes[old].start()
    assert len(got) == 200, f"read {len(got)} of 200; events {events}"
    assert events[0][0] == "assign" and events[0][1] == [0, 1], events
    # close() revokes once at the end; nothing before it.
    assert [e for e in events[1:] if e[0] == "assign"] == [], f"the group rebalanced after the failover: {events}"


def test_a_kip848_group_goes_on_with_the_new_coordinator_without_rejoining(cluster):
    """A KIP-848 consumer group (librdkafka, group.protocol=consumer) is
    replicated with the set (group epoch, members and their epochs,
    assignments), as Kafka keeps it in `__consumer_offsets`: its
    coordinator — the master — is SIGKILLed while the member consumes, and
    the member's heartbeats go on at the new master with the epoch it had:
    no heartbeat is refused there, nothing is revoked or lost and assigned
    again, and every message is read once."""
    topic = "failover-kip848"
    assert in_sync(cluster, [1, 2, 3], timeout=60)
    produce_acked(cluster.bootstrap(), topic, [f"k{i}" for i in range(100)])
    assert in_sync(cluster, [1, 2, 3], timeout=60)
    old = cluster.master()
    events = []
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "group.id": "failover-kip848-g",
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe(
        [topic],
        on_assign=lambda _c, parts: events.append(("assign", sorted(tp.partition for tp in parts))),
        on_revoke=lambda _c, parts: events.append(("revoke", sorted(tp.partition for tp in parts))),
        on_lost=lambda _c, parts: events.append(("lost", sorted(tp.partition for tp in parts))),
    )
    got = []

    def consume(until, deadline):
        while len(got) < until and time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value().decode())
                c.commit(message=m, asynchronous=False)

    new = None
    try:
        consume(100, time.time() + 60)
        # The group as it is now reaches the replicas with the stream.
        settle = time.time() + 2
        while time.time() < settle:
            c.poll(0.2)
        cluster.nodes[old].kill()
        new = cluster.master(exclude=(old,))
        produce_acked(cluster.nodes[new].bootstrap, topic, [f"k{i}" for i in range(100, 200)])
        consume(200, time.time() + 60)
        # Heartbeats reach the new coordinator (the interval it gives, 5 s).
        settle = time.time() + 8
        while time.time() < settle:
            c.poll(0.5)
        refused = {
            k: v
            for k, v in cluster.nodes[new].metric_values().items()
            if k.startswith("rokka_kafka_errors_total{") and 'api="ConsumerGroupHeartbeat"' in k and v
        }
    finally:
        c.close()
        cluster.nodes[old].start()
    assert sorted(got) == sorted(f"k{i}" for i in range(200)), (len(got), len(set(got)), events)
    assert events[0] == ("assign", [0, 1]), events
    assert events[1:] == [] or events[1:] == [("revoke", [0, 1])], f"the member rejoined after the failover: {events}"
    assert not refused, f"the new coordinator refused the member's heartbeats: {refused}"


def test_the_dashboards_cluster_metrics_are_exported(cluster):
    """After the failovers above: every cluster metric the Grafana dashboard
    and the alert rules use is exported by the nodes, with its HELP."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
    from dashboard import families, metric_names

    seen = {}
    for n in cluster.nodes.values():
        if n.proc:
            seen.update(families(n.metrics()))
    missing = {m: where for m, where in metric_names("Cluster").items() if m not in seen}
    assert not missing, f"used by the dashboard/alerts but not exported: {missing}"
    assert all(seen[m] for m in metric_names("Cluster")), "every one has a HELP text"
