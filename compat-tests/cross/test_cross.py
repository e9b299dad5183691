"""Messages and consumer groups crossing between Kafka clients (kafka-python,
confluent-kafka) and the RocketMQ client (rocketmq-client-rust), one store."""
import collections
import os
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


def metric_delta(before, after, prefix, *contains):
    """How much the samples whose key starts with `prefix` (and contains every
    string of `contains`) grew between two `metric_values` snapshots."""
    keys = {k for k in (*before, *after) if k.startswith(prefix) and all(c in k for c in contains)}
    return sum(after.get(k, 0) - before.get(k, 0) for k in keys)


def wait_for(cond, what, timeout=30):
    """Polls `cond` until it returns a true value (returned); fails after `timeout` s
    with `what` (a string, or a function giving the last state seen)."""
    deadline = time.time() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
        time.sleep(0.2)


def describe_group(rokka, group):
    """(state, [(member id, client id, sorted partitions)]) as DescribeGroups shows the group."""
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    d = a.describe_consumer_groups([group])[group].result(10)
    members = [
        (m.member_id, m.client_id, sorted(tp.partition for tp in m.assignment.topic_partitions))
        for m in d.members
    ]
    return d.state.name, sorted(members)


def splits(members, partitions):
    """Every member holds a share, and the shares partition the topic."""
    parts = [p for _, _, ps in members for p in ps]
    return all(ps for _, _, ps in members) and sorted(parts) == list(range(partitions))


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


def poll_n(c, n, secs=30):
    """Up to `n` records a confluent-kafka consumer polls within `secs`."""
    got = []
    deadline = time.time() + secs
    while len(got) < n and time.time() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m)
    return got


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
    got = poll_n(c, 30)
    # Nothing more was stored than the 30 sent (the poll above stops at 30).
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    stored = sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
    c.close()
    assert stored == 30, f"{stored} messages stored"
    # Each of the 30 exactly once.
    assert sorted(m.key() for m in got) == sorted(f"key-{i}".encode() for i in range(30)), f"{len(got)} delivered"
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


def test_rocketmq_messages_on_a_log_append_time_topic_reach_kafka_consumers_with_their_append_time(rokka):
    """A topic whose message.timestamp.type is LogAppendTime: Kafka stamps
    every batch appended there, and consumers read the append time as
    each record's (TIMESTAMP_LOG_APPEND_TIME); RocketMQ messages there carry
    their store time the same way."""
    from kafka.admin import NewTopic as KNewTopic

    topic = "CrossR2KAppendTime"
    admin = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    admin.create_topics([KNewTopic(topic, 2, 1, topic_configs={"message.timestamp.type": "LogAppendTime"})])
    admin.close()
    started = int(time.time() * 1000)
    harness(rokka, "cross-produce", topic, 6)
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "cross-r2k-append", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got = poll_n(c, 6)
    c.close()
    assert len(got) == 6
    for m in got:
        ts_type, ts = m.timestamp()
        assert ts_type == 2, f"timestamp type {ts_type} (2: LogAppendTime)"
        assert started - 1000 <= ts <= int(time.time() * 1000)


def expected_padded_body(i, pad):
    """The body the harness's `cross-produce <topic> <n> <pad>` sends."""
    body = f"rmq-{i}-é".encode()
    while len(body) < pad:
        body += f" {i}:{len(body)}".encode()
    return body


def test_compressed_rocketmq_bodies_reach_kafka_consumers_uncompressed(rokka):
    """RocketMQ producers compress bodies over 4 KiB (zlib, the COMPRESSED
    flag) and only remoting consumers undo it themselves: a Kafka consumer
    gets the body as the producer gave it — not the compressed bytes."""
    topic = "CrossR2KZ"
    pad = 10_000
    harness(rokka, "cross-produce", topic, 6, pad)
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": "cross-r2k-z",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    got = poll_n(c, 6)
    c.close()
    assert len(got) == 6
    for m in got:
        i = int(m.key().decode().split("-")[1])
        assert len(m.value()) >= pad and m.value() == expected_padded_body(i, pad), m.value()[:40]


