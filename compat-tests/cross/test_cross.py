"""Messages and consumer groups crossing between Kafka clients (kafka-python,
confluent-kafka) and the RocketMQ client (rocketmq-client-rust), one store."""
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

from conftest import harness, rocketmq_consume


def metric_values(rokka):
    out = {}
    for line in rokka.metrics().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def create(rokka, topic, partitions=4):
    admin = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()


def kafka_produce(rokka, topic, records, compression="gzip"):
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap, compression_type=compression, linger_ms=5)
    for r in records:
        p.send(topic, **r)
    p.flush()
    p.close()


def test_kafka_records_reach_rocketmq_consumers(rokka):
    topic = "CrossK2R"
    create(rokka, topic)
    records = []
    for i in range(40):
        records.append(
            dict(
                key=f"key-{i}".encode(),
                value=f"val-{i}-é".encode() + bytes([0, 255]),
                headers=[("h1", f"x-{i}".encode()), ("rocketmq.tags", b"TagA" if i % 2 == 0 else b"TagB")],
                timestamp_ms=1_700_000_000_000 + i,
                partition=i % 4,
            )
        )
    kafka_produce(rokka, topic, records, compression="gzip")
    got = rocketmq_consume(rokka, topic, "cross-k2r", 40)
    assert len(got) == 40, "every record delivered once"
    by_key = {d.keys: d for d in got}
    for i, r in enumerate(records):
        d = by_key[f"key-{i}"]
        assert d.body == r["value"]
        assert d.tags == ("TagA" if i % 2 == 0 else "TagB")
        assert d.props["h1"] == f"x-{i}"
        assert "rocketmq.tags" not in d.props
        assert d.born == 1_700_000_000_000 + i
        assert d.queue == i % 4
    assert len({d.props["UNIQ_KEY"] for d in got}) == 40, "distinct message ids"

    # A tag filter applies to crossed messages (by the tag header).
    tagged = rocketmq_consume(rokka, topic, "cross-k2r-tags", 20, "TagA")
    assert sorted(d.keys for d in tagged) == sorted(f"key-{i}" for i in range(0, 40, 2))


def test_rocketmq_messages_reach_kafka_consumers(rokka):
    topic = "CrossR2K"
    started = int(time.time() * 1000)
    harness(rokka, "cross-produce", topic, 30)
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": "cross-r2k",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    got = []
    deadline = time.time() + 30
    while len(got) < 30 and time.time() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m)
    c.close()
    assert len(got) == 30
    for m in got:
        i = int(m.key().decode().split("-")[1])
        assert m.key() == f"key-{i}".encode()
        assert m.value() == f"rmq-{i}-é".encode()
        headers = dict(m.headers())
        assert headers == {
            "p1": f"v{i}".encode(),
            "unicode": f"é{i}".encode(),
            "rocketmq.tags": b"TagX" if i % 2 == 0 else b"TagY",
        }, headers
        ts_type, ts = m.timestamp()
        assert ts_type == 1 and started - 1000 <= ts <= int(time.time() * 1000)


