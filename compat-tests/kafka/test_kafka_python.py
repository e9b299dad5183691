"""kafka-python 3.0: producer/consumer without groups, compression,
offsets_for_times, admin."""
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic


def test_produce_consume_keys_headers(rokka, topic):
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap, acks="all")
    futs = [
        p.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), headers=[("h", str(i).encode())], timestamp_ms=1_650_000_000_000 + i)
        for i in range(100)
    ]
    offs = [f.get(timeout=10).offset for f in futs]
    assert offs == list(range(100))
    p.close()
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=None, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    c.assign([TopicPartition(topic, 0)])
    got = list(c)
    c.close()
    assert [(m.key, m.value, m.offset) for m in got] == [(f"k{i}".encode(), f"v{i}".encode(), i) for i in range(100)]
    assert [m.headers for m in got] == [[("h", str(i).encode())] for i in range(100)]
    assert [m.timestamp for m in got] == [1_650_000_000_000 + i for i in range(100)]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression(rokka, topic, codec):
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap, compression_type=codec, linger_ms=20)
    for i in range(300):
        p.send(topic, f"{codec}-{i}".encode())
    p.flush(30)
    p.close()
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=None, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    c.assign([TopicPartition(topic, 0)])
    got = [m.value for m in c]
    c.close()
    assert got == [f"{codec}-{i}".encode() for i in range(300)]


def test_offsets_for_times_and_end_offsets(rokka, topic):
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap)
    base = 1_700_000_000_000
    for i in range(30):
        p.send(topic, b"x", timestamp_ms=base + i * 10)
    p.flush(10)
    p.close()
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=None)
    tp = TopicPartition(topic, 0)
    assert c.end_offsets([tp])[tp] == 30
    assert c.beginning_offsets([tp])[tp] == 0
    assert c.offsets_for_times({tp: base + 105})[tp].offset == 11
    c.close()


def test_admin_create_and_delete(rokka, topic):
    a = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    a.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    assert topic in a.list_topics()
    a.delete_topics([topic])
    deadline = time.time() + 5
    while topic in a.list_topics() and time.time() < deadline:
        time.sleep(0.1)
    assert topic not in a.list_topics()
    a.close()


def test_offset_metadata_is_bounded(rokka, topic):
    """Kafka's offset.metadata.max.bytes (4096): a longer metadata string is
    refused with OFFSET_METADATA_TOO_LARGE and nothing is stored."""
    from kafka.errors import OffsetMetadataTooLargeError
    from kafka.structs import OffsetAndMetadata

    admin = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    admin.close()
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=f"{topic}-g", enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    with pytest.raises(OffsetMetadataTooLargeError):
        c.commit({tp: OffsetAndMetadata(3, "m" * 4097, -1)})
    c.commit({tp: OffsetAndMetadata(2, "m" * 4096, -1)})
    assert c.committed(tp) == 2
    c.close()


def test_api_version_inference_finds_kafka_4(rokka, topic):
    """kafka-python with api_version unset infers the broker's release from
    the versions ApiVersions lists: Rokka answers as a Kafka 4.x broker."""
    c = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=None)
    try:
        assert c.config["api_version"][:1] == (4,), c.config["api_version"]
        # And the newest ListOffsets it then speaks works.
        p = KafkaProducer(bootstrap_servers=rokka.bootstrap)
        p.send(topic, b"x").get(timeout=10)
        p.close()
        tp = TopicPartition(topic, 0)
        assert c.end_offsets([tp])[tp] == 1
        assert c.beginning_offsets([tp])[tp] == 0
    finally:
        c.close()


