"""Retention deleting CommitLog segments while real clients read (issue 18,
item 5): docs/store.md "Retention" — whole segments deleted oldest first
(never the active one) when the file system is fuller than
`disk_max_used_percent`; queue start offsets move forward and a read below a
queue's start gets OffsetMoved with the new start, never garbage. Kafka
clients see OFFSET_OUT_OF_RANGE and reset (auto.offset.reset = earliest);
RocketMQ pulls get PULL_OFFSET_MOVED with nextBeginOffset = the new start.

This module's rokka has 1 MiB segments and `disk_max_used_percent = 1`
(any real file system is fuller than that), with the age and size triggers
left off (72 h, no size cap): every deletion here is the disk trigger's.
"""
import collections
import re
import time

import pytest
from confluent_kafka import Consumer, Producer
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP

from realclients import (
    committed,
    create_topics,
    log_since,
    log_size,
    metric,
    run_harness,
    wait_for,
    watermarks,
)
from rokka_fixture import Rokka, results_dir

SEGMENT = 1 << 20
DISK_MAX_USED_PERCENT = 1


@pytest.fixture(scope="module")
def rokka():
    r = Rokka(
        results_dir("cross", "test_retention"),
        store_extra=f"""max_message_bytes = {SEGMENT // 2}
retention_check_interval_ms = 500
disk_max_used_percent = {DISK_MAX_USED_PERCENT}
retention_hours = 72
retention_max_bytes = 0""",
    )
    # The fixture's segment size is 64 MiB; a key cannot be given twice, so
    # change it in place before the first start.
    with open(r.config) as f:
        text = f.read()
    assert "commitlog_segment_bytes = 67108864" in text
    with open(r.config, "w") as f:
        f.write(text.replace("commitlog_segment_bytes = 67108864", f"commitlog_segment_bytes = {SEGMENT}"))
    r.start()
    try:
        yield r
    finally:
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"


def fill(rokka, topic, megabytes=2.5):
    """Enough Kafka records to roll the CommitLog past two segments."""
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all", "linger.ms": 0, "batch.size": 100000})
    errors = []
    n = int(megabytes * SEGMENT / 60000) + 1
    for i in range(n):
        p.produce(topic, value=bytes([i % 256]) * 60000, on_delivery=lambda e, m: e and errors.append(e))
        p.poll(0)
    assert p.flush(30) == 0 and not errors, errors


def deleted(rokka):
    return metric(rokka, "rokka_store_segments_deleted_total")


def test_disk_usage_trigger_deletes_segments(rokka):
    mark = log_size(rokka)
    before = deleted(rokka)
    fill(rokka, "RetFill")
    assert wait_for("deletions", lambda: deleted(rokka) >= before + 2, 20), (
        f"segments deleted: {deleted(rokka) - before} (log: {rokka.log_path})"
    )
    lines = [l for l in log_since(rokka, mark).splitlines() if "deleted CommitLog segment" in l]
    assert len(lines) >= 2, lines
    for l in lines:
        assert re.search(r"disk_full\W+true", l) and re.search(r"over_size\W+false", l), l
    # Only the active segment (and one just closed) remains; the topic's
    # start moved forward.
    assert wait_for("segments", lambda: metric(rokka, "rokka_store_commitlog_segments") <= 2, 10), metric(
        rokka, "rokka_store_commitlog_segments"
    )
    (lo, hi), = watermarks(rokka, "RetFill").values()
    assert 0 < lo < hi, (lo, hi)