def test_a_group_moves_from_rocketmq_to_kafka_and_back(rokka):
    topic, group = "CrossMigrate", "cross-migrate"
    create(rokka, topic)
    first = [dict(key=b"k", value=f"first-{i}".encode(), partition=i % 4) for i in range(30)]
    kafka_produce(rokka, topic, first, compression=None)
    before = metric_values(rokka)
    got = rocketmq_consume(rokka, topic, group, 30)
    converted = metric_delta(before, metric_values(rokka), "rokka_cross_conversions_total{", 'direction="kafka_to_rocketmq"')
    assert sorted(d.body for d in got) == sorted(r["value"] for r in first)
    # Operators see the conversions: at least the 30 Kafka records this
    # RocketMQ consumer read (a record pulled twice counts twice).
    assert converted >= 30, f"{converted} conversions counted for 30 records read across"

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
    # Operators see the group's lag: the 20 not yet consumed (the gauge is
    # refreshed every lag_interval_ms = 300).
    def lag():
        return sum(v for k, v in metric_values(rokka).items() if k.startswith("rokka_consumer_lag{") and f'group="{group}"' in k)

    wait_for(lambda: lag() == 20, lambda: f"the group's lag to be 20 (last {lag()})", timeout=10)
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
    # The consumer stands at the end of every partition and committed it.
    ends = c.end_offsets(list(c.assignment()))
    assert len(ends) == 4 and all(c.position(tp) == end for tp, end in ends.items()), (ends, values)
    c.close()
    assert sorted(values) == sorted(r["value"] for r in second), "nothing lost, nothing re-read"
    wait_for(lambda: lag() == 0, lambda: f"the group's lag to be 0 after the commit (last {lag()})", timeout=10)

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


def produce_until(rokka, topic, prefix, sent, stop, errors):
    """Sends `<prefix>-<i>` to the topic's four partitions in turn, one every
    20 ms, each acknowledged before the next, until `stop` is set; what was
    acknowledged goes to `sent`, a failure to `errors`."""
    try:
        p = KafkaProducer(bootstrap_servers=rokka.bootstrap, linger_ms=0)
        i = 0
        while not stop.is_set():
            v = f"{prefix}-{i}".encode()
            p.send(topic, value=v, partition=i % 4).get(timeout=10)
            sent.append(v)
            i += 1
            stop.wait(0.02)
        p.close()
    except Exception as e:  # noqa: BLE001 (reported by the test)
        errors.append(f"producer: {e!r}")


def kafka_member(rokka, topic, group, client_id, got, stop, errors):
    """A kafka-python member of `group` (auto-commit every 500 ms) polling
    `topic` into `got` until `stop` is set; a failure goes to `errors`."""
    from kafka import KafkaConsumer as KC

    try:
        c = KC(topic, bootstrap_servers=rokka.bootstrap, group_id=group, auto_offset_reset="earliest",
               enable_auto_commit=True, auto_commit_interval_ms=500, client_id=client_id)
        while not stop.is_set():
            for recs in c.poll(timeout_ms=200).values():
                got.extend(r.value for r in recs)
        c.close()
    except Exception as e:  # noqa: BLE001 (reported by the test)
        errors.append(f"kafka member: {e!r}")


def stop_hand_over(stop, producer, kafka_stop, member, rmq):
    """Ends a live hand-over test's clients: the producer, the Kafka
    member, and the RocketMQ member if it is still there."""
    stop.set()
    producer.join()
    kafka_stop.set()
    member.join(timeout=60)
    if rmq is not None:
        rmq.kill()