def test_a_group_moves_from_rocketmq_to_kafka_and_back(rokka):
    topic, group = "CrossMigrate", "cross-migrate"
    create(rokka, topic)
    first = [dict(key=b"k", value=f"first-{i}".encode(), partition=i % 4) for i in range(30)]
    kafka_produce(rokka, topic, first, compression=None)
    got = rocketmq_consume(rokka, topic, group, 30)
    assert sorted(d.body for d in got) == sorted(r["value"] for r in first)

    # Kafka sees the RocketMQ group (ListGroups) and its committed offsets (OffsetFetch).
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    assert group in [g.group_id for g in a.list_consumer_groups().result(10).valid]
    admin = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    committed = admin.list_group_offsets(group)[group]
    assert sum(o.offset for tp, o in committed.items() if tp.topic == topic) == 30
    admin.close()

    # Kafka consumers in the same group continue where RocketMQ stopped.
    second = [dict(value=f"second-{i}".encode(), partition=i % 4) for i in range(20)]
    kafka_produce(rokka, topic, second, compression=None)
    # Operators see the group's lag (20 not yet consumed) and the conversions.
    time.sleep(1)
    m = metric_values(rokka)
    assert sum(v for k, v in m.items() if k.startswith("rokka_consumer_lag{") and f'group="{group}"' in k) == 20
    assert m['rokka_cross_conversions_total{direction="kafka_to_rocketmq"}'] >= 30
    c = KafkaConsumer(
        topic,
        bootstrap_servers=rokka.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    values = []
    deadline = time.time() + 30
    while len(values) < 20 and time.time() < deadline:
        for recs in c.poll(timeout_ms=500).values():
            values.extend(r.value for r in recs)
    c.commit()
    time.sleep(1)
    for recs in c.poll(timeout_ms=1000).values():
        values.extend(r.value for r in recs)
    c.close()
    assert sorted(values) == sorted(r["value"] for r in second), "nothing lost, nothing re-read"

    # And back: RocketMQ consumers pull from the offsets Kafka committed.
    third = [dict(value=f"third-{i}".encode(), partition=i % 4) for i in range(12)]
    kafka_produce(rokka, topic, third, compression=None)
    got = rocketmq_consume(rokka, topic, group, 12)
    assert sorted(d.body for d in got) == sorted(r["value"] for r in third)


def test_a_kafka_offset_reset_is_where_rocketmq_pulls_from(rokka):
    topic, group = "CrossReset", "cross-reset"
    create(rokka, topic, partitions=1)
    kafka_produce(rokka, topic, [dict(value=f"m-{i}".encode(), partition=0) for i in range(10)], compression=None)
    # An operator resets the group to offset 7 with a Kafka tool (commit on an
    # empty group, as kafka-consumer-groups --reset-offsets does).
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
    c.close()
    got = rocketmq_consume(rokka, topic, group, 3)
    assert sorted(d.body for d in got) == [b"m-7", b"m-8", b"m-9"]


def test_rocketmq_consumers_replaced_one_by_one_by_kafka_consumers(rokka):
    """A live mixed group: two RocketMQ consumers, then Kafka consumers join
    and the RocketMQ ones leave, while a producer keeps sending. Rokka assigns
    the queues (RocketMQ's averaging over all member ids); nothing is lost,
    and duplicates stay within what was consumed but not yet committed."""
    import subprocess
    import threading

    from conftest import HARNESS

    topic, group = "CrossMixed", "cross-mixed"
    create(rokka, topic)
    sent, stop = [], threading.Event()

    def produce():
        p = KafkaProducer(bootstrap_servers=rokka.bootstrap, linger_ms=0)
        i = 0
        while not stop.is_set() and i < 2000:
            v = f"mix-{i}".encode()
            p.send(topic, value=v, partition=i % 4)
            sent.append(v)
            i += 1
            time.sleep(0.02)
        p.flush()
        p.close()

    kafka_got = {1: [], 2: []}
    kafka_stop = threading.Event()

    def kafka_member(n):
        c = KafkaConsumer(
            topic,
            bootstrap_servers=rokka.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=True,
            auto_commit_interval_ms=500,
            client_id=f"kafka-member-{n}",
        )
        while not kafka_stop.is_set():
            for recs in c.poll(timeout_ms=200).values():
                kafka_got[n].extend(r.value for r in recs)
        c.close()

    def rocketmq_member(secs):
        return subprocess.Popen(
            [HARNESS, f"127.0.0.1:{rokka.namesrv_port}", "cross-member", topic, group, str(secs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    producer = threading.Thread(target=produce)
    producer.start()
    a, b = rocketmq_member(12), rocketmq_member(22)
    time.sleep(5)
    k1 = threading.Thread(target=kafka_member, args=(1,))
    k1.start()
    time.sleep(10)  # a leaves at ~12 s
    k2 = threading.Thread(target=kafka_member, args=(2,))
    k2.start()
    time.sleep(12)  # b leaves at ~22 s
    stop.set()
    producer.join()
    time.sleep(8)
    kafka_stop.set()
    k1.join()
    k2.join()
    rmq_got = {}
    for name, proc in (("a", a), ("b", b)):
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out[-2000:]
        rmq_got[name] = [bytes.fromhex(l.split()[2]) for l in out.splitlines() if l.startswith("compat: got ")]
    delivered = rmq_got["a"] + rmq_got["b"] + kafka_got[1] + kafka_got[2]
    counts = {}
    for v in delivered:
        counts[v] = counts.get(v, 0) + 1
    missing = [v for v in sent if v not in counts]
    dups = sum(c - 1 for c in counts.values())
    print(f"sent {len(sent)}; a {len(rmq_got['a'])}, b {len(rmq_got['b'])}, "
          f"k1 {len(kafka_got[1])}, k2 {len(kafka_got[2])}; duplicates {dups}")
    assert not missing, f"{len(missing)} lost, e.g. {missing[:5]}"
    assert rmq_got["a"] and rmq_got["b"] and kafka_got[1] and kafka_got[2], "every member consumed"
    # Hand-overs re-deliver at most what was consumed but not committed
    # (RocketMQ persists every second, Kafka commits every 500 ms).
    assert dups <= len(sent) // 10, f"{dups} duplicates"
    # Rokka was the assignment authority for the Kafka members.
    assert 'rokka_mixed_group_assignments_total{group="cross-mixed"}' in rokka.metrics()


def test_kafka_tools_see_rocketmq_members_and_conflicts_are_refused(rokka):
    import subprocess

    from conftest import HARNESS

    topic, other, group = "CrossDescribe", "CrossOther", "cross-describe"
    create(rokka, topic)
    create(rokka, other)
    member = subprocess.Popen(
        [HARNESS, f"127.0.0.1:{rokka.namesrv_port}", "cross-member", topic, group, "12"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        time.sleep(4)
        a = AdminClient({"bootstrap.servers": rokka.bootstrap})
        d = a.describe_consumer_groups([group])[group].result(10)
        assert str(d.state).endswith("STABLE")
        assert len(d.members) == 1 and "@" in d.members[0].member_id
        parts = sorted(tp.partition for tp in d.members[0].assignment.topic_partitions)
        assert parts == [0, 1, 2, 3], "the only member holds every queue"

        # A Kafka member subscribing to another topic is refused.
        c = KafkaConsumer(other, bootstrap_servers=rokka.bootstrap, group_id=group)
        errors = []
        deadline = time.time() + 6
        while time.time() < deadline:
            try:
                c.poll(timeout_ms=300)
            except Exception as e:  # kafka-python raises the JoinGroup error
                errors.append(type(e).__name__)
        assigned = c.assignment()
        c.close()
        assert not assigned
        m = metric_values(rokka)
        refused = sum(v for k, v in m.items() if k.startswith("rokka_mixed_group_conflicts_total{") and 'side="kafka"' in k)
        assert refused >= 1, errors
    finally:
        out, _ = member.communicate(timeout=60)
        assert member.returncode == 0, out[-2000:]
