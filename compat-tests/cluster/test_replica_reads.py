"""Reads from replicas (`cluster.read_from_replicas`): node i sits in rack
r<i>. A librdkafka consumer with `client.rack` = a replica's rack is
pointed at that replica by the master (KIP-392 `preferred_read_replica`)
and reads everything from it; one in the master's rack stays on the master.
A RocketMQ push consumer (rocketmq-client-rust) that is behind is pointed
at an in-sync replica (`suggestWhichBrokerId`) and back to the master once
caught up. Each check fails if the redirection does not happen (the
replicas' served-read counters stay at zero)."""
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from conftest import Cluster

from rokka_fixture import HARNESS
TOPIC = "replica-reads"


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(
        "replica-reads",
        extra=lambda i: f'rack = "r{i}"\nread_from_replicas = true\nreplica_read_lag_bytes = 0\n',
    )
    yield c
    c.close()


def counter(node, name, protocol):
    return node.metric_values().get(f'{name}{{protocol="{protocol}"}}', 0.0)


def consume_all(cluster, group, rack, n):
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "group.id": group,
            "client.rack": rack,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([TOPIC])
    got = []
    deadline = time.time() + 60
    while len(got) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    c.close()
    return got


def test_metadata_and_describe_cluster_list_every_rack(cluster):
    a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    deadline = time.time() + 20
    racks = {}
    while time.time() < deadline and len(racks) < 3:
        d = a.describe_cluster(request_timeout=5).result()
        racks = {n.id: n.rack for n in d.nodes}
        time.sleep(0.2)
    assert racks == {1: "r1", 2: "r2", 3: "r3"}, racks
    assert d.controller is not None and d.controller.id == cluster.master()


def test_a_kafka_consumer_reads_from_the_replica_in_its_rack(cluster):
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all"})
    want = [f"v{i}" for i in range(3000)]
    for v in want:
        p.produce(TOPIC, value=v.encode())
    assert p.flush(60) == 0
    assert cluster.wait_in_sync()
    m = cluster.master()
    replica = next(i for i in cluster.nodes if i != m)
    before = counter(cluster.nodes[replica], "rokka_cluster_replica_reads_total", "kafka")
    got = consume_all(cluster, "reads-in-replica-rack", f"r{replica}", len(want))
    assert sorted(got) == sorted(want), f"{len(got)} of {len(want)}"
    assert counter(cluster.nodes[m], "rokka_cluster_read_redirects_total", "kafka") > 0
    served = counter(cluster.nodes[replica], "rokka_cluster_replica_reads_total", "kafka") - before
    assert served > 0, "the replica in the consumer's rack served no fetch"

    # A consumer in the master's rack is not redirected.
    redirects = counter(cluster.nodes[m], "rokka_cluster_read_redirects_total", "kafka")
    got = consume_all(cluster, "reads-in-master-rack", f"r{m}", len(want))
    assert sorted(got) == sorted(want)
    assert counter(cluster.nodes[m], "rokka_cluster_read_redirects_total", "kafka") == redirects


def test_a_rocketmq_consumer_behind_is_sent_to_a_replica_and_back(cluster):
    m = cluster.master()
    namesrv = ";".join(f"127.0.0.1:{n.namesrv_port}" for n in cluster.nodes.values())
    p = subprocess.run(
        [HARNESS, namesrv, "dur-send", "ReplicaReadsRmq", "rr", "400"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    acked = {line.split()[2] for line in p.stdout.splitlines() if line.startswith("compat: acked ")}
    assert len(acked) == 400, p.stdout[-2000:]
    assert cluster.wait_in_sync()
    replica_reads = {i: counter(n, "rokka_cluster_replica_reads_total", "rocketmq") for i, n in cluster.nodes.items()}

    def served():
        return sum(
            counter(n, "rokka_cluster_replica_reads_total", "rocketmq") - replica_reads[i]
            for i, n in cluster.nodes.items()
            if i != m
        )

    c = subprocess.Popen(
        [HARNESS, namesrv, "dur-consume", "ReplicaReadsRmq", "replica-reads-cg", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.time() + 20
        while time.time() < deadline and served() == 0:
            time.sleep(0.1)
        assert served() > 0, "no replica served a pull"
        assert counter(cluster.nodes[m], "rokka_cluster_read_redirects_total", "rocketmq") > 0
        # Caught up, the consumer's pulls go back to the master (brokerId 0)
        # and wait there for new messages.
        back = False
        while time.time() < deadline and not back:
            back = cluster.nodes[m].metric_values().get("rokka_rocketmq_pulls_held", 0) >= 1
            time.sleep(0.1)
        assert back, "no pull came back to the master"
        out, _ = c.communicate(timeout=60)
    finally:
        if c.poll() is None:
            c.kill()
            c.communicate(timeout=10)
    assert c.returncode == 0, out[-2000:]
    got = {line.split()[6] for line in out.splitlines() if line.startswith("compat: got ")}
    assert acked <= got, f"{len(acked - got)} never delivered"
    # Offsets were committed to the master (a replica takes no commits).
    from confluent_kafka import TopicPartition

    offsets = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": "replica-reads-cg"})
    committed = offsets.committed([TopicPartition("ReplicaReadsRmq", q) for q in range(4)], timeout=10)
    offsets.close()
    assert sum(tp.offset for tp in committed if tp.offset > 0) == 400, committed