class RocketMQMember:
    """A harness `cross-member`: a clustering push consumer of rocketmq-client-rust
    that shuts down cleanly after `secs` seconds, or when `finish` is called if
    sooner (or is killed -9), printing what it consumes as it goes. Its output
    goes to a file next to rokka.log."""

    def __init__(self, rokka, name, topic, group, secs):
        import subprocess

        from conftest import HARNESS

        self.path = os.path.join(rokka.workdir, f"harness-{name}.log")
        self._out = open(self.path, "w")
        self.proc = subprocess.Popen(
            [HARNESS, f"127.0.0.1:{rokka.namesrv_port}", "cross-member", topic, group, str(secs), "stdin"],
            stdin=subprocess.PIPE,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def running(self):
        return self.proc.poll() is None

    def finish(self, timeout, now=True):
        """Has the member leave now (its input ends: a clean shutdown, as
        at the end of its `secs`) — or, not `now`, once its `secs` are up;
        the bodies consumed."""
        if now:
            self.proc.stdin.close()
        self.proc.wait(timeout=timeout)
        self.proc.stdin.close()
        self._out.close()
        out = open(self.path, errors="replace").read()
        assert self.proc.returncode == 0, f"{self.path}: {out[-2000:]}"
        return [bytes.fromhex(l.split()[2]) for l in out.splitlines() if l.startswith("compat: got ")]

    def kill(self):
        self.proc.stdin.close()
        if self.running():
            self.proc.kill()
            self.proc.wait()
        self._out.close()

    def killed(self):
        """kill -9 of the member (no shutdown: its connections just drop);
        the bodies it had consumed (printed as it consumed them)."""
        self.kill()
        out = open(self.path, errors="replace").read()
        return [bytes.fromhex(l.split()[2]) for l in out.splitlines() if l.startswith("compat: got ")]


def test_rocketmq_consumers_replaced_one_by_one_by_kafka_consumers(rokka):
    """A live mixed group: two RocketMQ consumers, then Kafka consumers join
    and the RocketMQ ones leave, one at a time, while a producer keeps
    sending. Rokka assigns the queues (RocketMQ's averaging over all member
    ids); each hand-over is waited for and checked in DescribeGroups; nothing
    is lost and nothing is delivered twice (docs/migration.md)."""
    import threading

    topic, group = "CrossMixed", "cross-mixed"
    create(rokka, topic)
    before = metric_values(rokka)
    sent, stop = [], threading.Event()
    errors = []

    def produce():
        produce_until(rokka, topic, "mix", sent, stop, errors)

    kafka_got = {1: [], 2: []}
    kafka_stop = {1: threading.Event(), 2: threading.Event()}

    def kafka_member(n):
        try:
            c = KafkaConsumer(
                topic,
                bootstrap_servers=rokka.bootstrap,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=True,
                auto_commit_interval_ms=500,
                client_id=f"kafka-member-{n}",
            )
            while not kafka_stop[n].is_set():
                for recs in c.poll(timeout_ms=200).values():
                    kafka_got[n].extend(r.value for r in recs)
            c.close()  # commits (auto commit)
        except Exception as e:  # noqa: BLE001 (reported by the test)
            errors.append(f"kafka member {n}: {e!r}")

    def membership(rocketmq, kafka):
        """Waits until the group is Stable with `rocketmq` RocketMQ clients and
        the Kafka members of client ids `kafka`, sharing the 4 queues."""
        seen = [None]

        def ok():
            seen[0] = describe_group(rokka, group)
            state, members = seen[0]
            rmq = [m for m in members if "@" in m[0]]
            kafkas = sorted(m[1] for m in members if "@" not in m[0])
            return state == "STABLE" and len(rmq) == rocketmq and kafkas == sorted(kafka) and splits(members, 4)

        wait_for(ok, lambda: f"{rocketmq} RocketMQ clients and {kafka} sharing the queues; last seen {seen[0]}", timeout=60)
        return seen[0][1]

    def consumed_since(n, count):
        wait_for(lambda: len(kafka_got[n]) > count, f"kafka-member-{n} to consume", timeout=30)

    # Lifetimes long enough for every hand-over below to complete while the
    # RocketMQ members still run (checked at each step).
    a = RocketMQMember(rokka, "mixed-a", topic, group, 25)
    b = RocketMQMember(rokka, "mixed-b", topic, group, 50)
    producer = threading.Thread(target=produce)
    threads = {}
    counts = {}
    try:
        producer.start()
        membership(2, [])
        # A Kafka member joins: the queues are split three ways.
        threads[1] = threading.Thread(target=kafka_member, args=(1,))
        threads[1].start()
        membership(2, ["kafka-member-1"])
        consumed_since(1, 0)
        assert a.running() and b.running(), "both RocketMQ members were in the group when kafka-member-1 joined"
        # The first RocketMQ member leaves: its queues move to the others.
        # Each leaves at the end of its lifetime: until then it consumes
        # (the test checks every member consumed something).
        rmq_a = a.finish(timeout=60, now=False)
        membership(1, ["kafka-member-1"])
        # A second Kafka member joins.
        threads[2] = threading.Thread(target=kafka_member, args=(2,))
        threads[2].start()
        membership(1, ["kafka-member-1", "kafka-member-2"])
        consumed_since(2, 0)
        assert b.running(), "the second RocketMQ member was in the group when kafka-member-2 joined"
        # The last RocketMQ member leaves: the Kafka members hold every queue.
        rmq_b = b.finish(timeout=60, now=False)
        final = membership(0, ["kafka-member-1", "kafka-member-2"])
        assert all(len(ps) == 2 for _, _, ps in final), final
        n1, n2 = len(kafka_got[1]), len(kafka_got[2])
        consumed_since(1, n1)
        consumed_since(2, n2)
        stop.set()
        producer.join()

        # Everything sent is consumed by the Kafka members that now own it all.
        def all_delivered():
            counts.clear()
            for v in rmq_a + rmq_b + kafka_got[1] + kafka_got[2]:
                counts[v] = counts.get(v, 0) + 1
            return all(v in counts for v in sent)

        wait_for(all_delivered, lambda: f"all {len(sent)} sent to be consumed ({sum(v not in counts for v in sent)} missing)")
    finally:
        stop.set()
        producer.join()
        for n, t in threads.items():
            kafka_stop[n].set()
            t.join(timeout=60)
        a.kill()
        b.kill()
    assert not errors, errors
    counts = collections.Counter(rmq_a + rmq_b + kafka_got[1] + kafka_got[2])
    dups = {v: c for v, c in counts.items() if c > 1}
    print(f"sent {len(sent)}; a {len(rmq_a)}, b {len(rmq_b)}, k1 {len(kafka_got[1])}, k2 {len(kafka_got[2])}; "
          f"duplicates {sum(c - 1 for c in dups.values())}")
    assert rmq_a and rmq_b and kafka_got[1] and kafka_got[2], "every member consumed"
    assert set(counts) == set(sent), "only what was sent"
    # At-least-once across a live hand-over (docs/migration.md): a message
    # the previous owner of a queue took but had not yet committed may reach
    # the next owner too — never twice to one member, and rarely (0 in most
    # runs, 1 of 2,210 in one CI run).
    per_member = [collections.Counter(x) for x in (rmq_a, rmq_b, kafka_got[1], kafka_got[2])]
    same_member = {v: c for m in per_member for v, c in m.items() if c > 1}
    assert not same_member, f"delivered twice to one member: {sorted(same_member.items())[:5]}"
    assert sum(c - 1 for c in dups.values()) <= max(5, len(sent) // 100), (
        f"{len(dups)} delivered more than once across hand-overs, e.g. {sorted(dups.items())[:5]}"
    )
    # Rokka was the assignment authority for the Kafka members.
    assert metric_delta(before, metric_values(rokka), "rokka_mixed_group_assignments_total{", f'group="{group}"') >= 2


def test_a_rocketmq_consumer_joining_a_live_kafka_group_takes_only_what_kafka_gave_up(rokka):
    """The other direction of a live hand-over: a Kafka member consumes all
    four partitions while a producer keeps sending; a RocketMQ consumer
    joins the group. Its share is not its to pull until the Kafka member's
    rebalance has given it up (kafka-python hears of the rebalance at its
    next heartbeat, up to 3 s later: pulled at once, both read those queues
    meanwhile and each side's commits undid the other's) — so nothing is
    delivered twice beyond the at-least-once margin, and nothing is lost."""
    import threading

    topic, group = "CrossKafkaFirst", "cross-kafka-first"
    create(rokka, topic)
    sent, errors, got = [], [], []
    stop, kafka_stop = threading.Event(), threading.Event()

    def produce():
        produce_until(rokka, topic, "kf", sent, stop, errors)

    producer = threading.Thread(target=produce)
    member = threading.Thread(target=kafka_member, args=(rokka, topic, group, "kafka-first", got, kafka_stop, errors))
    rmq, rmq_got = None, []
    try:
        producer.start()
        member.start()
        wait_for(lambda: len(got) > 20, "the Kafka member to consume", timeout=30)
        rmq = RocketMQMember(rokka, "kafka-first-r", topic, group, 20)
        seen = [None]

        def shared():
            seen[0] = describe_group(rokka, group)
            state, members = seen[0]
            return state == "STABLE" and len(members) == 2 and splits(members, 4)

        wait_for(shared, lambda: f"the queues to be shared; last seen {seen[0]}", timeout=60)
        stop.wait(4)
        assert rmq.running(), "the RocketMQ member was in the group throughout"
        stop.set()
        producer.join()
        rmq_got = rmq.finish(timeout=60, now=False)
        wait_for(lambda: set(sent) <= set(got) | set(rmq_got), "everything sent to be consumed", timeout=30)
    finally:
        stop_hand_over(stop, producer, kafka_stop, member, rmq)
    assert not errors, errors
    counts = collections.Counter(got + rmq_got)
    dups = sum(c - 1 for c in counts.values() if c > 1)
    print(f"sent {len(sent)}; kafka {len(got)}, rocketmq {len(rmq_got)}; duplicates {dups}")
    assert rmq_got, "the RocketMQ member consumed its share"
    assert set(counts) == set(sent), "only what was sent"
    for one in (got, rmq_got):
        twice = [v for v, c in collections.Counter(one).items() if c > 1]
        assert not twice, f"delivered twice to one member: {twice[:5]}"
    assert dups <= max(5, len(sent) // 100), f"{dups} delivered to both sides across the hand-over"


def test_a_rocketmq_member_killed_mid_consumption_leaves_its_queues_to_the_kafka_member(rokka):
    """A failure during a mixed group's life: a Kafka member and a RocketMQ
    member share four partitions while a producer keeps sending; the
    RocketMQ client is killed -9 (no unregister, no last commit). Its
    connections drop, it leaves the group, and the Kafka member's next
    rebalance gives it every partition: nothing is lost, and only what the
    killed member had consumed past its last commit comes again."""
    import threading

    topic, group = "CrossKilledMember", "cross-killed-member"
    create(rokka, topic)
    sent, errors, got = [], [], []
    stop, kafka_stop = threading.Event(), threading.Event()

    producer = threading.Thread(target=produce_until, args=(rokka, topic, "km", sent, stop, errors))
    member = threading.Thread(target=kafka_member, args=(rokka, topic, group, "kafka-survivor", got, kafka_stop, errors))
    rmq, rmq_got = None, []
    seen = [None]
    try:
        producer.start()
        member.start()
        rmq = RocketMQMember(rokka, "killed", topic, group, 120)

        def shared():
            seen[0] = describe_group(rokka, group)
            state, members = seen[0]
            return state == "STABLE" and len(members) == 2 and splits(members, 4)

        wait_for(shared, lambda: f"the queues to be shared; last seen {seen[0]}", timeout=60)
        wait_for(lambda: rmq_consumed(rmq) > 10, "the RocketMQ member to consume", timeout=30)
        rmq_got = rmq.killed()

        def kafka_holds_all():
            seen[0] = describe_group(rokka, group)
            state, members = seen[0]
            return state == "STABLE" and len(members) == 1 and members[0][2] == [0, 1, 2, 3]

        wait_for(kafka_holds_all, lambda: f"the Kafka member to hold every partition; last seen {seen[0]}",
                 timeout=60)
        stop.wait(2)
        stop.set()
        producer.join()
        wait_for(lambda: set(sent) <= set(got) | set(rmq_got), "everything sent to be consumed", timeout=30)
    finally:
        stop_hand_over(stop, producer, kafka_stop, member, rmq)
    assert not errors, errors
    counts = collections.Counter(got + rmq_got)
    again = [v for v, c in counts.items() if c > 1]
    print(f"sent {len(sent)}; kafka {len(got)}, killed rocketmq member {len(rmq_got)}; again {len(again)}")
    assert rmq_got, "the RocketMQ member consumed its share before it was killed"
    assert set(counts) == set(sent), "only what was sent"
    twice = [v for v, c in collections.Counter(got).items() if c > 1]
    assert not twice, f"delivered twice to the Kafka member: {twice[:5]}"
    assert set(again) <= set(rmq_got), "only what the killed member had consumed comes again"


def rmq_consumed(member):
    """How many bodies a running RocketMQMember has printed so far."""
    with open(member.path, errors="replace") as f:
        return sum(1 for l in f if l.startswith("compat: got "))


def test_kafka_tools_see_rocketmq_members_and_conflicts_are_refused(rokka):
    from kafka.errors import InconsistentGroupProtocolError

    topic, other, group = "CrossDescribe", "CrossOther", "cross-describe"
    create(rokka, topic)
    create(rokka, other)
    before = metric_values(rokka)
    member = RocketMQMember(rokka, "describe", topic, group, 40)
    try:
        # Kafka tools see the RocketMQ client as the group's only member.
        seen = [None]

        def described():
            seen[0] = describe_group(rokka, group)
            return seen[0][1] and seen[0]

        state, members = wait_for(described, lambda: f"the RocketMQ member in DescribeGroups (last {seen[0]})")
        assert state == "STABLE"
        assert len(members) == 1 and "@" in members[0][0], members
        assert members[0][2] == [0, 1, 2, 3], "the only member holds every queue"
        # ListGroups agrees: the group is Stable, not Empty (kafka-consumer-groups
        # --list --state, the admin CLI's `group list`).
        admin = AdminClient({"bootstrap.servers": rokka.bootstrap})  # kept alive until the answer
        listing = admin.list_consumer_groups().result(10)
        listed = {g.group_id: g.state.name for g in listing.valid}
        assert listed.get(group) == "STABLE", listed

        # A Kafka member subscribing to another topic is refused: kafka-python
        # raises JoinGroup's error 23 INCONSISTENT_GROUP_PROTOCOL (docs/kafka.md).
        c = KafkaConsumer(other, bootstrap_servers=rokka.bootstrap, group_id=group)
        raised = []

        def refused():
            try:
                c.poll(timeout_ms=300)
            except InconsistentGroupProtocolError as e:
                raised.append(e)
            return raised

        try:
            wait_for(refused, "kafka-python to raise InconsistentGroupProtocolError")
            assigned = c.assignment()
        finally:
            c.close()
        assert member.running(), "refused while the RocketMQ member was in the group"
        assert raised[0].errno == 23
        assert not assigned
        # The same answer to a JoinGroup on the wire, and counted.
        assert raw_join_group(rokka, group, [other]) == 23
        refusals = metric_delta(before, metric_values(rokka), "rokka_mixed_group_conflicts_total{", f'group="{group}"', 'side="kafka"')
        assert refusals >= 2, refusals
    finally:
        member.kill()


def raw_join_group(rokka, group, topics):
    """The error code of one JoinGroup (v3) of a consumer subscribing to `topics`."""
    import struct

    from kafka.net.compat import KafkaNetClient
    from kafka.protocol.consumer import JoinGroupRequest

    def string(x):
        return struct.pack(">h", len(x)) + x.encode()

    # ConsumerProtocolSubscription v0: version, topics, user data (null).
    subscription = struct.pack(">hi", 0, len(topics)) + b"".join(string(t) for t in topics) + struct.pack(">i", -1)
    client = KafkaNetClient(bootstrap_servers=rokka.bootstrap)
    try:
        client.check_version()
        req = JoinGroupRequest(
            group_id=group,
            session_timeout_ms=10000,
            rebalance_timeout_ms=10000,
            member_id="",
            protocol_type="consumer",
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=subscription)],
            max_version=3,
        )
        return client.send_and_receive(client.least_loaded_node(), req, timeout_ms=20000).error_code
    finally:
        client.close()


