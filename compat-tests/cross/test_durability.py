"""Sync flush end to end, and a SIGKILL of rokka with real clients of both
protocols connected (issue 18, item 5).

One rokka in the compat configuration with `store.flush_mode = "sync"`:

* acks=-1 produces (confluent-kafka) and RocketMQ sync sends (the harness,
  rocketmq-client-rust) are each answered after a CommitLog flush of their
  own (docs/kafka.md "acks -1 waits for the flush in sync mode";
  docs/store.md "Flush"; `rokka_store_flush_seconds` in docs/metrics.md).
* Under load — an idempotent confluent-kafka producer (acks=all), a
  confluent-kafka consumer committing each record, a RocketMQ producer of
  sync sends, a RocketMQ push consumer, delayed and timer messages waiting,
  transactions resolved and one left open — rokka is SIGKILLed and started
  again on the same data. Then: every acknowledged message is in the log
  exactly once; committed offsets survive up to what
  `store.offsets_flush_interval_ms` bounds (docs/store.md "Consumer
  offsets": written every interval when changed); delay-level progress and
  timer op records survive (docs/rocketmq.md: a restart resumes, nothing
  delivered twice); transaction op records survive (nothing resolved twice);
  the idempotent producer continues without sequence errors or duplicates.
"""
import collections
import os
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from realclients import (
    Harness,
    committed,
    create_topics,
    metric,
    partitions,
    read_topic,
    run_harness,
    values,
    wait_for,
    watermarks,
)
from rokka_fixture import Rokka, results_dir, running

# store.offsets_flush_interval_ms of this module's rokka. A commit older than
# this (plus the slack) at the moment of the crash must have survived it.
OFFSETS_FLUSH_MS = 1000
# The persist itself (temp file, fsync, rename) and the store task loop's
# other work (checkpoint msyncs) on a loaded 2-core machine.
SLACK_MS = 1000
# The harness's RocketMQ push consumer sends its offsets every second (and
# first 10 s after it started, the client's fixed initial delay).
CLIENT_PERSIST_MS = 1000
# The harness's consumer sends its offsets the first time this long after it started.
CLIENT_FIRST_PERSIST_S = 10
# Delay of level 3 in this module (and the timer of the late messages): the
# late ones are sent once the load runs and must still wait at the crash.
LATE_MS = 25000


@pytest.fixture(scope="module")
def rokka():
    with running(
        "cross",
        "test_durability",
        store_extra=f'flush_mode = "sync"\noffsets_flush_interval_ms = {OFFSETS_FLUSH_MS}',
        # Quick transaction checks, and enough of them (each scan counts one,
        # live producer or not, as RocketMQ) for the open transaction to stay
        # open until the producer is back; Kafka groups form without the 3 s wait.
        rocketmq_extra="transaction_timeout_ms = 2000\ntransaction_check_interval_ms = 500\n"
        "transaction_check_max = 1000\n"
        f"[broker]\ndelay_levels_ms = [1000, 5000, {LATE_MS}]\n"
        "[group]\ninitial_rebalance_delay_ms = 0",
    ) as r:
        yield r


def flushes(rokka):
    return metric(rokka, "rokka_store_flush_seconds_count")


# ---------------------------------------------------------------- sync flush


def test_sync_flush_kafka_acks_all_waits_for_its_flush(rokka):
    topic, n = "DurSyncKafka", 40
    create_topics(rokka, {topic: 1})
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all", "linger.ms": 0})
    delivered, failed = [], []

    def cb(err, msg):
        (failed if err else delivered).append(err or msg.offset())

    def produce_one(v):
        p.produce(topic, value=v, on_delivery=cb)
        assert p.flush(15) == 0, "not acknowledged within 15 s"

    produce_one(b"warm-up")  # metadata and connection
    before = flushes(rokka)
    for i in range(n):
        produce_one(f"sync-{i}".encode())
    after = flushes(rokka)
    assert not failed, failed
    assert len(delivered) == n + 1
    # One at a time, each acknowledged only after an msync covering it: at
    # least one flush that wrote data per produce (the 1 s checkpoint adds a
    # few). In async mode (500 ms flushes) this would be ~2.
    assert after - before >= n, f"{after - before} CommitLog flushes for {n} acks=-1 produces"
    assert metric(rokka, "rokka_store_flush_timeouts_total") == 0
    got = values(read_topic(rokka, topic))
    assert got == collections.Counter(["warm-up"] + [f"sync-{i}" for i in range(n)])


