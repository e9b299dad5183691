"""confluent-kafka (librdkafka 2.16): producer acks, keys/headers/timestamps,
compression, assign-mode consumption, offsets, admin, seek by timestamp."""
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka.net.compat import KafkaNetClient
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder


def produce(rokka, topic, msgs, **conf):
    p = Producer({"bootstrap.servers": rokka.bootstrap, "linger.ms": 5, **conf})
    delivered = []

    def cb(err, msg):
        assert err is None, err
        delivered.append((msg.partition(), msg.offset()))

    for m in msgs:
        p.produce(topic, on_delivery=cb, **m)
    assert p.flush(30) == 0
    return delivered


def consume_all(rokka, topic, partitions, n, group="g-assign", start=0):
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(topic, p, start) for p in partitions])
    got = []
    deadline = time.time() + 30
    while len(got) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    c.close()
    return got


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(rokka, topic, acks):
    msgs = [{"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in range(200)]
    delivered = produce(rokka, topic, msgs, acks=acks)
    assert len(delivered) == 200
    got = consume_all(rokka, topic, [0], 200)
    assert [(m.key(), m.value()) for m in got] == [(m["key"], m["value"]) for m in msgs]
    assert [m.offset() for m in got] == list(range(200))


def test_acks_other_than_minus_one_zero_one_are_refused(rokka, topic):
    # librdkafka takes acks up to 1000 and leaves the check to the broker:
    # Kafka answers INVALID_REQUIRED_ACKS and stores nothing.
    errors = []
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "2", "message.timeout.ms": 15000, "retries": 0})
    for i in range(3):
        p.produce(topic, value=f"v{i}".encode(), partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert len(errors) == 3 and all(e is not None and e.code() == KafkaError.INVALID_REQUIRED_ACKS for e in errors), errors
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "g-acks2"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()
    assert (low, high) == (0, 0)


def test_keys_headers_timestamps_byte_exact(rokka, topic):
    msgs = [
        {
            "key": bytes([i, 0, 255 - i]),
            "value": bytes(range(256)) * (i + 1),
            "headers": [("h", bytes([i])), ("empty", b""), ("dup", b"1"), ("dup", b"2")],
            "timestamp": 1_600_000_000_000 + i,
        }
        for i in range(20)
    ]
    assert len(produce(rokka, topic, msgs)) == 20
    got = consume_all(rokka, topic, [0], 20)
    # Every message once and in order: a lost or repeated one breaks the sequence.
    assert [m.offset() for m in got] == list(range(20)), f"{len(got)} of 20 delivered"
    for m, want in zip(got, msgs, strict=True):
        assert m.key() == want["key"]
        assert m.value() == want["value"]
        assert m.headers() == want["headers"]
        assert m.timestamp()[1] == want["timestamp"]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression(rokka, topic, codec):
    msgs = [{"value": (f"{codec} message {i} " * 20).encode()} for i in range(500)]
    produce(rokka, topic, msgs, **{"compression.codec": codec, "linger.ms": 50})
    got = consume_all(rokka, topic, [0], 500)
    assert [m.value() for m in got] == [m["value"] for m in msgs]


def test_admin_create_partitions_delete(rokka, topic):
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(10)
    md = a.list_topics(topic, timeout=10)
    assert len(md.topics[topic].partitions) == 3
    with pytest.raises(Exception) as e:
        a.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(10)
    assert e.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    a.create_partitions([NewPartitions(topic, 5)])[topic].result(10)
    assert len(a.list_topics(topic, timeout=10).topics[topic].partitions) == 5
    produce(rokka, topic, [{"value": b"x", "partition": 4}])
    a.delete_topics([topic])[topic].result(10)
    assert topic not in a.list_topics(timeout=10).topics


def test_partitions_and_watermarks(rokka, topic):
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])[topic].result(10)
    msgs = [{"value": f"{i}".encode(), "partition": i % 4} for i in range(400)]
    produce(rokka, topic, msgs)
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "wm"})
    for p in range(4):
        assert c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) == (0, 100)
    c.close()
    got = consume_all(rokka, topic, range(4), 400)
    assert sorted(int(m.value()) for m in got) == list(range(400))
    for m in got:
        assert int(m.value()) % 4 == m.partition()