def test_a_group_with_live_rocketmq_members_is_not_deleted_or_reset_by_kafka_admin(rokka):
    """DescribeGroups shows a group's live RocketMQ consumers as members;
    DeleteGroups treats it as in use the same way, as Kafka does a group
    with members: NON_EMPTY_GROUP (their progress is those offsets). Once
    they leave, the group is deleted. (An admin's offset commit is taken:
    `rokka group reset-offsets --force` commits so, then tells them.)"""
    from confluent_kafka import KafkaError, KafkaException
    topic, group = "CrossLiveAdmin", "cross-live-admin"
    create(rokka, topic)
    kafka_produce(rokka, topic, [{"value": f"a-{i}".encode(), "partition": i % 4} for i in range(8)])
    # Progress the group has before its RocketMQ member starts (from
    # outside the group: allowed while it has no members).
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    c.close()
    member = RocketMQMember(rokka, "live-admin", topic, group, 60)
    try:
        wait_for(lambda: describe_group(rokka, group)[1], "the RocketMQ member in DescribeGroups")
        a = AdminClient({"bootstrap.servers": rokka.bootstrap})
        try:
            a.delete_consumer_groups([group])[group].result(10)
            raise AssertionError("a group with a live RocketMQ member was deleted")
        except KafkaException as e:
            assert e.args[0].code() == KafkaError.NON_EMPTY_GROUP, e
    finally:
        member.finish(60)
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    # Its heartbeats stop with it: deleted once it has left.
    wait_for(lambda: not describe_group(rokka, group)[1], "the member to leave")
    a.delete_consumer_groups([group])[group].result(10)