def test_sync_flush_rocketmq_sync_sends_wait_for_their_flush(rokka):
    n = 40
    run_harness(rokka, "warm-up", "dur-send", "DurSyncRmq", "warm", 1)
    before = flushes(rokka)
    h = run_harness(rokka, "sync-send", "dur-send", "DurSyncRmq", "sync", n)
    after = flushes(rokka)
    acked = h.lines("acked ")
    assert len(acked) == n, h.lines()[-5:]
    assert after - before >= n, f"{after - before} CommitLog flushes for {n} sync sends"
    assert metric(rokka, "rokka_store_flush_timeouts_total") == 0
    got = values(read_topic(rokka, "DurSyncRmq"))
    assert got == collections.Counter(["warm-0"] + [f"sync-{i}" for i in range(n)])


# ---------------------------------------------------------------- the crash


class KafkaLoad:
    """An idempotent producer (acks=all) writing `k-<i>` to alternating
    partitions every 20 ms, and a consumer of group `group` committing every
    record synchronously, each recording what it saw and when."""

    def __init__(self, rokka, topic, group):
        self.topic, self.group = topic, group
        self.acked = []  # (time, value, partition, offset)
        self.delivery_errors = []  # (time, value, error)
        self.client_errors = []  # (time, error, fatal)
        self.produced = 0
        self.commits = []  # (time, partition, next offset)
        self.consumed = []  # (time, partition, offset)
        self.commit_errors = []
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        self.p = Producer(
            {
                "bootstrap.servers": rokka.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "reconnect.backoff.ms": 100,
                "reconnect.backoff.max.ms": 500,
                "message.timeout.ms": 120000,
                "error_cb": lambda e: self.client_errors.append((time.time(), e, e.fatal())),
            }
        )
        self.c = Consumer(
            {
                "bootstrap.servers": rokka.bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "reconnect.backoff.ms": 100,
                "reconnect.backoff.max.ms": 500,
                "session.timeout.ms": 6000,
            }
        )
        self.c.subscribe([topic])
        self.threads = [threading.Thread(target=self._produce), threading.Thread(target=self._consume)]
        for t in self.threads:
            t.start()

    def _cb(self, err, msg):
        if err:
            self.delivery_errors.append((time.time(), msg.value(), err))
        else:
            self.acked.append((time.time(), msg.value().decode(), msg.partition(), msg.offset()))

    def _produce(self):
        i = 0
        while not self.stop_producing.is_set():
            try:
                self.p.produce(self.topic, value=f"k-{i}".encode(), partition=i % 2, on_delivery=self._cb)
                i += 1
                self.produced = i
            except BufferError:
                pass
            self.p.poll(0.02)
        self.unflushed = self.p.flush(60)

    def _consume(self):
        while not self.stop_consuming.is_set():
            m = self.c.poll(0.2)
            if m is None or m.error():
                continue
            self.consumed.append((time.time(), m.partition(), m.offset()))
            try:
                self.c.commit(message=m, asynchronous=False)
                self.commits.append((time.time(), m.partition(), m.offset() + 1))
            except KafkaException as e:
                self.commit_errors.append((time.time(), e))

    def close_consumer(self):
        self.stop_consuming.set()
        self.threads[1].join(30)
        assert not self.threads[1].is_alive(), "the Kafka consumer thread did not stop"
        self.c.close()  # no auto commit: leaves the group, commits nothing

    def finish_producer(self):
        self.stop_producing.set()
        self.threads[0].join(90)
        assert not self.threads[0].is_alive(), "the Kafka producer did not flush within 60 s"