def test_commit_and_fetch_offsets(rokka, topic):
    produce(rokka, topic, [{"value": b"x"}] * 10)
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"commit-{topic}", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
    got = c.committed([TopicPartition(topic, 0)], timeout=10)
    assert got[0].offset == 7
    # OffsetCommit v6+ carries the leader epoch of the record consumed last;
    # OffsetFetch gives it back (librdkafka validates positions with it).
    c.commit(offsets=[TopicPartition(topic, 0, 8, leader_epoch=0)], asynchronous=False)
    got = c.committed([TopicPartition(topic, 0)], timeout=10)
    assert (got[0].offset, got[0].leader_epoch) == (8, 0)
    c.commit(offsets=[TopicPartition(topic, 0, 9)], asynchronous=False)
    got = c.committed([TopicPartition(topic, 0)], timeout=10)
    assert (got[0].offset, got[0].leader_epoch) == (9, None)
    c.close()


def test_seek_by_timestamp(rokka, topic):
    base = 1_700_000_000_000
    produce(rokka, topic, [{"value": f"{i}".encode(), "timestamp": base + i * 1000} for i in range(50)], **{"linger.ms": 100})
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "ts"})
    res = c.offsets_for_times([TopicPartition(topic, 0, base + 20_500)], timeout=10)
    assert res[0].offset == 21
    res = c.offsets_for_times([TopicPartition(topic, 0, base + 10**9)], timeout=10)
    assert res[0].offset == -1
    c.close()


def test_long_poll_wakes_on_produce(rokka, topic):
    produce(rokka, topic, [{"value": b"first"}])
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "lp", "fetch.wait.max.ms": 5000})
    c.assign([TopicPartition(topic, 0, 1)])
    c.poll(0.5)
    t0 = time.time()
    produce(rokka, topic, [{"value": b"second"}])
    m = None
    while m is None and time.time() - t0 < 10:
        m = c.poll(0.1)
    assert m is not None and m.value() == b"second"
    # Woken by the append, not by the 5 s max wait.
    assert time.time() - t0 < 3
    c.close()


def metric_values(rokka):
    """{'name{labels}': value} of every sample rokka exports."""
    out = {}
    for line in rokka.metrics().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def metric_delta(before, after, prefix):
    """How much the samples whose key starts with `prefix` grew."""
    keys = {k for k in (*before, *after) if k.startswith(prefix)}
    return sum(after.get(k, 0) - before.get(k, 0) for k in keys)


class RawClient:
    """kafka-python's network client, for requests as a producer's retry sends them."""

    def __init__(self, rokka):
        self.c = KafkaNetClient(bootstrap_servers=rokka.bootstrap)
        self.c.check_version()
        self.node = self.c.least_loaded_node()

    def request(self, req):
        return self.c.send_and_receive(self.node, req, timeout_ms=10000)

    def init_producer_id(self):
        r = self.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000, max_version=2))
        assert r.error_code == 0, r
        return r.producer_id, r.producer_epoch

    def produce(self, topic, batch):
        T = ProduceRequest.TopicProduceData
        req = ProduceRequest(
            acks=-1,
            timeout_ms=10000,
            topic_data=[T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=batch)])],
            max_version=7,
        )
        p = self.request(req).responses[0].partition_responses[0]
        return p.error_code, p.base_offset

    def batches(self, topic):
        """Every record batch of partition 0 as stored: (base offset, record count, producer id, epoch, base sequence, values)."""
        T = FetchRequest.FetchTopic
        out, offset, high = [], 0, None
        while high is None or offset < high:
            req = FetchRequest(
                replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1 << 22, isolation_level=0,
                topics=[T(topic=topic, partitions=[T.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 22)])],
                max_version=10,
            )
            p = self.request(req).responses[0].partitions[0]
            assert p.error_code == 0, p
            high = p.high_watermark
            records = MemoryRecords(p.records)
            start = offset
            while (b := records.next_batch()) is not None:
                values = [r.value for r in b]
                out.append((b.base_offset, len(values), b.producer_id, b.producer_epoch, b.base_sequence, values))
                offset = b.base_offset + b.last_offset_delta + 1
            assert offset > start, f"no batch at offset {offset} below the high watermark {high}"
        return out

    def close(self):
        self.c.close()


