"""A Produce batch whose header claims a max timestamp its records do not
carry (i64::MAX here): Kafka's LogValidator takes the batch's max timestamp
from its records for the time index, and so does rokka now
(`rokka_kafka_batch_max_timestamps_corrected_total`). Taken from the
header, it led every later lookup by time to that batch and made a
max-timestamp ListOffsets (librdkafka's OffsetSpec.max_timestamp) name the
forged batch's record instead of the latest one."""
import os
import socket
import struct
import sys
import time
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402
from test_hostile import kafka_frame, recv_exact  # noqa: E402
from test_names import kstr, metric  # noqa: E402


@pytest.fixture(scope="module")
def rokka():
    with running("hostile", "batch_time") as r:
        yield r


def forged_batch(ts):
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.util import calc_crc32c

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=ts, key=None, value=b"forged", headers=[])
    raw = bytearray(b.build())
    raw[35:43] = struct.pack(">q", 2**63 - 1)  # the header's max timestamp
    raw[17:21] = struct.pack(">I", calc_crc32c(bytes(raw[21:])))
    return bytes(raw)


def test_a_forged_max_timestamp_does_not_lead_lookups_by_time(rokka):
    topic = f"bt-{uuid.uuid4().hex[:8]}"
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    p.produce(topic, b"first", timestamp=now - 60_000)
    assert p.flush(10) == 0
    batch = forged_batch(now - 50_000)
    # Produce v3: transactional id (null), acks 1, timeout, one topic, one partition.
    body = struct.pack(">hhi", -1, 1, 10000) + struct.pack(">i", 1) + kstr(topic)
    body += struct.pack(">i", 1) + struct.pack(">ii", 0, len(batch)) + batch
    with socket.create_connection(("127.0.0.1", rokka.kafka_port), timeout=10) as s:
        s.sendall(kafka_frame(0, 3, body))
        n = struct.unpack(">i", recv_exact(s, 4))[0]
        resp = recv_exact(s, n)
    # correlation, topics: [name, partitions: [index, error, base offset, ...]]
    off = 4 + 4 + 2 + len(topic) + 4 + 4
    assert struct.unpack(">h", resp[off : off + 2])[0] == 0, "the batch was refused"
    p.produce(topic, b"latest", timestamp=now - 10_000)
    assert p.flush(10) == 0
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    tp = TopicPartition(topic, 0)
    got = a.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(10)
    assert (got.offset, got.timestamp) == (2, now - 10_000), (got.offset, got.timestamp)
    assert metric(rokka, "rokka_kafka_batch_max_timestamps_corrected_total") >= 1