class Crash:
    """What the crash fixture saw, for the tests to judge."""


def consumer_started(h):
    """When a dur-consume harness started (s since the epoch), once it did."""
    lines = h.lines("started ")
    return int(lines[0].split()[1]) / 1000 if lines else None


@pytest.fixture(scope="module")
def crash(rokka):
    s = Crash()
    s.ktopic, s.kgroup = "DurK", "dur-kg"
    s.rtopic, s.rgroup = "DurR", "dur-rg"
    # Both exist before their consumers start (a client asks for a route
    # it lacks only every 30 s).
    create_topics(rokka, {s.ktopic: 2, s.rtopic: 4})

    # Before the load: transactions resolved (and one left open, with no
    # live producer of the group to check it), delayed and timer messages
    # due long before the crash.
    s.tx1 = run_harness(rokka, "tx-1", "dur-tx", 1, "DurTx", "dur-tx-pg")
    run_harness(rokka, "delayed-early", "dur-delayed", "DurDelay", "early-l1:1:0:3", "early-t:0:1000:3")

    # The load.
    stop_file = os.path.join(rokka.workdir, "stop-stream")
    s.kafka = KafkaLoad(rokka, s.ktopic, s.kgroup)
    s.stream = Harness(rokka, "stream", "dur-send", s.rtopic, "r", 100000, 150, 20, stop_file)
    s.rconsumer = Harness(rokka, "consume", "dur-consume", s.rtopic, s.rgroup, 150)
    try:
        started = wait_for("consumer start", lambda: consumer_started(s.rconsumer), 30)
        assert started, f"the RocketMQ consumer did not start ({s.rconsumer.path})"
        # Delayed (level 3) and timer messages due after the crash.
        run_harness(rokka, "delayed-late", "dur-delayed", "DurDelay", "late-l3:3:0:3", f"late-t:0:{LATE_MS}:3")
        assert wait_for("a delivery", lambda: s.rconsumer.lines("got "), 30), "the RocketMQ consumer got nothing"
        rparts = partitions(rokka, s.rtopic)

        def bounds_mean_something():
            """Each queue and partition has a commit older than its bound,
            the early delayed messages are delivered, the late ones wait."""
            now = time.time()
            kafka_window = (OFFSETS_FLUSH_MS + SLACK_MS) / 1000 + 1
            kafka_ok = all(any(t <= now - kafka_window for t, q, _ in s.kafka.commits if q == p) for p in (0, 1))
            rmq_window = (CLIENT_PERSIST_MS + OFFSETS_FLUSH_MS + SLACK_MS) / 1000 + 1
            got = [l.split() for l in s.rconsumer.lines("got ")]
            sent_at = [(max(int(t) / 1000, started + CLIENT_FIRST_PERSIST_S), int(q)) for _, t, q, *_ in got]
            rmq_ok = all(any(t <= now - rmq_window for t, qq in sent_at if qq == q) for q in rparts)
            return (
                kafka_ok
                and rmq_ok
                and metric(rokka, "rokka_delayed_messages_pending", level="1") == 0
                and metric(rokka, "rokka_timer_messages_pending") == 3
            )

        assert wait_for("committed offsets old enough", bounds_mean_something, 60, every=0.5), (
            f"no committed offsets older than their bound within 60 s ({s.rconsumer.path})"
        )
        s.pending_before = {
            "level1": metric(rokka, "rokka_delayed_messages_pending", level="1"),
            "level3": metric(rokka, "rokka_delayed_messages_pending", level="3"),
            "timer": metric(rokka, "rokka_timer_messages_pending"),
            "half": metric(rokka, "rokka_rocketmq_half_messages_pending"),
        }
        s.delay_before = values(read_topic(rokka, "DurDelay"))
        assert s.rconsumer.running() and s.stream.running(), "a harness process ended before the crash"

        # The crash: the RocketMQ consumer dies with rokka (else it would
        # commit its in-memory position to the restarted rokka, hiding what
        # rokka itself kept); the Kafka consumer stops before it can talk to
        # the new process.
        s.rconsumer.kill()
        s.killed_at = time.time()
        code = rokka.kill()
        s.kafka.stop_consuming.set()
        s.stream_acked_at_kill = len(s.stream.lines("acked "))
        assert code == -9, f"rokka exited with {code} before the SIGKILL; log: {rokka.log_path}"
        rokka.start()
        s.restarted_at = time.time()
        s.kafka.close_consumer()
        s.restored_kafka = committed(rokka, s.kgroup, s.ktopic, [0, 1])
        s.restored_rmq = committed(rokka, s.rgroup, s.rtopic, rparts)

        # Both producers carry on after the restart for a while.
        def acked_after(n):
            return lambda: sum(1 for a in s.kafka.acked if a[0] > s.restarted_at) >= n

        wait_for("kafka acks after the restart", acked_after(100), 60)

        def stream_after(n):
            return lambda: len(s.stream.lines("acked ")) >= s.stream_acked_at_kill + n

        wait_for("rocketmq acks after the restart", stream_after(50), 60)
    finally:
        s.kafka.stop_consuming.set()
        s.kafka.finish_producer()
        open(stop_file, "w").close()
        code = s.stream.wait(60)
        if s.rconsumer.running():
            s.rconsumer.kill()
        if s.kafka.threads[1].is_alive():
            s.kafka.threads[1].join(30)
    assert code == 0, s.stream.lines()[-5:]
    yield s


