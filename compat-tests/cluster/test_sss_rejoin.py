"""A replica that restarts while the master is busy joins the sync state
set again. It must hold everything acknowledged without it before it is
named there (where it may be elected), and a busy master's high watermark
moves with every append: the master gates it first — acknowledgements wait
for it too, so the watermark stops running ahead — and names it once it
holds the watermark. librdkafka (acks=1) keeps writing the whole time."""
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
    cluster = Cluster("sss-rejoin", n=2, min_isr=1)
    stop = threading.Event()
    acked, failed = [], []

    def load():
        p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": 1, "linger.ms": 1,
                      "message.timeout.ms": 30000})
        i = 0
        deadline = time.time() + 90
        while not stop.is_set() and time.time() < deadline:
            try:
                p.produce(TOPIC, value=f"v-{i}".encode(),
                          on_delivery=lambda e, m: (failed if e else acked).append(m.value() if not e else e))
                i += 1
            except BufferError:  # librdkafka's queue is full: as fast as the broker takes them
                p.poll(0.05)
            p.poll(0)
        p.flush(30)

    try:
        assert cluster.wait_in_sync(size=2)
        m = cluster.master()
        r = next(i for i in cluster.nodes if i != m)
        t = threading.Thread(target=load)
        t.start()
        time.sleep(3)
        assert len(acked) > 1000, f"the load is not running: {len(acked)} acknowledged, {failed[:3]}"
        cluster.nodes[r].stop()
        deadline = time.time() + 20
        while time.time() < deadline and sss_size(cluster, m) != 1.0:
            time.sleep(0.2)
        assert sss_size(cluster, m) == 1.0, "the stopped replica stayed in the set"
        time.sleep(2)
        cluster.nodes[r].start()
        # Back in the set while the load goes on.
        deadline = time.time() + 30
        while time.time() < deadline and sss_size(cluster, m) != 2.0:
            time.sleep(0.2)
        joined = sss_size(cluster, m) == 2.0
        still_loading = t.is_alive()
        stop.set()
        t.join(60)
        assert joined, f"the replica did not rejoin under load ({len(acked)} acknowledged meanwhile)"
        assert still_loading, "the load had stopped before the replica rejoined: not the case tested"
        assert not failed, failed[:3]
        # The new member holds what was acknowledged: it is what a failover
        # to it serves.
        time.sleep(1)
        cluster.nodes[m].kill()
        assert cluster.master(timeout=30, exclude=(m,)) == r
        got = set(read_topic(cluster.bootstrap(), TOPIC, 2, timeout=60))
        missing = [v for v in acked if v.decode() not in got]
        assert not missing, f"{len(missing)} acknowledged records missing on the new master, e.g. {missing[:3]}"
    finally:
        stop.set()
        cluster.close()