def test_kafka_consumers_at_a_deleted_offset_reset_to_the_log_start(rokka):
    topic, group = "RetKafka", "ret-kg"
    create_topics(rokka, {topic: 1})
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(10):
        p.produce(topic, value=f"old-{i}".encode())
    assert p.flush(10) == 0
    # The group consumes offsets 0..4 and commits 5.
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error() and m.offset() == 4:
                c.commit(message=m, asynchronous=False)
                break
    finally:
        c.close()
    assert committed(rokka, group, topic, [0]) == {0: 5}

    # A kafka-python consumer reads the partition, connected throughout.
    live = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="earliest")
    try:
        tp = KTP(topic, 0)
        live.assign([tp])
        seen = []
        deadline = time.time() + 20
        while len(seen) < 10 and time.time() < deadline:
            for recs in live.poll(timeout_ms=500).values():
                seen += [r.offset for r in recs]
        assert seen == list(range(10)), seen

        # Retention deletes the segment holding offsets 0..9.
        fill(rokka, "RetFill")
        for i in range(10):
            p.produce(topic, value=f"new-{i}".encode())
        assert p.flush(10) == 0
        marks = wait_for("log start", lambda: (lambda m: m if m[0] >= 10 else None)(watermarks(rokka, topic)[0]), 20)
        assert marks, f"offsets 0..9 of {topic} not deleted: {watermarks(rokka, topic)}"
        assert marks == (10, 20), marks

        # The live consumer, positioned at the deleted offset 5, gets
        # OFFSET_OUT_OF_RANGE and resets to the new log start.
        live.seek(tp, 5)
        got = []
        deadline = time.time() + 20
        while len(got) < 10 and time.time() < deadline:
            for recs in live.poll(timeout_ms=500).values():
                got += [(r.offset, r.value.decode()) for r in recs]
        assert got == [(10 + i, f"new-{i}") for i in range(10)], got
    finally:
        live.close()

    # The group, committed at the deleted offset 5, likewise.
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got = []
    try:
        deadline = time.time() + 30
        while len(got) < 10 and time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append((m.offset(), m.value().decode()))
    finally:
        c.close()
    assert got == [(10 + i, f"new-{i}") for i in range(10)], got


def test_rocketmq_pull_of_a_deleted_offset_gets_offset_moved(rokka):
    topic, group = "RetRmq", "ret-rg"
    run_harness(rokka, "early", "dur-send", topic, "early", 12)
    # The group consumes them and commits (clean shutdown persists offsets).
    h = run_harness(rokka, "consume-early", "dur-consume", topic, group, 40, 12)
    assert len(h.lines("got ")) == 12, h.lines("got ")
    ends = {q: hi for q, (lo, hi) in watermarks(rokka, topic).items()}
    offsets = committed(rokka, group, topic, sorted(ends))
    assert offsets == ends, f"committed {offsets}, queue ends {ends}"
    # More arrive that the group does not read before retention deletes them.
    run_harness(rokka, "mid", "dur-send", topic, "mid", 12)
    fill(rokka, "RetFill")
    run_harness(rokka, "late", "dur-send", topic, "late", 12)

    def moved():
        m = watermarks(rokka, topic)
        return m if all(lo > offsets[q] for q, (lo, hi) in m.items()) else None

    marks = wait_for("queue starts", moved, 20)
    assert marks, f"committed {offsets}, queues {watermarks(rokka, topic)}"

    # The group pulls at its committed offsets, now below the queues' starts:
    # PULL_OFFSET_MOVED (the client's "offset illegal") with the new start.
    h = run_harness(rokka, "consume-late", "dur-consume", topic, group, 40, 12)
    moved_to = re.findall(
        r"offset illegal, PullResult \[pullStatus=OFFSET_ILLEGAL, nextBeginOffset=(\d+), minOffset=(\d+)", h.text()
    )
    assert moved_to, f"the client never saw OFFSET_MOVED (output: {h.path})"
    # Each answer names the queue's new start as where to go on.
    assert all(nxt == lo for nxt, lo in moved_to), moved_to
    assert {int(nxt) for nxt, _ in moved_to} == {lo for lo, hi in marks.values()}, (moved_to, marks)
    got = [l.split() for l in h.lines("got ")]
    bodies = collections.Counter(b for *_, b in got)
    assert bodies == collections.Counter(f"late-{i}" for i in range(12)), bodies
    for q, (lo, hi) in marks.items():
        offs = sorted(int(o) for _, _, qq, o, _, _ in got if int(qq) == q)
        assert offs == list(range(lo, hi)), f"queue {q}: start {lo}, end {hi}, got {offs}"