def test_offset_for_leader_epoch(rokka, topic):
    """KIP-320: the end offset of leader epoch 0 (a partition's only epoch)
    is the log end; a later epoch is undefined; a client whose current epoch
    is newer than the broker's gets UNKNOWN_LEADER_EPOCH. kafka-python's
    consumer validates a committed position with it."""
    from kafka.net.compat import KafkaNetClient
    from kafka.protocol.consumer import OffsetForLeaderEpochRequest
    from kafka.structs import OffsetAndMetadata

    p = KafkaProducer(bootstrap_servers=rokka.bootstrap)
    for i in range(5):
        p.send(topic, f"e{i}".encode(), partition=0).get(timeout=10)
    p.close()
    c = KafkaNetClient(bootstrap_servers=rokka.bootstrap)
    try:
        c.check_version()
        node = c.least_loaded_node()
        T = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
        P = T.OffsetForLeaderPartition

        def ask(current, epoch):
            req = OffsetForLeaderEpochRequest(
                replica_id=-1,
                topics=[T(topic=topic, partitions=[P(partition=0, current_leader_epoch=current, leader_epoch=epoch)])],
                max_version=4,
            )
            r = c.send_and_receive(node, req, timeout_ms=10000).topics[0].partitions[0]
            return r.error_code, r.leader_epoch, r.end_offset

        assert ask(-1, 0) == (0, 0, 5)
        assert ask(0, 0) == (0, 0, 5)
        assert ask(-1, 7) == (0, -1, -1)
        assert ask(3, 0)[0] == 75  # UNKNOWN_LEADER_EPOCH
    finally:
        c.close()
    # A consumer resuming from an offset committed with leader epoch 0.
    group = f"olep-{topic}"
    k = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=group, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    k.assign([tp])
    k.commit({tp: OffsetAndMetadata(3, "", 0)})
    k.close()
    k = KafkaConsumer(bootstrap_servers=rokka.bootstrap, group_id=group, enable_auto_commit=False, consumer_timeout_ms=4000)
    k.assign([tp])
    got = [m.value for m in k]
    k.close()
    assert got == [b"e3", b"e4"]


def test_incremental_fetch_sessions(rokka, topic):
    """KIP-227 through kafka-python's protocol classes: a full fetch opens a
    session; incremental fetches carry only partitions with something new;
    a wrong epoch and an unknown session are refused; forgotten partitions
    leave the session."""
    from kafka.admin import KafkaAdminClient as Admin, NewTopic as NT
    from kafka.net.compat import KafkaNetClient
    from kafka.protocol.consumer import FetchRequest

    a = Admin(bootstrap_servers=rokka.bootstrap)
    a.create_topics([NT(topic, 2, 1)])
    a.close()
    c = KafkaNetClient(bootstrap_servers=rokka.bootstrap)
    try:
        c.check_version()
        node = c.least_loaded_node()
        T = FetchRequest.FetchTopic
        P = T.FetchPartition
        F = FetchRequest.ForgottenTopic

        def fetch(session_id, epoch, parts, forgotten=()):
            req = FetchRequest(
                replica_id=-1, max_wait_ms=50, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                session_id=session_id, session_epoch=epoch,
                topics=[T(topic=topic, partitions=[P(partition=p, fetch_offset=o, partition_max_bytes=1 << 20) for p, o in parts])] if parts else [],
                forgotten_topics_data=[F(topic=topic, partitions=list(forgotten))] if forgotten else [],
                rack_id="",
                max_version=12,
            )
            r = c.send_and_receive(node, req, timeout_ms=10000)
            got = {p.partition_index: len(p.records or b"") for t in r.responses for p in t.partitions}
            return r.error_code, r.session_id, got

        err, sid, got = fetch(0, 0, [(0, 0), (1, 0)])
        assert err == 0 and sid != 0 and sorted(got) == [0, 1], (err, sid, got)
        assert fetch(sid, 1, [])[2] == {}, "nothing new: no partition"
        p = KafkaProducer(bootstrap_servers=rokka.bootstrap)
        for i in range(3):
            p.send(topic, f"s{i}".encode(), partition=0).get(timeout=10)
        p.close()
        err, _, got = fetch(sid, 2, [])
        assert err == 0 and list(got) == [0] and got[0] > 0, got
        assert fetch(sid, 2, [])[0] == 71, "a replayed epoch"
        assert fetch(sid + 1000, 1, [])[0] == 70, "an unknown session"
        # p0 forgotten: its data no longer comes; p1 still tracked.
        err, _, got = fetch(sid, 3, [], forgotten=[0])
        assert err == 0 and got == {}, got
        # Epoch -1 closes the session.
        assert fetch(sid, -1, [(0, 0)])[1] == 0
        assert fetch(sid, 4, [])[0] == 70
    finally:
        c.close()


