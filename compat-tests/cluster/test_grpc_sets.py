"""RocketMQ 5 clients (rocketmq-python-client, gRPC) on two broker sets
(docs/rocketmq5.md, "Cluster mode"): a route from any node — a replica's
included — names each set's queues under the set's name with that set's
master's gRPC address; a producer's messages land on both sets; a
SimpleConsumer receives every one of them once; a Kafka consumer
(confluent-kafka) reads the same messages. Runs in the rocketmq5 suite's
venv (compat-tests/cluster/run.sh); skipped where the client is missing."""
import time
import uuid

import pytest

pytest.importorskip("rocketmq.v5")  # the 5.x gRPC client (compat-venv has the C++-core one)
from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from conftest import SETS, TwoSets  # noqa: E402
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    c = TwoSets("grpc-sets", grpc=True)
    yield c
    c.close()


def test_routes_name_each_sets_master_and_pops_cover_both_sets(cluster):
    masters = cluster.masters(60)
    replica = next(i for i in cluster.nodes if i not in masters.values())
    topic, group = f"g5-sets-{uuid.uuid4().hex[:6]}", f"g5-sets-g-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.nodes[masters["set-a"]].bootstrap})
    for f in admin.create_topics([NewTopic(topic, 8, 1)]).values():
        f.result(15)
    deadline = time.time() + 20
    while time.time() < deadline:
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if md and len(md.partitions) == 8 and all(p.leader >= 0 for p in md.partitions.values()):
            break
        time.sleep(0.2)
    leader = {p: md.partitions[p].leader for p in md.partitions}
    assert {SETS[leader[p]] for p in leader} == {"set-a", "set-b"}, leader
    # Every node has taken the topic from etcd before the client asks.
    time.sleep(1)
    cfg = ClientConfiguration(f"127.0.0.1:{cluster.nodes[replica].grpc_port}", Credentials())
    p = Producer(cfg, (topic,))
    p.startup()
    bodies = sorted(f"sets-{i}".encode() for i in range(40))
    try:
        for b in bodies:
            m = Message()
            m.topic = topic
            m.body = b
            p.send(m)
    finally:
        p.shutdown()
    # They landed on both sets' queues (Kafka's view of the same partitions).
    k = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": "g5-sets-watermarks"})
    ends = {pt: k.get_watermark_offsets(TopicPartition(topic, pt), timeout=10)[1] for pt in range(8)}
    per_set = {s: sum(e for pt, e in ends.items() if SETS[leader[pt]] == s) for s in ("set-a", "set-b")}
    assert sum(ends.values()) == 40 and all(v > 0 for v in per_set.values()), (ends, per_set)
    k.close()
    # A SimpleConsumer on the same (replica) entry point pops from both
    # sets' masters, each message once.
    c = SimpleConsumer(cfg, group, {topic: FilterExpression("*")}, await_duration=2)
    c.startup()
    got = []
    try:
        deadline = time.time() + 60
        while len(got) < 40 and time.time() < deadline:
            for m in c.receive(16, 30):
                got.append(m.body)
                c.ack(m)
    finally:
        c.shutdown()
    assert sorted(got) == bodies, f"{len(got)} received"
    # And a Kafka consumer of the topic reads the same 40.
    kc = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": f"k-{group}", "auto.offset.reset": "earliest"})
    kc.subscribe([topic])
    read, deadline = [], time.time() + 30
    while len(read) < 40 and time.time() < deadline:
        m = kc.poll(0.5)
        if m is not None and not m.error():
            read.append(m.value())
    kc.close()
    assert sorted(read) == bodies