def test_a_large_compressed_kafka_batch_reaches_rocketmq_consumers_in_bounded_pulls(rokka):
    """One lz4 Kafka batch of 120 000 small records (~1 MB on the wire)
    becomes ~30 MB of RocketMQ messages: a pull answer stops inside the
    batch at `max_pull_bytes` and the next pull goes on from the record
    left out — one answer of the whole batch is past the 16 MiB frame the
    RocketMQ clients accept, and its queue stood still."""
    from confluent_kafka import Producer

    topic, group = "CrossBigBatch", "cross-big-batch"
    create(rokka, topic, partitions=1)
    n = 120_000
    p = Producer({
        "bootstrap.servers": rokka.bootstrap, "compression.type": "lz4", "linger.ms": 2000,
        "batch.size": 64 << 20, "batch.num.messages": 1_000_000, "message.max.bytes": 64 << 20,
        "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1 << 20,
    })
    for i in range(n):
        p.produce(topic, value=b"%08d" % i + bytes(92), partition=0)
    assert p.flush(60) == 0
    got = rocketmq_consume(rokka, topic, group, n)
    assert len(got) == n
    assert len({d.body for d in got}) == n, "a record delivered twice"


def test_a_rocketmq_offset_reset_is_refused_while_kafka_members_would_undo_it(rokka):
    """mqadmin resetOffsetByTime (INVOKE_BROKER_TO_RESET_OFFSET) of a group
    with a live Kafka member: refused, as Kafka refuses resetting a group
    with members — the member would commit its old position back within
    seconds, after a SUCCESS answer."""
    import json
    import socket
    import struct

    topic, group = "CrossResetKafka", "cross-reset-kafka"
    create(rokka, topic)
    kafka_produce(rokka, topic, [{"value": f"r-{i}".encode(), "partition": 0} for i in range(5)])
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    try:
        wait_for(lambda: c.poll(0.5) is not None, "a record")
        header = json.dumps({
            "code": 222, "language": "JAVA", "version": 453, "opaque": 3, "flag": 0,
            "extFields": {"topic": topic, "group": group, "timestamp": "0", "isForce": "true"},
        }).encode()
        frame = struct.pack(">ii", 4 + len(header), len(header)) + header
        with socket.create_connection(("127.0.0.1", rokka.broker_port), timeout=10) as s:
            s.sendall(frame)
            n = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
            data = s.recv(n, socket.MSG_WAITALL)
        hlen = struct.unpack(">i", data[:4])[0] & 0xFFFFFF
        h = json.loads(data[4:4 + hlen])
        assert h["code"] == 1 and "Kafka members" in (h.get("remark") or ""), h
    finally:
        c.close()


