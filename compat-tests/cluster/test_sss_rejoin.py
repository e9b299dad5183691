"""A replica that restarts while the master is busy joins the sync state
set again — and only once it holds every acknowledged record, since a set
member may be elected. A busy master's high watermark moves with every
append: the master gates the replica first (acknowledgements wait for it
too, so the watermark stops running ahead) and names it once it holds the
watermark. librdkafka (acks=all, min.insync.replicas 2) keeps writing the
whole time; the master is killed the moment the replica is named again,
the load still running, and no acknowledged record is missing on the
replica that takes over."""
import threading
import time

from confluent_kafka import Producer
from conftest import Cluster, read_topic

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
