"""Kafka transactions with real clients: confluent-kafka (librdkafka) and
kafka-python transactional producers — commit, abort, abort then commit,
offsets sent to a transaction, a zombie fenced by a newer incarnation, a
transaction held open — read by read_committed consumers (which must see
exactly the committed records) and read_uncommitted ones (which see all)."""
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def new_topic(rokka, partitions=2):
    name = f"tx-{uuid.uuid4().hex[:10]}"
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(10)
    return name


def txn_producer(rokka, tid, **conf):
    p = Producer({"bootstrap.servers": rokka.bootstrap, "transactional.id": tid, "linger.ms": 5, **conf})
    p.init_transactions(30)
    return p


def read_all(rokka, topic, partitions, isolation, expect=None, wait=8.0):
    """Every record value of `topic` a consumer with `isolation` sees."""
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": f"rd-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, eof = [], set()
    deadline = time.time() + wait
    while time.time() < deadline:
        m = c.poll(0.2)
        if m is None:
            if expect is None and len(eof) == partitions:
                break
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                eof.add(m.partition())
                if expect is not None and len(got) >= expect and len(eof) == partitions:
                    break
                continue
            raise AssertionError(m.error())
        got.append(m.value().decode())
    c.close()
    return got


def fill(rokka, topic, n):
    """n plain records in-0 … in-(n-1) on partition 0 of `topic`."""
    plain = Producer({"bootstrap.servers": rokka.bootstrap})
    for i in range(n):
        plain.produce(topic, f"in-{i}".encode(), partition=0)
    assert plain.flush(10) == 0


def group_consumer(rokka, group):
    """A read_committed member of `group` that commits only when told."""
    return Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )


def test_commit_abort_and_abort_then_commit(rokka):
    topic = new_topic(rokka)
    p = txn_producer(rokka, f"tid-{topic}")
    p.begin_transaction()
    for i in range(100):
        p.produce(topic, f"c1-{i}".encode(), partition=i % 2)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(50):
        p.produce(topic, f"a1-{i}".encode(), partition=i % 2)
    p.flush(10)
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(30):
        p.produce(topic, f"c2-{i}".encode(), partition=i % 2)
    p.commit_transaction(30)
    committed = sorted([f"c1-{i}" for i in range(100)] + [f"c2-{i}" for i in range(30)])
    assert sorted(read_all(rokka, topic, 2, "read_committed", expect=130)) == committed
    everything = read_all(rokka, topic, 2, "read_uncommitted", expect=180)
    assert sorted(everything) == sorted(committed + [f"a1-{i}" for i in range(50)])


def test_open_transaction_is_invisible_to_read_committed_until_it_commits(rokka):
    topic = new_topic(rokka, partitions=1)
    p = txn_producer(rokka, f"tid-{topic}")
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, f"open-{i}".encode(), partition=0)
    p.flush(10)
    assert read_all(rokka, topic, 1, "read_committed", wait=3) == []
    assert len(read_all(rokka, topic, 1, "read_uncommitted", expect=10)) == 10
    # ListOffsets "latest": the last stable offset for read_committed, the
    # high watermark for read_uncommitted.
    for isolation, want in (("read_committed", 0), ("read_uncommitted", 10)):
        c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "lso", "isolation.level": isolation})
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.close()
        assert high == want, (isolation, high)
    p.commit_transaction(30)
    assert read_all(rokka, topic, 1, "read_committed", expect=10) == [f"open-{i}" for i in range(10)]


def test_offsets_sent_to_a_transaction_commit_with_it(rokka):
    src = new_topic(rokka, partitions=1)
    dst = new_topic(rokka, partitions=1)
    fill(rokka, src, 20)
    group = f"ctp-{src}"
    c = group_consumer(rokka, group)
    c.subscribe([src])
    got = []
    deadline = time.time() + 30
    while len(got) < 20 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m)
    assert len(got) == 20
    p = txn_producer(rokka, f"tid-{src}")
    # Aborted first: neither output nor offsets count.
    p.begin_transaction()
    for m in got[:10]:
        p.produce(dst, m.value().upper(), partition=0)
    p.send_offsets_to_transaction([TopicPartition(src, 0, 10)], c.consumer_group_metadata(), 30)
    p.abort_transaction(30)
    assert c.committed([TopicPartition(src, 0)], timeout=10)[0].offset < 0
    p.begin_transaction()
    for m in got:
        p.produce(dst, m.value().upper(), partition=0)
    p.send_offsets_to_transaction([TopicPartition(src, 0, 20)], c.consumer_group_metadata(), 30)
    p.commit_transaction(30)
    assert c.committed([TopicPartition(src, 0)], timeout=10)[0].offset == 20
    c.close()
    assert read_all(rokka, dst, 1, "read_committed", expect=20) == [f"IN-{i}" for i in range(20)]


