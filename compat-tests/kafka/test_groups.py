"""Consumer groups with real clients: JoinGroup/SyncGroup/Heartbeat/
LeaveGroup through librdkafka and kafka-python; clean leave, SIGKILL
detected by session timeout, commit and resume across a restart."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer

HERE = os.path.dirname(os.path.abspath(__file__))


class Member:
    """A group member in a child process; its stdout lines are parsed."""

    def __init__(self, rokka, group, topic, session_ms=6000, instance="", assignor=""):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                os.path.join(HERE, "group_member.py"),
                rokka.bootstrap,
                group,
                topic,
                str(session_ms),
                instance,
                assignor,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.assigned = None
        self.msgs = []
        self.events = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            ev = json.loads(line)
            if "assigned" in ev:
                self.assigned = ev["assigned"]
            else:
                self.msgs.append((ev["p"], ev["o"], ev["msg"]))
            self.events.put(ev)

    def leave(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def wait_for(cond, timeout=40, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def owned_exactly_once(members, n):
    parts = [p for m in members for p in (m.assigned or [])]
    return sorted(parts) == list(range(n))


def consumed(members, tag):
    """The `tag` messages the members consumed, in a sorted list (a duplicate shows twice)."""
    return sorted(x[2] for m in members for x in m.msgs if x[2].startswith(f"{tag}-"))


def all_once(members, tag, n):
    """Waits until every one of the n `tag` messages was consumed, then asserts each exactly once."""
    want = sorted(f"{tag}-{i}" for i in range(n))
    wait_for(lambda: set(consumed(members, tag)) == set(want), what=f"all {n} {tag}-messages consumed")
    got = consumed(members, tag)
    assert got == want, f"{len(got) - n} {tag}-messages consumed twice"


def make_topic(rokka, topic, n):
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=n, replication_factor=1)])[topic].result(10)


def produce(rokka, topic, n, tag, partitions=6):
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for i in range(n):
        p.produce(topic, f"{tag}-{i}".encode(), partition=i % partitions)
    assert p.flush(30) == 0


def test_three_members_over_six_partitions_leave_and_kill(rokka, topic):
    make_topic(rokka, topic, 6)
    group = f"g-{topic}"
    members = [Member(rokka, group, topic) for _ in range(3)]
    try:
        wait_for(lambda: owned_exactly_once(members, 6) and all(len(m.assigned) == 2 for m in members), what="3-way split")
        produce(rokka, topic, 60, "a")
        all_once(members, "a", 60)
        # One leaves cleanly (LeaveGroup): the two survivors take over.
        members[0].leave()
        survivors = members[1:]
        wait_for(lambda: owned_exactly_once(survivors, 6), what="2-way split after leave")
        produce(rokka, topic, 60, "b")
        all_once(survivors, "b", 60)
        # One is SIGKILLed: detected by session timeout (6 s), the last takes all.
        t0 = time.time()
        survivors[0].kill()
        last = survivors[1]
        wait_for(lambda: last.assigned == list(range(6)), timeout=60, what="last member owns all")
        assert time.time() - t0 >= 4, "a killed member is noticed by its session timeout, not at once"
        produce(rokka, topic, 60, "c")
        all_once([last], "c", 60)
        # Nothing consumed twice within a generation: every (partition, offset) once per member.
        for m in members:
            assert len(set((p, o) for p, o, _ in m.msgs)) == len(m.msgs)
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.kill()


def test_commit_and_resume_after_restart(rokka, topic):
    make_topic(rokka, topic, 2)
    produce(rokka, topic, 100, "m", partitions=2)
    group = f"resume-{topic}"
    conf = {"bootstrap.servers": rokka.bootstrap, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    c = Consumer(conf)
    c.subscribe([topic])
    got = []
    deadline = time.time() + 40
    while len(got) < 50 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m)
    assert len(got) >= 50
    c.commit(asynchronous=False)
    committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)}
    c.close()
    rokka.restart()
    c = Consumer(conf)
    c.subscribe([topic])
    rest = []
    deadline = time.time() + 40
    while len(got) + len(rest) < 100 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            rest.append(m)
    c.close()
    for m in rest:
        assert m.offset() >= committed[m.partition()], "resumed at the committed offset"
    assert sorted(m.value() for m in got + rest) == sorted(f"m-{i}".encode() for i in range(100))


def test_kafka_python_group_consumer(rokka, topic):
    make_topic(rokka, topic, 3)
    produce(rokka, topic, 30, "kp", partitions=3)
    c = KafkaConsumer(
        topic,
        bootstrap_servers=rokka.bootstrap,
        group_id=f"kp-{topic}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=15000,
        enable_auto_commit=False,
    )
    got = []
    for m in c:
        got.append(m)
        if len(got) == 30:
            break
    c.commit()
    assert sorted(m.value for m in got) == sorted(f"kp-{i}".encode() for i in range(30))
    assert sorted(c.assignment(), key=lambda tp: tp.partition) == [
        __import__("kafka").TopicPartition(topic, p) for p in range(3)
    ]
    c.close()
    # The committed offsets are visible to another client.
    k = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"kp-{topic}"})
    offs = k.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    assert [tp.offset for tp in offs] == [10, 10, 10]
    k.close()


def test_list_describe_delete_groups(rokka, topic):
    make_topic(rokka, topic, 1)
    group = f"admin-{topic}"
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    wait_for(lambda: c.poll(0.2) is None and len(c.assignment()) == 1, what="assignment")
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    listed = a.list_consumer_groups().result(10)
    assert group in [g.group_id for g in listed.valid]
    d = a.describe_consumer_groups([group])[group].result(10)
    assert str(d.state).endswith("STABLE")
    assert len(d.members) == 1
    # A group with members cannot be deleted: NON_EMPTY_GROUP (68).
    with pytest.raises(KafkaException) as refused:
        a.delete_consumer_groups([group])[group].result(10)
    assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP, refused.value
    c.close()
    a.delete_consumer_groups([group])[group].result(10)
    assert group not in [g.group_id for g in a.list_consumer_groups().result(10).valid]


def test_describe_groups_shows_no_assignment_while_a_rebalance_replaces_it(rokka, topic):
    """DescribeGroups (kafka-python's admin) during a rebalance: the members
    are listed without metadata and assignment, as Kafka's coordinator
    answers outside Stable (the assignment a rebalance is replacing would
    otherwise show partitions a member may no longer own); once Stable, the
    assignments are there again."""
    from kafka import KafkaAdminClient

    make_topic(rokka, topic, 2)
    group = f"dg-{topic}"
    # A session long enough for the rebalance below to be seen however
    # slowly the second member starts.
    a = Member(rokka, group, topic, session_ms=12000)
    wait_for(lambda: a.assigned == [0, 1], what="the first member's assignment")
    admin = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    b = None
    try:
        d = admin.describe_groups([group])[group]
        assert d["group_state"] == "Stable" and d["members"][0]["member_assignment"], d
        # The first member stops answering: the second one's join starts a
        # rebalance that waits for it until its session (12 s) runs out.
        a.proc.send_signal(signal.SIGSTOP)
        b = Member(rokka, group, topic)
        seen = None
        deadline = time.time() + 11
        while time.time() < deadline:
            d = admin.describe_groups([group])[group]
            if d["group_state"] == "PreparingRebalance":
                seen = d
                break
            time.sleep(0.1)
        assert seen is not None, "no rebalance seen"
        assert seen["members"], seen
        assert all(not m["member_assignment"] and not m["member_metadata"] for m in seen["members"]), seen
        wait_for(lambda: b.assigned == [0, 1], what="the second member's assignment")
        d = admin.describe_groups([group])[group]
        assert d["group_state"] == "Stable" and all(m["member_assignment"] for m in d["members"]), d
    finally:
        admin.close()
        a.proc.send_signal(signal.SIGCONT)
        a.kill()
        if b is not None:
            b.leave()


def test_a_static_member_restarts_without_a_rebalance(rokka, topic):
    """KIP-345 static membership with librdkafka (group.instance.id) and the
    cooperative-sticky assignor, whose subscription metadata names the
    partitions a member owns — so a restarted member's metadata differs
    from what it last sent. A static member that stops (no LeaveGroup) and
    comes back within its session takes its partitions again with no
    rebalance: the group's generation does not move (Kafka rebalances only
    if the group's selected protocol would change) and the other member
    keeps its partitions throughout."""
    make_topic(rokka, topic, 4)
    group = f"static-{topic}"
    key = f'rokka_group_rebalances_total{{group="{group}"}}'
    s = Member(rokka, group, topic, session_ms=30000, instance="inst-1", assignor="cooperative-sticky")
    wait_for(lambda: s.assigned == [0, 1, 2, 3], what="the static member's assignment")
    d = Member(rokka, group, topic, session_ms=30000, assignor="cooperative-sticky")
    s2 = None
    try:
        wait_for(
            lambda: owned_exactly_once([s, d], 4) and len(d.assigned or []) == 2,
            what="the two members' split",
        )
        mine, theirs = list(s.assigned), list(d.assigned)
        # The group settles (a cooperative rebalance may take two rounds).
        time.sleep(2)
        before = rokka.metric_values().get(key, 0)
        s.leave()
        s2 = Member(rokka, group, topic, session_ms=30000, instance="inst-1", assignor="cooperative-sticky")
        wait_for(lambda: s2.assigned == mine, timeout=20, what="the restarted member's partitions")
        time.sleep(2)
        assert d.assigned == theirs, f"the other member moved: {d.assigned}"
        after = rokka.metric_values().get(key, 0)
        assert after == before, f"{after - before} rebalances for a static member's restart"
        assert s2.assigned == mine
    finally:
        d.leave()
        if s2 is not None:
            s2.leave()
        if s.proc.poll() is None:
            s.kill()