def test_api_versions_features_block(rokka, topic):
    """ApiVersions v3+ carries the feature levels Rokka implements, as a
    Kafka 4 broker's does: group.version 1 (the KIP-848 consumer protocol)
    and transaction.version 0 (no KIP-890 server-side verification) — told
    as Kafka tells each version (KAFKA-17011): before v4 no range starts at
    0 (Java clients from 3.3 until that fix refuse one and never get a
    ready connection) and a feature whose range is only 0 is left out; a
    finalized level 0 (the feature off) is never sent."""
    from kafka.net.compat import KafkaNetClient
    from kafka.protocol.metadata import ApiVersionsRequest

    c = KafkaNetClient(bootstrap_servers=rokka.bootstrap)
    seen = {}
    try:
        c.check_version()
        node = c.least_loaded_node()
        for v in (3, 4):
            req = ApiVersionsRequest(client_software_name="compat", client_software_version="1", min_version=v, max_version=v)
            r = c.send_and_receive(node, req, timeout_ms=10000)
            assert r.error_code == 0, r
            seen[v] = (
                {f.name: (f.min_version, f.max_version) for f in r.supported_features},
                {f.name: (f.min_version_level, f.max_version_level) for f in r.finalized_features},
            )
    finally:
        c.close()
    assert seen[3][0] == {"group.version": (1, 1)}, seen[3]
    assert seen[4][0] == {"group.version": (0, 1), "transaction.version": (0, 0)}, seen[4]
    assert seen[3][1] == seen[4][1] == {"group.version": (1, 1)}


def test_a_fetch_session_takes_turns_among_partitions_with_a_backlog(rokka, topic):
    """KIP-227 as Kafka's IncrementalFetchContext: a partition an
    incremental answer carried records of goes to the end of the session's
    order, so when each answer has room for one partition's records
    (max_bytes 1: the first batch only), the partitions with a backlog take
    turns — the first one does not starve the rest. Through kafka-python's
    protocol classes."""
    from kafka.admin import KafkaAdminClient as Admin, NewTopic as NT
    from kafka.net.compat import KafkaNetClient
    from kafka.protocol.consumer import FetchRequest

    a = Admin(bootstrap_servers=rokka.bootstrap)
    a.create_topics([NT(topic, 3, 1)])
    a.close()
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap)
    for part in range(3):
        for i in range(3):
            p.send(topic, f"p{part}-{i}".encode(), partition=part).get(timeout=10)
    p.close()
    c = KafkaNetClient(bootstrap_servers=rokka.bootstrap)
    try:
        c.check_version()
        node = c.least_loaded_node()
        T = FetchRequest.FetchTopic
        P = T.FetchPartition

        def fetch(session_id, epoch, parts):
            req = FetchRequest(
                replica_id=-1, max_wait_ms=50, min_bytes=0, max_bytes=1, isolation_level=0,
                session_id=session_id, session_epoch=epoch,
                topics=[T(topic=topic, partitions=[P(partition=p, fetch_offset=0, partition_max_bytes=1 << 20) for p in parts])] if parts else [],
                forgotten_topics_data=[],
                rack_id="",
                max_version=12,
            )
            r = c.send_and_receive(node, req, timeout_ms=10000)
            served = [p.partition_index for t in r.responses for p in t.partitions if p.records]
            return r.error_code, r.session_id, served

        err, sid, served = fetch(0, 0, [0, 1, 2])
        assert err == 0 and sid != 0 and served == [0], (err, sid, served)
        turns = [fetch(sid, e, [])[2] for e in range(1, 7)]
    finally:
        c.close()
    # A full answer does not reorder; then each incremental answer serves
    # the partition that waited longest.
    assert turns == [[0], [1], [2], [0], [1], [2]], turns


def test_a_zstd_topic_is_refused_to_a_fetch_version_without_zstd(rokka, topic):
    """A topic whose compression.type is zstd, fetched by a client speaking
    Kafka 2.0's versions (Fetch v8, before zstd): UNSUPPORTED_COMPRESSION_TYPE,
    as Kafka answers; the same client at its own versions reads it."""
    from kafka.errors import UnsupportedCompressionTypeError

    admin = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"compression.type": "zstd"})])
    admin.close()
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap)
    p.send(topic, b"z").get(10)
    p.close()
    old = KafkaConsumer(bootstrap_servers=rokka.bootstrap, api_version=(2, 0, 0))
    try:
        old.assign([TopicPartition(topic, 0)])
        old.seek(TopicPartition(topic, 0), 0)
        with pytest.raises(UnsupportedCompressionTypeError):
            deadline = time.time() + 10
            while time.time() < deadline:
                old.poll(500)
    finally:
        old.close()
    new = KafkaConsumer(bootstrap_servers=rokka.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    new.assign([TopicPartition(topic, 0)])
    assert [m.value for m in new] == [b"z"]
    new.close()
