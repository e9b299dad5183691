"""KIP-848 consumer groups with librdkafka (group.protocol=consumer): three
members split a topic's partitions (the broker assigns), one leaves, one is
killed with SIGKILL; the partitions move each time with never two owners,
every message is consumed, offsets are committed with member epochs, and
ConsumerGroupHeartbeat/ConsumerGroupDescribe are what carried it."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import Rokka, results_dir, running  # noqa: E402

HERE = os.path.dirname(__file__)
SESSION_MS = 6000


@pytest.fixture(scope="module")
def rokka():
    with running(
        "kafka",
        "kip848",
        group_extra=f"consumer_session_timeout_ms = {SESSION_MS}\nconsumer_heartbeat_interval_ms = 500",
    ) as r:
        yield r


class Member:
    def __init__(self, rokka, group, topic, instance=None):
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "kip848_member.py"), rokka.bootstrap, group, topic]
            + ([instance] if instance else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.assigned, self.msgs, self.errors, self.lock = [], [], [], threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                if "assigned" in ev:
                    self.assigned = ev["assigned"]
                elif "msg" in ev:
                    self.msgs.append(ev["msg"])
                elif "error" in ev:
                    self.errors.append(ev)

    def now(self):
        with self.lock:
            return list(self.assigned)

    def leave(self):
        self.p.stdin.close()
        self.p.wait(30)

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)


def wait_split(members, partitions, sizes, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        views = [m.now() for m in members]
        flat = sorted(p for v in views for p in v)
        if flat == list(range(partitions)) and sorted(len(v) for v in views) == sorted(sizes):
            return views
        time.sleep(0.2)
    raise AssertionError(f"no split {sizes}: {[m.now() for m in members]}")


def produce(rokka, topic, prefix, n, partitions):
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for i in range(n):
        p.produce(topic, f"{prefix}-{i}".encode(), partition=i % partitions)
    assert p.flush(20) == 0
    return {f"{prefix}-{i}" for i in range(n)}


def consumed(members):
    out = set()
    for m in members:
        with m.lock:
            out.update(m.msgs)
    return out


def wait_consumed(members, want, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline and not want <= consumed(members):
        time.sleep(0.2)
    missing = want - consumed(members)
    assert not missing, f"{len(missing)} never consumed, e.g. {sorted(missing)[:5]}"


def test_three_members_one_leaves_one_killed(rokka):
    topic, group, parts = "kip848-t", "kip848-g", 6
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=parts, replication_factor=1)])[topic].result(10)
    before = rokka.metric_values()
    ms = [Member(rokka, group, topic) for _ in range(3)]
    try:
        wait_split(ms, parts, [2, 2, 2])
        want = produce(rokka, topic, "one", 300, parts)
        wait_consumed(ms, want)
        # One leaves cleanly: its two partitions go to the others.
        ms[0].leave()
        wait_split(ms[1:], parts, [3, 3])
        want |= produce(rokka, topic, "two", 300, parts)
        wait_consumed(ms, want)
        # One is killed: after the session timeout the last has all six.
        t0 = time.time()
        ms[2].kill()
        wait_split(ms[1:2], parts, [6], timeout=SESSION_MS / 1000 + 30)
        took = time.time() - t0
        want |= produce(rokka, topic, "three", 300, parts)
        wait_consumed(ms[1:2], {w for w in want if w.startswith("three")})
        assert took >= SESSION_MS / 1000 * 0.8, f"moved after {took:.1f} s, before the session timeout"
        # The survivor's committed offsets reach the end of every partition.
        c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group})
        deadline = time.time() + 20
        while time.time() < deadline:
            got = c.committed([TopicPartition(topic, p) for p in range(parts)], timeout=10)
            if all(tp.offset == 150 for tp in got):
                break
            time.sleep(0.5)
        c.close()
        assert [tp.offset for tp in got] == [150] * parts
    finally:
        for m in ms:
            if m.p.poll() is None:
                m.kill()
    after = rokka.metric_values()
    hb = after.get('rokka_kafka_requests_total{api="ConsumerGroupHeartbeat"}', 0) - before.get(
        'rokka_kafka_requests_total{api="ConsumerGroupHeartbeat"}', 0
    )
    assert hb > 10, "the members spoke the consumer protocol"
    classic = after.get('rokka_kafka_requests_total{api="JoinGroup"}', 0) - before.get('rokka_kafka_requests_total{api="JoinGroup"}', 0)
    assert classic == 0, "no classic JoinGroup"


def test_a_static_member_comes_back_to_its_partitions_and_its_instance_id_is_not_shared(rokka):
    """KIP-848 static membership (group.instance.id): a static member that
    stops leaves with epoch -2 and keeps its partitions for its session
    timeout — the other member is not rebalanced — and the same instance id
    coming back gets them again; a second member with an instance id in use
    is refused (UNRELEASED_INSTANCE_ID) and the holder keeps its partitions,
    never two owners of one partition (Kafka's GroupMetadataManager)."""
    topic, group, parts = "kip848-s", "kip848-sg", 4
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=parts, replication_factor=1)])[topic].result(10)
    dyn = Member(rokka, group, topic)
    s1 = Member(rokka, group, topic, instance="inst-1")
    ms = [dyn, s1]
    try:
        wait_split(ms, parts, [2, 2])
        mine, theirs = s1.now(), dyn.now()
        s1.leave()
        # Within the static member's session nothing moves.
        until = time.time() + SESSION_MS / 1000 / 2
        while time.time() < until:
            assert dyn.now() == theirs, "the other member was rebalanced by a static member's leave"
            time.sleep(0.2)
        s2 = Member(rokka, group, topic, instance="inst-1")
        ms.append(s2)
        deadline = time.time() + 20
        while time.time() < deadline and s2.now() != mine:
            assert dyn.now() == theirs, "the other member was rebalanced by the static member's return"
            time.sleep(0.2)
        assert s2.now() == mine, f"came back to {s2.now()}, had {mine}"
        assert dyn.now() == theirs
        # The instance id in use: a second member with it gets nothing.
        s3 = Member(rokka, group, topic, instance="inst-1")
        ms.append(s3)
        until = time.time() + 8
        while time.time() < until:
            owners = [p for m in (dyn, s2, s3) for p in m.now()]
            assert sorted(owners) == list(range(parts)), f"two owners: {dyn.now()} {s2.now()} {s3.now()}"
            assert s2.now() == mine and not s3.now()
            time.sleep(0.2)
        with s3.lock:
            # librdkafka: a fatal error naming UNRELEASED_INSTANCE_ID's text.
            refused = [e for e in s3.errors if "instance ID is still used" in e["error"] or e["code"] == 111]
        assert refused, f"the second member was not told: {s3.errors}"
    finally:
        for m in ms:
            if m.p.poll() is None:
                m.kill()