def test_a_zombie_is_fenced_by_a_newer_incarnation(rokka):
    topic = new_topic(rokka, partitions=1)
    tid = f"tid-{topic}"
    zombie = txn_producer(rokka, tid)
    zombie.begin_transaction()
    for i in range(5):
        zombie.produce(topic, f"zombie-{i}".encode(), partition=0)
    zombie.flush(10)
    fresh = txn_producer(rokka, tid)  # aborts the zombie's open transaction
    fresh.begin_transaction()
    fresh.produce(topic, b"fresh", partition=0)
    fresh.commit_transaction(30)
    with pytest.raises(KafkaException) as e:
        zombie.produce(topic, b"late", partition=0)
        zombie.commit_transaction(15)
    err = e.value.args[0]
    assert err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
    assert read_all(rokka, topic, 1, "read_committed", expect=1) == ["fresh"]


def test_kafka_python_transactions_and_read_committed(rokka):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    topic = new_topic(rokka, partitions=1)
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap, transactional_id=f"kp-{topic}")
    p.init_transactions()
    p.begin_transaction()
    for i in range(10):
        p.send(topic, f"kc-{i}".encode(), partition=0)
    p.commit_transaction()
    p.begin_transaction()
    for i in range(10):
        p.send(topic, f"ka-{i}".encode(), partition=0)
    p.flush()
    p.abort_transaction()
    p.close()
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, isolation_level="read_committed", auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=4000)
    c.assign([KTP(topic, 0)])
    got = [m.value.decode() for m in c]
    c.close()
    assert got == [f"kc-{i}" for i in range(10)]
    # And librdkafka's read_committed consumer agrees.
    assert read_all(rokka, topic, 1, "read_committed", expect=10) == got


def test_describe_and_list_transactions(rokka):
    """kafka-python's admin: ListTransactions and DescribeTransactions."""
    from kafka import KafkaAdminClient

    topic = new_topic(rokka, partitions=1)
    tid = f"tid-{topic}"
    p = txn_producer(rokka, tid)
    p.begin_transaction()
    p.produce(topic, b"x", partition=0)
    p.flush(10)
    k = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    try:
        listed = [t for txns in k.list_transactions().values() for t in txns]
        mine = [t for t in listed if t.transactional_id == tid]
        assert len(mine) == 1 and mine[0].state.value == "Ongoing", listed
        ongoing = k.list_transactions(state_filters=["Ongoing"])
        assert tid in [t.transactional_id for txns in ongoing.values() for t in txns]
        d = k.describe_transactions([tid])[tid]
        assert d.state.value == "Ongoing", d
        assert [(tp.topic, tp.partition) for tp in d.topic_partitions] == [(topic, 0)], d
        assert d.transaction_start_time_ms > 0 and d.producer_epoch >= 0, d
        p.commit_transaction(30)
        d = k.describe_transactions([tid])[tid]
        assert d.state.value == "CompleteCommit", d
        with pytest.raises(Exception) as e:
            k.describe_transactions(["no-such-transactional-id"])
        assert "NotFound" in type(e.value).__name__ or "NOT_FOUND" in str(e.value).upper(), e.value
    finally:
        k.close()


def test_transactions_survive_a_broker_crash(rokka):
    """kill -9 of the broker with one transaction committed and one open:
    after the restart the committed one is there, the open one is still open
    (invisible to read_committed, holding the last stable offset) and the
    same producer commits it."""
    topic = new_topic(rokka, partitions=2)
    p = txn_producer(rokka, f"tid-{topic}", **{"acks": "all"})
    p.begin_transaction()
    for i in range(20):
        p.produce(topic, f"before-{i}".encode(), partition=i % 2)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, f"open-{i}".encode(), partition=i % 2)
    assert p.flush(10) == 0
    rokka.kill()
    rokka.start()
    assert sorted(read_all(rokka, topic, 2, "read_committed", expect=20)) == sorted(f"before-{i}" for i in range(20))
    # The producer carries on once it has reconnected; the commit needs the
    # restarted coordinator to know the open transaction and its partitions.
    p.commit_transaction(60)
    want = sorted([f"before-{i}" for i in range(20)] + [f"open-{i}" for i in range(10)])
    assert sorted(read_all(rokka, topic, 2, "read_committed", expect=30)) == want


