"""A replica away for longer than the master's retention: what it lacks is
gone from the master (its first segments deleted), so it cannot be sent.
It drops its log and continues at the master's first offset, every queue
where the master's continues — an idle partition's offsets do not go back
— then holds what the master holds: after the master's kill -9 it is
elected and serves every message the master still had, at the same
offsets (rokka_replication_log_restarts_total)."""
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import Cluster

# 1.1 MiB segments (the least with 1 MiB messages), retention keeping
# about four of them, checked every 500 ms.
STORE = (
    "commitlog_segment_bytes = 1114112\nmax_message_bytes = 1048576\npreallocate = false\n"
    "retention_max_bytes = 4456448\nretention_check_interval_ms = 500"
)


def produce(bootstrap, topic, n, tag, size=20000, partition=0):
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 30000,
                  "linger.ms": 5, "compression.type": "none"})
    pad = "x" * size
    for i in range(n):
        p.produce(topic, value=f"{tag}-{i}-{pad}".encode(), partition=partition)
    assert p.flush(60) == 0


def marks(bootstrap, topic, partition):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"m-{time.time_ns()}"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        c.close()


def test_a_replica_away_past_retention_restarts_its_log_at_the_masters_start():
    cluster = Cluster("log-restart", n=2, min_isr=1, store_base=STORE, extra="replica_lag_max_ms = 2000\n")
    try:
        assert cluster.wait_in_sync(size=2)
        a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
        for f in a.create_topics([NewTopic("busy", 1, 2), NewTopic("idle", 1, 2)]).values():
            f.result(30)
        produce(cluster.bootstrap(), "idle", 30, "i", size=100)
        m = cluster.master()
        r = next(i for i in cluster.nodes if i != m)
        cluster.nodes[r].kill()
        # ~12 MiB while the replica is away: retention drops the first
        # segments (the idle partition's records with them).
        produce(cluster.nodes[m].bootstrap, "busy", 600, "b")
        deadline = time.time() + 30
        while time.time() < deadline and marks(cluster.nodes[m].bootstrap, "idle", 0)[0] == 0:
            time.sleep(0.5)
        idle_marks = marks(cluster.nodes[m].bootstrap, "idle", 0)
        busy_marks = marks(cluster.nodes[m].bootstrap, "busy", 0)
        assert idle_marks == (30, 30), f"retention took the idle partition's records: {idle_marks}"
        assert busy_marks[0] > 0, busy_marks
        cluster.nodes[r].start()
        deadline = time.time() + 60
        while time.time() < deadline:
            got = cluster.nodes[r].metric_values().get("rokka_replication_log_restarts_total", 0)
            if got >= 1 and cluster.wait_in_sync(size=2, timeout=1):
                break
            time.sleep(0.5)
        assert cluster.nodes[r].metric_values().get("rokka_replication_log_restarts_total", 0) >= 1
        assert cluster.wait_in_sync(size=2)
        # The replica is the set now: what the master had, where it had it.
        cluster.nodes[m].kill()
        assert cluster.master(timeout=30, exclude=(m,)) == r
        boot = cluster.nodes[r].bootstrap
        deadline = time.time() + 30
        while time.time() < deadline and marks(boot, "busy", 0) != busy_marks:
            time.sleep(0.5)
        assert marks(boot, "busy", 0) == busy_marks
        assert marks(boot, "idle", 0) == idle_marks, "the idle partition's offsets went back"
        c = Consumer({"bootstrap.servers": boot, "group.id": "restart-read", "enable.partition.eof": True})
        c.assign([TopicPartition("busy", 0, busy_marks[0])])
        values, deadline = [], time.time() + 60
        while time.time() < deadline and len(values) < busy_marks[1] - busy_marks[0]:
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value().split(b"-")[1].decode())
        c.close()
        assert len(values) == busy_marks[1] - busy_marks[0]
        assert values[-1] == "599"
        # New writes to the idle partition continue its offsets.
        produce(boot, "idle", 1, "after", size=10)
        assert marks(boot, "idle", 0) == (30, 31)
    finally:
        cluster.close()