def test_offsets_of_a_topic_a_member_subscribes_to_are_not_deleted(rokka):
    """OffsetDelete (kafka-consumer-groups --delete-offsets) on a KIP-848
    group whose member subscribes to the topic: GROUP_SUBSCRIBED_TO_TOPIC,
    the offsets kept (Kafka's ModernGroup.isSubscribedToTopic); once the
    member is gone they may go. Sent with kafka-python's protocol classes."""
    from kafka.net.compat import KafkaNetClient
    from kafka.protocol.consumer.group import OffsetDeleteRequest

    topic, group = "kip848-od", "kip848-odg"
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(10)
    want = produce(rokka, topic, "od", 5, 1)
    m = Member(rokka, group, topic)
    net = KafkaNetClient(bootstrap_servers=rokka.bootstrap)
    try:
        wait_consumed([m], want)
        c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group})
        deadline = time.time() + 20
        while time.time() < deadline and c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset != 5:
            time.sleep(0.3)
        net.check_version()
        node = net.least_loaded_node()
        T = OffsetDeleteRequest.OffsetDeleteRequestTopic

        def delete():
            req = OffsetDeleteRequest(
                group_id=group, topics=[T(name=topic, partitions=[T.OffsetDeleteRequestPartition(partition_index=0)])]
            )
            r = net.send_and_receive(node, req, timeout_ms=10000)
            return r.error_code, r.topics[0].partitions[0].error_code if r.topics else None

        assert delete() == (0, 86), "GROUP_SUBSCRIBED_TO_TOPIC"
        assert c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 5, "kept"
        m.leave()
        deadline = time.time() + 20
        got = delete()
        while time.time() < deadline and got != (0, 0):
            time.sleep(0.5)
            got = delete()
        assert got == (0, 0)
        assert c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset < 0, "deleted once nobody subscribes"
        c.close()
    finally:
        net.close()
        if m.p.poll() is None:
            m.kill()