def idempotent_batch(pid, epoch, seq, values):
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for v in values:
        b.append(timestamp=None, key=None, value=v)
    b.close()
    return bytes(b.buffer())


def test_idempotent_producer(rokka, topic):
    before = metric_values(rokka)
    msgs = [{"key": f"{i}".encode(), "value": f"v{i}".encode()} for i in range(2000)]
    delivered = produce(rokka, topic, msgs, **{"enable.idempotence": True, "linger.ms": 1, "batch.num.messages": 50})
    assert sorted(o for _, o in delivered) == list(range(2000))
    got = consume_all(rokka, topic, [0], 2000)
    assert [m.value() for m in got] == [m["value"] for m in msgs]
    after = metric_values(rokka)
    # librdkafka asked for a producer id, and no batch was refused (an
    # out-of-order sequence or a fenced epoch would be a Produce error).
    assert metric_delta(before, after, 'rokka_kafka_requests_total{api="InitProducerId"}') >= 1
    assert metric_delta(before, after, 'rokka_kafka_errors_total{api="Produce"') == 0
    # What is stored: every batch carries that producer id and epoch, and the
    # sequences run 0..1999 without a gap or an overlap, one record per offset.
    raw = RawClient(rokka)
    try:
        batches = raw.batches(topic)
    finally:
        raw.close()
    assert len(batches) > 1, "librdkafka sent several batches (batch.num.messages = 50)"
    assert len({(pid, epoch) for _, _, pid, epoch, _, _ in batches}) == 1
    pid, epoch = batches[0][2], batches[0][3]
    assert pid >= 0 and epoch >= 0, "an idempotent producer's batches carry its producer id"
    expected = 0
    for base, n, _, _, seq, _ in batches:
        assert (base, seq) == (expected, expected), batches
        expected += n
    assert expected == 2000
    assert [v for *_, values in batches for v in values] == [m["value"] for m in msgs]


def test_idempotent_retry_is_acknowledged_not_appended(rokka, topic):
    """A producer's retry of a batch Rokka already has (the ack was lost) gets
    the original offset and is not stored twice; a gap in sequences is refused."""
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(10)
    raw = RawClient(rokka)
    try:
        pid, epoch = raw.init_producer_id()
        assert pid >= 0 and epoch == 0
        before = metric_values(rokka)
        first = idempotent_batch(pid, epoch, 0, [b"a0", b"a1", b"a2"])
        assert raw.produce(topic, first) == (0, 0)
        assert raw.produce(topic, first) == (0, 0), "a retry is acknowledged with its first offset"
        mid = metric_values(rokka)
        assert metric_delta(before, mid, "rokka_kafka_duplicate_batches_total") == 1
        # Sequences 3 and 4 never arrived: 5 is out of order.
        assert raw.produce(topic, idempotent_batch(pid, epoch, 5, [b"gap"]))[0] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
        assert raw.produce(topic, idempotent_batch(pid, epoch, 3, [b"b3", b"b4"])) == (0, 3)
        after = metric_values(rokka)
        assert metric_delta(mid, after, 'rokka_kafka_errors_total{api="Produce",code="45"}') == 1
        stored = raw.batches(topic)
    finally:
        raw.close()
    assert [(base, n, p, seq) for base, n, p, _, seq, _ in stored] == [(0, 3, pid, 0), (3, 2, pid, 3)]
    assert [v for *_, values in stored for v in values] == [b"a0", b"a1", b"a2", b"b3", b"b4"]


def test_offset_commit_to_a_group_the_coordinator_does_not_hold(rokka, topic):
    """OffsetCommit as Kafka's coordinator answers it for a group it does
    not hold (expired, deleted, lost with a coordinator): a generation is an
    older one — ILLEGAL_GENERATION, the consumer rejoins —; none, with no
    member id, is a standalone consumer or an admin, and is taken."""
    from kafka.protocol.consumer import OffsetCommitRequest

    admin = AdminClient({"bootstrap.servers": rokka.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    raw = RawClient(rokka)
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    group = f"gone-{topic}"

    def commit(member, generation, version=7):
        req = OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=generation, member_id=member, retention_time_ms=-1,
            topics=[T(name=topic, partitions=[T.OffsetCommitRequestPartition(partition_index=0, committed_offset=3, committed_metadata="")])],
            max_version=version,
        )
        return raw.request(req).topics[0].partitions[0].error_code

    try:
        assert commit("consumer-1-abc", 5) == 22  # ILLEGAL_GENERATION
        # v9 (KIP-848 consumers): a member epoch for a group not held.
        assert commit("consumer-1-abc", 5, version=9) == 69  # GROUP_ID_NOT_FOUND
        assert commit("", -1) == 0
    finally:
        raw.close()
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group})
    try:
        assert c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 3
    finally:
        c.close()