def test_describe_producers_shows_the_open_transaction(rokka):
    """kafka-python's describe_producers (DescribeProducers): the
    transactional producer on the partition and where its open transaction
    began — what `kafka-transactions.sh find-hanging` reads."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP

    topic = new_topic(rokka, partitions=1)
    p = txn_producer(rokka, f"tid-{topic}")
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, f"c{i}".encode(), partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic, b"open", partition=0)
    p.flush(10)
    k = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    try:
        state = k.describe_producers([KTP(topic, 0)])[KTP(topic, 0)]
        producers = list(state.active_producers)
        assert len(producers) == 1, state
        pr = producers[0]
        # Three records and the COMMIT marker came first: the open one starts at 4.
        assert pr.current_transaction_start_offset == 4, pr
        assert pr.last_sequence >= 3 and pr.producer_epoch >= 0, pr
        p.commit_transaction(30)
        state = k.describe_producers([KTP(topic, 0)])[KTP(topic, 0)]
        assert [x.current_transaction_start_offset for x in state.active_producers] == [-1], state
    finally:
        k.close()


def test_a_consumer_waits_for_offsets_an_open_transaction_holds(rokka):
    """KIP-447: librdkafka's read_committed consumer asks OffsetFetch for
    stable offsets. While a transaction holds offsets of the group's
    partition (sent to it, not yet committed), the broker answers
    UNSTABLE_OFFSET_COMMIT and the consumer retries instead of starting from
    the offset before the transaction — where it would process again what
    the transaction consumed (duplicates under exactly-once)."""
    import threading

    src = new_topic(rokka, partitions=1)
    fill(rokka, src, 20)
    group = f"stable-{src}"
    # Group metadata without membership (generation -1): what a producer
    # committing for a group it does not consume from sends.
    meta = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group}).consumer_group_metadata()
    p = txn_producer(rokka, f"tid-{src}")
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(src, 0, 5)], meta, 30)
    p.commit_transaction(30)
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(src, 0, 12)], meta, 30)

    committed_at = []

    def unstable_answers():
        for line in rokka.metrics().splitlines():
            if line.startswith("rokka_kafka_offset_fetch_unstable_total "):
                return float(line.split()[1])
        return 0.0

    before = unstable_answers()

    def commit_later():
        # Once the consumer has been told to wait (however slowly it got
        # there), and a little more.
        deadline = time.time() + 30
        while unstable_answers() == before and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        committed_at.append(time.time())
        p.commit_transaction(30)

    c = group_consumer(rokka, group)
    c.subscribe([src])
    t = threading.Thread(target=commit_later)
    t.start()
    first = None
    deadline = time.time() + 40
    while first is None and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            first = (m.offset(), time.time())
    t.join()
    c.close()
    assert first is not None, "the consumer got nothing after the transaction committed"
    # Without the wait it starts at 5 (the offset before the transaction),
    # before the commit.
    assert first[0] == 12, first
    assert committed_at and first[1] >= committed_at[0], (first, committed_at)
    assert unstable_answers() > before, "the consumer was never told to wait"


def test_offsets_for_times_stops_at_what_the_isolation_level_reads(rokka):
    """ListOffsets by timestamp (librdkafka's offsets_for_times): a
    read_committed consumer is not handed an offset inside an open
    transaction (past the last stable offset: not found, -1, as Kafka's
    fetchOffsetForTimestamp); read_uncommitted finds it."""
    topic = new_topic(rokka, partitions=1)
    # Ahead of now: the COMMIT markers (stamped with the broker's clock)
    # are earlier than every record looked for.
    base = int(time.time() * 1000) + 60_000
    p = txn_producer(rokka, f"tid-{topic}")
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, f"c{i}".encode(), partition=0, timestamp=base + i)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, f"o{i}".encode(), partition=0, timestamp=base + 1000 + i)
    assert p.flush(10) == 0

    def lookup(isolation, ts):
        c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"oft-{uuid.uuid4().hex[:8]}", "isolation.level": isolation})
        try:
            return c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)[0].offset
        finally:
            c.close()

    # Three records and the COMMIT marker: the open transaction starts at 4.
    assert lookup("read_committed", base + 1) == 1
    assert lookup("read_uncommitted", base + 1000) == 4
    assert lookup("read_committed", base + 1000) == -1
    p.commit_transaction(30)
    assert lookup("read_committed", base + 1000) == 4


def test_a_batch_with_an_epoch_the_coordinator_never_gave_is_refused(rokka):
    """A transactional batch whose producer epoch is above the one the
    coordinator gave (a broken or hostile client that knows the producer
    id) is INVALID_PRODUCER_EPOCH, as Kafka's verification (KIP-890) says:
    taken, it fenced the real producer's next batches and the markers of
    its transaction, whose partition then stayed open to read_committed
    readers for good. One with the right epoch sent under another
    transactional id (the one its WRITE was checked on) is
    INVALID_PRODUCER_ID_MAPPING: not a way into another principal's
    transaction. The real producer goes on and commits."""
    import socket
    import struct

    from kafka import KafkaProducer
    from kafka.record.default_records import DefaultRecordBatchBuilder

    topic = new_topic(rokka, partitions=1)
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap, transactional_id=f"forged-{topic}")
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, b"real-1", partition=0)
    p.flush()
    pid, epoch = p._transaction_manager.producer_id_and_epoch.producer_id, p._transaction_manager.producer_id_and_epoch.epoch

    def s16(x):
        return struct.pack(">h", len(x)) + x.encode()

    def forge(tid, epoch, seq):
        """The error of a Produce v3 under `tid` of one batch of `pid`."""
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=pid,
                                      producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
        b.append(0, timestamp=int(time.time() * 1000), key=None, value=b"forged", headers=[])
        batch = bytes(b.build())
        # Produce v3: transactional_id, acks, timeout, [topic [partition records]].
        body = (s16(tid) + struct.pack(">hi", -1, 10000) + struct.pack(">i", 1) + s16(topic)
                + struct.pack(">i", 1) + struct.pack(">ii", 0, len(batch)) + batch)
        header = struct.pack(">hhi", 0, 3, 7) + s16("forger")
        frame = struct.pack(">i", len(header) + len(body)) + header + body
        host, port = rokka.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(frame)
            n = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
            resp = s.recv(n, socket.MSG_WAITALL)
        # correlation, [topic: name, [partition: index, error, ...]]
        off = 4 + 4
        tlen = struct.unpack(">h", resp[off:off + 2])[0]
        off += 2 + tlen + 4 + 4
        return struct.unpack(">h", resp[off:off + 2])[0]

    # The same producer id, its epoch plus one.
    error = forge(f"forged-{topic}", epoch + 1, 0)
    assert error == 47, f"the forged batch was answered {error}, not INVALID_PRODUCER_EPOCH"
    # The right epoch and next sequence, under another transactional id.
    error = forge(f"intruder-{topic}", epoch, 1)
    assert error == 49, f"the batch under another id was answered {error}, not INVALID_PRODUCER_ID_MAPPING"
    # The real producer is not fenced: it sends more and commits.
    p.send(topic, b"real-2", partition=0)
    p.commit_transaction()
    p.close()
    assert read_all(rokka, topic, 1, "read_committed", expect=2) == ["real-1", "real-2"]


def test_a_fenced_end_txn_is_answered_as_its_version_knows_it(rokka):
    """A zombie's EndTxn (an epoch a newer incarnation replaced) is
    PRODUCER_FENCED (90) from v2 on and INVALID_PRODUCER_EPOCH (47) before
    it, as Kafka answers (KIP-588): older clients took 90 for an unknown,
    fatal error."""
    import socket
    import struct

    from kafka import KafkaProducer

    topic = new_topic(rokka, partitions=1)
    tid = f"fenced-versions-{topic}"
    old = KafkaProducer(bootstrap_servers=rokka.bootstrap, transactional_id=tid)
    old.init_transactions()
    pe = old._transaction_manager.producer_id_and_epoch
    pid, epoch = pe.producer_id, pe.epoch
    new = KafkaProducer(bootstrap_servers=rokka.bootstrap, transactional_id=tid)
    new.init_transactions()

    def end_txn(version):
        host, port = rokka.bootstrap.rsplit(":", 1)
        client = b"fenced"
        if version >= 3:
            t = tid.encode()
            body = bytes([len(t) + 1]) + t + struct.pack(">qh?", pid, epoch, True) + b"\x00"
            header = struct.pack(">hhih", 26, version, 9, len(client)) + client + b"\x00"
        else:
            body = struct.pack(">h", len(tid)) + tid.encode() + struct.pack(">qh?", pid, epoch, True)
            header = struct.pack(">hhih", 26, version, 9, len(client)) + client
        frame = struct.pack(">i", len(header) + len(body)) + header + body
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(frame)
            n = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
            resp = s.recv(n, socket.MSG_WAITALL)
        off = 4 + (1 if version >= 3 else 0) + 4  # correlation, tagged fields, throttle
        return struct.unpack(">h", resp[off:off + 2])[0]

    assert end_txn(1) == 47
    assert end_txn(3) == 90
    new.close()
    old.close(timeout=1)