def test_describe_and_list_consumer_groups(rokka):
    topic, group = "kip848-d", "kip848-dg"
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(10)
    m = Member(rokka, group, topic)
    try:
        wait_split([m], 2, [2])
        listed = a.list_consumer_groups().result(10)
        mine = [g for g in listed.valid if g.group_id == group]
        assert len(mine) == 1, listed.valid
        assert "CONSUMER" in str(getattr(mine[0], "type", "CONSUMER")).upper(), mine[0]
        d = a.describe_consumer_groups([group])[group].result(10)
        assert len(d.members) == 1, d
        assert sorted(tp.partition for tp in d.members[0].assignment.topic_partitions) == [0, 1], d
        assert "STABLE" in str(d.state).upper(), d
        # A classic-protocol describe below v6 (kafkajs' DescribeGroups
        # v0-2) answers a KIP-848 group Dead without an error, as Kafka
        # does: kafkajs throws for the whole call on any group's error.
        js = os.path.join(os.path.dirname(__file__), "js")
        script = (
            "import { Kafka } from 'kafkajs';"
            "const k = new Kafka({ brokers: [process.argv[1]], logLevel: 0 });"
            "const a = k.admin(); await a.connect();"
            "const r = await a.describeGroups([process.argv[2]]);"
            "console.log(JSON.stringify(r.groups.map(g => [g.groupId, g.state, g.members.length])));"
            "await a.disconnect();"
        )
        out = subprocess.run(["node", "--input-type=module", "-e", script, rokka.bootstrap, group],
                             cwd=js, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [[group, "Dead", 0]], out.stdout
    finally:
        m.leave()
    # Left and nothing committed yet may remain: the group empties.
    deadline = time.time() + 20
    while time.time() < deadline:
        d = a.describe_consumer_groups([group])[group].result(10)
        if not d.members:
            break
        time.sleep(0.5)
    assert not d.members, d


def test_regular_expression_subscription(rokka):
    """librdkafka sends a pattern subscription as SubscribedTopicRegex; the
    broker matches it against the topic names, including topics created
    later."""
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    for name, n in (("kip848re-a", 2), ("kip848re-b", 1), ("kip848other", 1)):
        a.create_topics([NewTopic(name, num_partitions=n, replication_factor=1)])[name].result(10)
    owned = set()
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": "kip848-re",
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    c.subscribe(
        ["^kip848re-.*"],
        on_assign=lambda _c, ps: owned.update((p.topic, p.partition) for p in ps),
        on_revoke=lambda _c, ps: owned.difference_update((p.topic, p.partition) for p in ps),
    )
    try:
        want = {("kip848re-a", 0), ("kip848re-a", 1), ("kip848re-b", 0)}
        deadline = time.time() + 30
        while time.time() < deadline and owned != want:
            c.poll(0.2)
        assert owned == want, owned
        a.create_topics([NewTopic("kip848re-c", num_partitions=1, replication_factor=1)])["kip848re-c"].result(10)
        want.add(("kip848re-c", 0))
        deadline = time.time() + 30
        while time.time() < deadline and owned != want:
            c.poll(0.2)
        assert owned == want, owned
    finally:
        c.close()