def test_a_committed_offset_past_an_empty_partition_resets_at_once(rokka, topic):
    """A group's committed offset past the end of a partition nothing was
    written to yet (a seek, offsets carried over): the fetch is
    OFFSET_OUT_OF_RANGE at once, as Kafka's log read answers, so
    `auto.offset.reset=latest` resets to the empty partition's end (0) and
    the records produced afterwards are all consumed — not found out of
    range only once they arrive and skipped by the reset."""
    admin = AdminClient({"bootstrap.servers": rokka.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    group = f"past-{topic}"
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    c.close()
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": group,
            "auto.offset.reset": "latest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        c.subscribe([topic])
        deadline = time.time() + 20
        while time.time() < deadline and not c.assignment():
            c.poll(0.2)
        # Let the fetcher reach the partition (and reset) before producing.
        end = time.time() + 3
        while time.time() < end:
            c.poll(0.2)
        p = Producer({"bootstrap.servers": rokka.bootstrap})
        for i in range(3):
            p.produce(topic, f"m{i}".encode(), partition=0)
        assert p.flush(10) == 0
        got = []
        deadline = time.time() + 20
        while time.time() < deadline and len(got) < 3:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
        assert got == [b"m0", b"m1", b"m2"], got
    finally:
        c.close()


def test_a_deleted_topics_committed_offsets_go_with_it(rokka, topic):
    """Deleting a topic drops every group's committed offsets of it (as
    Kafka's coordinator does): a topic made again under the name does not
    start its groups at the old topic's offsets."""
    admin = AdminClient({"bootstrap.servers": rokka.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(10)
    group = f"del-{topic}"
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 7), TopicPartition(topic, 1, 9)], asynchronous=False)
        got = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        assert [tp.offset for tp in got] == [7, 9]
        admin.delete_topics([topic])[topic].result(10)
        time.sleep(0.5)
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(10)
        got = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        assert [tp.offset for tp in got] == [-1001, -1001], got  # OFFSET_INVALID: nothing committed
    finally:
        c.close()


def test_offsets_for_times_on_a_log_append_time_topic(rokka, topic):
    """On a topic with message.timestamp.type=LogAppendTime every record
    carries the batch's append time, whatever create time the producer
    set: a time lookup finds the batch appended at or after it (its first
    offset, with the append time), as Kafka answers — not by the create
    times it was sent with."""
    admin = AdminClient({"bootstrap.servers": rokka.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"message.timestamp.type": "LogAppendTime"})])[topic].result(10)
    before = int(time.time() * 1000) - 5000
    p = Producer({"bootstrap.servers": rokka.bootstrap, "linger.ms": 50})
    for i in range(5):
        p.produce(topic, f"old-{i}".encode(), partition=0, timestamp=1_000 + i)
    assert p.flush(10) == 0
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"lat-{topic}"})
    try:
        found = c.offsets_for_times([TopicPartition(topic, 0, before)], timeout=10)
        assert found[0].offset == 0, found
        c.assign([TopicPartition(topic, 0, 0)])
        m = None
        deadline = time.time() + 10
        while m is None and time.time() < deadline:
            m = c.poll(0.5)
        assert m is not None and m.error() is None
        kind, ts = m.timestamp()
        assert kind == 2 and ts >= before, (kind, ts)  # TIMESTAMP_LOG_APPEND_TIME
    finally:
        c.close()


