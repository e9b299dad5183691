"""A client that commits offsets with as much metadata as it may
(`kafka.max_offset_metadata_bytes`) on many partitions: the committed-offset
table, held in memory, stops growing at `store.max_committed_offset_bytes`.
librdkafka's commits past the budget are refused with Kafka's
INVALID_COMMIT_OFFSET_SIZE, commits that do not grow the table still go,
and the gauge shows the size within the budget."""
import os
import sys
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402

BUDGET = 32 * 1024
META = "m" * 4000


@pytest.fixture(scope="module")
def rokka():
    with running("hostile", "offset_bytes", store_extra=f"max_committed_offset_bytes = {BUDGET}") as r:
        yield r


def gauge(rokka, name):
    for line in rokka.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_commits_stop_growing_the_table_at_its_byte_budget(rokka):
    topic = f"ob-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": rokka.bootstrap})
    admin.create_topics([NewTopic(topic, 32, 1)])[topic].result(10)
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False})
    try:
        taken = []
        for p in range(32):
            try:
                res = c.commit(offsets=[TopicPartition(topic, p, 1, metadata=META)], asynchronous=False)
                assert res[0].error is None, res
                taken.append(p)
            except KafkaException as e:
                assert e.args[0].code() == KafkaError.INVALID_COMMIT_OFFSET_SIZE, e
        # About BUDGET / (4000 + names + 128) entries fit, no more.
        assert 4 <= len(taken) <= BUDGET // 4000, taken
        assert gauge(rokka, "rokka_committed_offsets_bytes") <= BUDGET
        # A commit that does not grow the table (same metadata, a new
        # offset) still goes; its offset moves.
        res = c.commit(offsets=[TopicPartition(topic, taken[0], 7, metadata=META)], asynchronous=False)
        assert res[0].error is None, res
        got = c.committed([TopicPartition(topic, p) for p in range(32)], timeout=10)
        assert [t.partition for t in got if t.offset >= 0] == taken
        assert got[taken[0]].offset == 7
    finally:
        c.close()