def test_kafka_acknowledged_records_survive_exactly_once(crash, rokka):
    k = crash.kafka
    before = [a for a in k.acked if a[0] < crash.killed_at]
    after = [a for a in k.acked if a[0] > crash.restarted_at]
    assert before and after, f"{len(before)} acks before the crash, {len(after)} after the restart"
    got = values(read_topic(rokka, crash.ktopic))
    acked = collections.Counter(a[1] for a in k.acked)
    assert max(acked.values()) == 1, "a record acknowledged twice"
    missing = [v for v in acked if got[v] == 0]
    twice = {v: n for v, n in got.items() if n > 1}
    assert not missing, f"{len(missing)} acknowledged records lost: {missing[:10]}"
    assert not twice, f"records stored more than once: {dict(list(twice.items())[:10])}"
    # Where the producer was told each record went is where it is.
    by_pos = {(p, o): v.decode() for p, o, v in read_topic(rokka, crash.ktopic)}
    wrong = [(a[1], a[2], a[3]) for a in k.acked if by_pos.get((a[2], a[3])) != a[1]]
    assert not wrong, f"acknowledged at an offset holding something else: {wrong[:10]}"


def test_idempotent_producer_continues_after_the_crash_without_duplicates(crash, rokka):
    k = crash.kafka
    fatal = [(t, str(e)) for t, e, f in k.client_errors if f]
    sequence = [
        (t, str(e))
        for t, e, _ in k.client_errors
        if e.code()
        in (
            KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
            KafkaError.UNKNOWN_PRODUCER_ID,
            KafkaError.INVALID_PRODUCER_EPOCH,
            KafkaError.DUPLICATE_SEQUENCE_NUMBER,
        )
    ]
    assert not fatal and not sequence, f"fatal {fatal[:5]}, sequence errors {sequence[:5]}"
    assert not k.delivery_errors, [(t, v, str(e)) for t, v, e in k.delivery_errors[:5]]
    assert k.unflushed == 0
    # Everything produced — including what was in flight at the crash and
    # retried by librdkafka with its sequence numbers — acknowledged once.
    assert len(k.acked) == k.produced, f"{len(k.acked)} acknowledged of {k.produced} produced"
    got = values(read_topic(rokka, crash.ktopic))
    assert sum(got.values()) == k.produced and len(got) == k.produced, (
        f"{sum(got.values())} records, {len(got)} distinct, {k.produced} produced"
    )
    print(
        "idempotent retries acknowledged without an append:",
        metric(rokka, "rokka_kafka_duplicate_batches_total"),
    )