def test_kafka_records_with_oversized_headers_or_values_do_not_stall_rocketmq_consumers(rokka):
    """A record whose headers (a stack trace a dead-letter publisher adds)
    are past what RocketMQ's properties hold crosses without them, and one
    larger than any RocketMQ client's frame is skipped for them: the Java
    layout's 16-bit properties length had made the client drop the rest of
    the pull, and a frame past 16 MiB had it pull the same offset for ever.
    The records after them arrive; Kafka consumers read all of them."""
    from confluent_kafka import Producer

    topic, group = "CrossOversized", "cross-oversized"
    create(rokka, topic, partitions=1)
    p = Producer({"bootstrap.servers": rokka.bootstrap, "compression.type": "zstd", "message.max.bytes": 32 << 20})
    p.produce(topic, value=b"with-big-header", partition=0,
              headers=[("rocketmq.tags", b"T"), ("trace", b"x" * 40_000), ("small", b"s")])
    p.produce(topic, value=b"z" * (17 << 20), partition=0)
    for i in range(10):
        p.produce(topic, value=f"after-{i}".encode(), partition=0)
    assert p.flush(30) == 0
    got = rocketmq_consume(rokka, topic, group, 11)
    # (The push consumer hands messages to several threads: any order.)
    bodies = sorted(d.body for d in got)
    assert bodies == sorted([b"with-big-header"] + [f"after-{i}".encode() for i in range(10)]), [b[:20] for b in bodies]
    first = next(d for d in got if d.body == b"with-big-header")
    assert first.tags == "T" and first.props.get("small") == "s" and "trace" not in first.props
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "cross-oversized-k",
                  "auto.offset.reset": "earliest", "fetch.max.bytes": 64 << 20,
                  "max.partition.fetch.bytes": 64 << 20})
    c.subscribe([topic])
    seen = []
    deadline = time.time() + 30
    while len(seen) < 12 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            seen.append(len(m.value()))
    c.close()
    assert len(seen) == 12 and seen[1] == 17 << 20, seen[:3]