def test_admin_answers_as_kafka_for_existing_compacted_and_unknown(rokka, topic):
    """Admin requests answered as Kafka's controller and partition leader do
    (librdkafka's admin, kafka-python's protocol classes):
    - CreateTopics of a topic that exists is TOPIC_ALREADY_EXISTS whatever
      replication factor it asks (create-or-find tools count on it; this
      single node would refuse 3 replicas otherwise);
    - DeleteRecords on a topic whose cleanup.policy is compact only is
      POLICY_VIOLATION, its records kept;
    - ElectLeaders for all partitions lists none (none needs an election),
      so the call as a whole succeeds;
    - DeleteTopics v6 by an unknown topic id answers UNKNOWN_TOPIC_ID with
      that id."""
    import uuid

    from confluent_kafka import ElectionType
    from kafka.protocol.admin import DeleteTopicsRequest

    admin = AdminClient({"bootstrap.servers": rokka.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    err = None
    try:
        admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(10)
    except Exception as e:  # noqa: BLE001 - the future's KafkaException
        err = e.args[0]
    assert err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS, err
    compacted = topic + "-c"
    admin.create_topics([NewTopic(compacted, 1, 1, config={"cleanup.policy": "compact"})])[compacted].result(10)
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for i in range(3):
        p.produce(compacted, key=f"k{i}".encode(), value=b"v", partition=0)
    assert p.flush(10) == 0
    err = None
    try:
        admin.delete_records([TopicPartition(compacted, 0, 2)])[TopicPartition(compacted, 0)].result(10)
    except Exception as e:  # noqa: BLE001
        err = e.args[0]
    assert err is not None and err.code() == KafkaError.POLICY_VIOLATION, err
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"lo-{topic}"})
    assert c.get_watermark_offsets(TopicPartition(compacted, 0), timeout=10)[0] == 0, "nothing deleted"
    c.close()
    assert admin.elect_leaders(ElectionType.PREFERRED, None).result(10) == {}
    raw = RawClient(rokka)
    try:
        gone = uuid.uuid4()
        T = DeleteTopicsRequest.DeleteTopicState
        r = raw.request(DeleteTopicsRequest(topics=[T(name=None, topic_id=gone)], timeout_ms=10000, min_version=6, max_version=6))
        assert [(x.topic_id, x.error_code) for x in r.responses] == [(gone, 100)], r  # UNKNOWN_TOPIC_ID
    finally:
        raw.close()


def test_authorized_operations_are_answered_when_asked(rokka, topic):
    """DescribeCluster, Metadata (describe_topics) and DescribeGroups with
    include_authorized_operations answer the operations the caller may do
    (all of the resource type's with authorization off, as Kafka's
    AuthHelper) — UIs show or hide what they offer by them; not null."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation

    admin = AdminClient({"bootstrap.servers": rokka.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(10)
    assert set(cluster.authorized_operations or []) >= {AclOperation.DESCRIBE, AclOperation.ALTER, AclOperation.CREATE}, cluster
    t = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)[topic].result(10)
    assert set(t.authorized_operations or []) >= {AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE}, t
    group = f"ops-{topic}"
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    c.close()
    g = admin.describe_consumer_groups([group], include_authorized_operations=True)[group].result(10)
    assert set(g.authorized_operations or []) == {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}, g


def test_a_time_lookup_never_answers_below_the_log_start(rokka, topic):
    """DeleteRecords may move the log start into the middle of a batch: a
    lookup by a time before it, or of the highest time, answers the first
    record still there, never a deleted one (a consumer seeking there got
    OFFSET_OUT_OF_RANGE and, with auto.offset.reset=latest, skipped the
    partition's records)."""
    admin = AdminClient({"bootstrap.servers": rokka.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    base = int(time.time() * 1000) - 60_000
    p = Producer({"bootstrap.servers": rokka.bootstrap, "linger.ms": 200})
    for i in range(10):
        # Times fall, so the highest is the first (deleted) record's.
        p.produce(topic, f"r-{i}".encode(), partition=0, timestamp=base + 1000 - i)
    assert p.flush(10) == 0
    admin.delete_records([TopicPartition(topic, 0, 5)])[TopicPartition(topic, 0)].result(10)
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"ls-{topic}"})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (5, 10)
        found = c.offsets_for_times([TopicPartition(topic, 0, base)], timeout=10)
        assert found[0].offset == 5, found
        found = c.offsets_for_times([TopicPartition(topic, 0, -3)], timeout=10)  # MAX_TIMESTAMP
        assert found[0].offset == 5, found
    finally:
        c.close()
