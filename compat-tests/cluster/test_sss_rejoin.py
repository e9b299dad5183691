"""A replica that restarts while the master is busy joins the sync state
set again — and only once it holds every acknowledged record, since a set
member may be elected. A busy master's high watermark moves with every
append: the master gates the replica first (acknowledgements wait for it
too, so the watermark stops running ahead) and names it once it holds the
watermark. librdkafka (acks=all, min.insync.replicas 2) keeps writing the
whole time; the master is killed the moment the replica is named again,
the load still running, and no acknowledged record is missing on the
replica that takes over."""
import subprocess
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import Cluster, read_topic, remoting
from rokka_fixture import HARNESS

TOPIC = "rejoin"


def sss_size(cluster, i):
    try:
        return cluster.nodes[i].metric_values().get("rokka_cluster_sync_state_set_size")
    except OSError:
        return None


def test_a_replica_restarted_under_load_rejoins_and_holds_every_acknowledged_record():
    cluster = Cluster("sss-rejoin", n=2, min_isr=2)
    stop = threading.Event()
    acked, failed = [], []

    def delivered(err, msg):
        if err:
            failed.append(err)
        else:
            acked.append(msg.value())

    def load():
        p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "linger.ms": 1,
                      "message.timeout.ms": 15000})
        i = 0
        deadline = time.time() + 90
        while not stop.is_set() and time.time() < deadline:
            try:
                p.produce(TOPIC, value=f"v-{i}".encode(), on_delivery=delivered)
                i += 1
            except BufferError:  # librdkafka's queue is full: as fast as the broker takes them
                p.poll(0.05)
            p.poll(0)
        p.flush(40)

    t = threading.Thread(target=load)
    try:
        assert cluster.wait_in_sync(size=2)
        m = cluster.master()
        r = next(i for i in cluster.nodes if i != m)
        t.start()
        time.sleep(3)
        assert len(acked) > 1000, f"the load is not running: {len(acked)} acknowledged, {failed[:3]}"
        cluster.nodes[r].stop()
        deadline = time.time() + 20
        while time.time() < deadline and sss_size(cluster, m) != 1.0:
            time.sleep(0.1)
        assert sss_size(cluster, m) == 1.0, "the stopped replica stayed in the set"
        time.sleep(1)
        cluster.nodes[r].start()
        # Named again while the load goes on; the master dies at once.
        deadline = time.time() + 30
        while time.time() < deadline and sss_size(cluster, m) != 2.0:
            time.sleep(0.05)
        assert sss_size(cluster, m) == 2.0, f"the replica did not rejoin under load ({len(acked)} acknowledged)"
        assert t.is_alive(), "the load had stopped before the replica rejoined: not the case tested"
        cluster.nodes[m].kill()
        # (Alone, the new master takes no acks=all write: min ISR 2.)
        assert cluster.master(timeout=30, exclude=(m,)) == r
        stop.set()
        t.join(60)
        got = set(read_topic(cluster.bootstrap(), TOPIC, 2, timeout=60))
        missing = [v for v in acked if v.decode() not in got]
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged records missing on the new master, e.g. {missing[:3]}"
    finally:
        stop.set()
        if t.is_alive():
            t.join(60)
        cluster.close()


def test_writes_below_min_insync_replicas_are_refused_before_they_are_stored():
    """A set below `min_insync_replicas` (its replica stopped) refuses
    acks=all produces NOT_ENOUGH_REPLICAS and RocketMQ sends (Apache's
    IN_SYNC_REPLICAS_NOT_ENOUGH) before anything is appended — refused
    after the append, every retry of a producer without idempotence stored
    the records again (a fresh set's first writes came out duplicated).
    Back in sync, the topics hold exactly what was acknowledged."""
    cluster = Cluster("sss-short", n=2, min_isr=2)
    try:
        assert cluster.wait_in_sync(size=2)
        m = cluster.master()
        r = next(i for i in cluster.nodes if i != m)
        a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
        for f in a.create_topics([NewTopic("short-k", 1, 1)]).values():
            f.result(15)
        # The RocketMQ topic made while the set is whole (dur-send makes it).
        p = subprocess.run([HARNESS, f"127.0.0.1:{cluster.nodes[m].namesrv_port}", "dur-send", "ShortR", "a", "1"],
                           capture_output=True, text=True, timeout=120)
        assert "acked a-0" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
        cluster.nodes[r].stop()
        deadline = time.time() + 20
        while time.time() < deadline and sss_size(cluster, m) != 1.0:
            time.sleep(0.1)
        assert sss_size(cluster, m) == 1.0, "the stopped replica stayed in the set"

        errors = []
        prod = Producer({"bootstrap.servers": cluster.nodes[m].bootstrap, "acks": "all", "enable.idempotence": False,
                         "message.timeout.ms": 4000, "retry.backoff.ms": 100})
        for i in range(3):
            prod.produce("short-k", value=f"refused-{i}".encode(), on_delivery=lambda e, msg: errors.append(e))
        prod.flush(20)
        assert len(errors) == 3 and all(e is not None for e in errors), errors
        c = Consumer({"bootstrap.servers": cluster.nodes[m].bootstrap, "group.id": "short-wm"})
        lo, hi = c.get_watermark_offsets(TopicPartition("short-k", 0), timeout=10)
        c.close()
        assert hi == 0, f"{hi} records of refused produces stored"

        p = subprocess.run([HARNESS, f"127.0.0.1:{cluster.nodes[m].namesrv_port}", "dur-send", "ShortR", "b", "2", "20"],
                           capture_output=True, text=True, timeout=120)
        assert "acked b-" not in p.stdout, p.stdout[-2000:]
        ends = []
        for q in range(4):
            code, ext, _ = remoting(cluster.nodes[m].broker_port, 30, {"topic": "ShortR", "queueId": str(q)})
            assert code == 0, (code, ext)
            ends.append(int(ext["offset"]))
        assert sum(ends) == 1, f"refused sends stored: queue ends {ends}"

        cluster.nodes[r].start()
        assert cluster.wait_in_sync(size=2)
        prod = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "enable.idempotence": False})
        for i in range(5):
            prod.produce("short-k", value=f"ok-{i}".encode())
        assert prod.flush(30) == 0
        assert sorted(read_topic(cluster.bootstrap(), "short-k", 1)) == [f"ok-{i}" for i in range(5)]
    finally:
        cluster.close()