def raw_pull(rokka, topic, queue, offset, max_msgs, opaque=1):
    """One PULL_MESSAGE (code 11) in RocketMQ's JSON header layout: the
    response's code, extFields and the stored messages' sizes in its body."""
    import json
    import socket
    import struct

    from test_open_acls import recv_exact, rmq_frame

    ext = {"consumerGroup": "raw-pull", "topic": topic, "queueId": str(queue), "queueOffset": str(offset),
           "maxMsgNums": str(max_msgs), "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0",
           "subscription": "*", "subVersion": "0"}
    with socket.create_connection(("127.0.0.1", rokka.broker_port), timeout=10) as s:
        s.sendall(rmq_frame(11, opaque, ext))
        frame = recv_exact(s, struct.unpack(">i", recv_exact(s, 4))[0])
    hlen = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
    r = json.loads(frame[4:4 + hlen])
    body = frame[4 + hlen:]
    sizes, at = [], 0
    while at + 4 <= len(body):
        n = struct.unpack(">i", body[at:at + 4])[0]
        assert n > 0, n
        sizes.append(n)
        at += n
    return r["code"], r.get("extFields", {}), sizes


def test_a_pull_of_a_kafka_batch_answers_at_most_max_msg_nums(rokka):
    """One Kafka batch of 100 records (librdkafka) pulled with maxMsgNums 8
    answers 8 messages and a nextBeginOffset inside the batch, as Apache
    never answers more than maxMsgNums (the whole batch came back, every
    pull)."""
    from confluent_kafka import Producer

    topic = "CrossPullCount"
    create(rokka, topic, partitions=1)
    p = Producer({"bootstrap.servers": rokka.bootstrap, "linger.ms": 500, "compression.type": "none"})
    for i in range(100):
        p.produce(topic, value=b"v%03d" % i, partition=0)
    assert p.flush(30) == 0
    offset, pulls = 0, 0
    while offset < 100:
        code, ext, sizes = raw_pull(rokka, topic, 0, offset, 8, opaque=pulls + 1)
        assert code == 0, (code, ext)
        assert 1 <= len(sizes) <= 8, (offset, len(sizes))
        nxt = int(ext["nextBeginOffset"])
        assert nxt == offset + len(sizes), (offset, len(sizes), ext)
        offset, pulls = nxt, pulls + 1
    assert pulls >= 13, f"100 records in {pulls} pulls of at most 8"