def test_rocketmq_acknowledged_sends_survive_exactly_once(crash, rokka):
    acked = [l.split() for l in crash.stream.lines("acked ")]
    failed = [l.split()[1] for l in crash.stream.lines("failed ")]
    assert len(acked) > crash.stream_acked_at_kill > 0, "acknowledged sends before the crash and after the restart"
    # The kill is the fixture's own (kill -9, then a restart): a client that
    # retries within its send timeout may see no send fail across a quick
    # restart, so failures are reported, not required (it flaked that way).
    print(f"rocketmq sends failed while rokka was down: {len(failed)}")
    records = read_topic(rokka, crash.rtopic)
    got = values(records)
    missing = [a[1] for a in acked if got[a[1]] == 0]
    twice = {v: n for v, n in got.items() if n > 1}
    assert not missing, f"{len(missing)} acknowledged sends lost: {missing[:10]}"
    assert not twice, f"messages stored more than once: {dict(list(twice.items())[:10])}"
    by_pos = {(p, o): v.decode() for p, o, v in records}
    wrong = [a for a in acked if by_pos.get((int(a[2]), int(a[3]))) != a[1]]
    assert not wrong, f"acknowledged at a queue offset holding something else: {wrong[:10]}"


def test_kafka_group_offsets_survive_within_the_flush_interval(crash, rokka):
    k, window = crash.kafka, (OFFSETS_FLUSH_MS + SLACK_MS) / 1000
    for p in (0, 1):
        mine = [(t, nxt) for t, q, nxt in k.commits if q == p]
        durable = [nxt for t, nxt in mine if t <= crash.killed_at - window]
        assert durable, f"partition {p}: no commit older than {window} s at the crash: the bound checks nothing"
        last = max(nxt for _, nxt in mine)
        restored = crash.restored_kafka[p]
        assert restored is not None, f"partition {p}: committed offset lost (last commit {last})"
        assert max(durable) <= restored <= last, (
            f"partition {p}: committed {restored} after the restart; commits older than {window} s "
            f"reached {max(durable)}, the last before the crash {last}"
        )
        print(f"partition {p}: {last - restored} records to re-deliver (at most {last - max(durable)} allowed)")

    # A consumer of the group resumes at those offsets.
    marks = watermarks(rokka, crash.ktopic)
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": crash.kgroup,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([crash.ktopic])
    first, last = {}, {}
    deadline = time.time() + 40
    try:
        while time.time() < deadline and any(last.get(p, -1) + 1 < marks[p][1] for p in (0, 1)):
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            first.setdefault(m.partition(), m.offset())
            last[m.partition()] = m.offset()
    finally:
        c.close()
    assert first == crash.restored_kafka, f"resumed at {first}, committed {crash.restored_kafka}"


def test_rocketmq_group_offsets_survive_within_the_flush_interval(crash, rokka):
    window = (CLIENT_PERSIST_MS + OFFSETS_FLUSH_MS + SLACK_MS) / 1000
    started = consumer_started(crash.rconsumer)
    before = [l.split() for l in crash.rconsumer.lines("got ")]
    before = [(int(t) / 1000, int(q), int(o)) for _, t, q, o, _, _ in before]
    assert before, "the RocketMQ consumer got nothing before the crash"
    restored = crash.restored_rmq
    for q in sorted({q for _, q, _ in before}):
        mine = [(t, o) for t, qq, o in before if qq == q]
        # The client sends what it consumed every second, the first time
        # CLIENT_FIRST_PERSIST_S after it started; rokka writes it within
        # its flush interval.
        sent_at = [(max(t, started + CLIENT_FIRST_PERSIST_S), o) for t, o in mine]
        durable = [o + 1 for t, o in sent_at if t <= crash.killed_at - window]
        assert durable, f"queue {q}: no delivery older than {window} s at the crash: the bound checks nothing"
        last = max(o for _, o in mine) + 1
        assert restored[q] is not None, f"queue {q}: committed offset lost"
        assert max(durable) <= restored[q] <= last, (
            f"queue {q}: committed {restored[q]} after the restart; deliveries older than {window} s "
            f"reached {max(durable)}, the last before the crash {last}"
        )
        print(f"queue {q}: {last - restored[q]} messages to re-deliver (at most {last - max(durable)} allowed)")

    # A consumer of the group resumes at those offsets and gets the rest, once.
    marks = watermarks(rokka, crash.rtopic)
    want = sum(hi - restored[q] for q, (lo, hi) in marks.items())
    h = run_harness(rokka, "resume", "dur-consume", crash.rtopic, crash.rgroup, 60, want, timeout=120)
    after = [l.split() for l in h.lines("got ")]
    after = [(int(q), int(o)) for _, _, q, o, _, _ in after]
    for q, (lo, hi) in marks.items():
        offs = sorted(o for qq, o in after if qq == q)
        assert offs == list(range(restored[q], hi)), (
            f"queue {q}: committed {restored[q]}, end {hi}; after the restart got "
            f"{offs[:5]}...{offs[-5:]} ({len(offs)})"
        )


def test_delay_and_timer_progress_survive(crash, rokka):
    early = [f"early-l1-{i}" for i in range(3)] + [f"early-t-{i}" for i in range(3)]
    late = [f"late-l3-{i}" for i in range(3)] + [f"late-t-{i}" for i in range(3)]
    # Before the crash: the early ones delivered (long enough ago for the
    # level's progress to be persisted), the late ones waiting.
    assert all(crash.delay_before[b] == 1 for b in early), crash.delay_before
    assert not any(crash.delay_before[b] for b in late), crash.delay_before
    assert crash.pending_before["level1"] == 0 and crash.pending_before["level3"] == 3, crash.pending_before
    assert crash.pending_before["timer"] == 3, crash.pending_before

    def all_there():
        got = values(read_topic(rokka, "DurDelay"))
        return got if all(got[b] for b in late) else None

    assert wait_for("late delayed messages", all_there, 40, every=1), "late delayed messages never arrived"
    # Long enough for a second delivery (every 100 ms) to show.
    time.sleep(2)
    got = values(read_topic(rokka, "DurDelay"))
    assert {b: got[b] for b in early + late} == {b: 1 for b in early + late}, dict(got)
    assert sum(got.values()) == len(early + late), dict(got)
    assert metric(rokka, "rokka_delayed_messages_pending", level="3") == 0
    assert metric(rokka, "rokka_timer_messages_pending") == 0


def test_transaction_resolutions_survive(crash, rokka):
    assert crash.pending_before["half"] == 1, crash.pending_before
    # After the restart, only the open one is pending (op records rebuilt).
    pending = wait_for(
        "half messages pending",
        lambda: metric(rokka, "rokka_rocketmq_half_messages_pending") == 1,
        10,
    )
    assert pending, f"half messages pending after the restart: {metric(rokka, 'rokka_rocketmq_half_messages_pending')}"
    h = run_harness(rokka, "tx-2", "dur-tx", 2, "DurTx", "dur-tx-pg", timeout=90)
    checks = [l.split()[1] for l in h.lines("check ")]
    assert "dtx-open" in checks, f"the open transaction was never checked: {h.lines()[-5:]}"
    assert set(checks) == {"dtx-open"}, f"resolved transactions checked again: {checks}"
    got = values(read_topic(rokka, "DurTx"))
    assert got == collections.Counter(["dtx-commit", "dtx-open", "dtx-second"]), dict(got)
