"""CreateTopics with the set's replication factor, and DeleteRecords in
cluster mode: the log start a Kafka admin moves on the
master goes to the replica with the replication stream, so after the
master's kill -9 the new master's partition still starts there (deleted
records do not come back) and a consumer from the beginning reads only
what was kept."""
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import Cluster

TOPIC = "purged"


def test_deleted_records_stay_deleted_after_a_failover():
    cluster = Cluster("delete-records", n=2, min_isr=2)
    try:
        assert cluster.wait_in_sync(size=2)
        a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
        # A partition's replicas are its set's two members: a factor of 2
        # is what it has, 3 is more than there are (Kafka's refusal).
        with pytest.raises(KafkaException) as e:
            a.create_topics([NewTopic(f"{TOPIC}-3", 1, 3)])[f"{TOPIC}-3"].result(30)
        assert e.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
        for f in a.create_topics([NewTopic(TOPIC, 1, 2)]).values():
            f.result(30)
        p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all"})
        for i in range(20):
            p.produce(TOPIC, value=str(i).encode())
        assert p.flush(30) == 0
        tp = TopicPartition(TOPIC, 0, 12)
        assert a.delete_records([tp])[tp].result(30).low_watermark == 12
        # Answered once the in-sync replica has taken the new start (as
        # Kafka's DelayedDeleteRecords waits for its followers): the master
        # killed at once, the start is there.
        m = cluster.master()
        cluster.nodes[m].kill()
        new = cluster.master(timeout=30, exclude=(m,))
        c = Consumer({"bootstrap.servers": cluster.nodes[new].bootstrap, "group.id": "purged",
                      "auto.offset.reset": "earliest", "enable.partition.eof": True})
        deadline = time.time() + 30
        marks = None
        while time.time() < deadline:
            try:
                marks = c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=5)
                if marks and marks[1] == 20:
                    break
            except Exception:  # noqa: BLE001 - metadata settling after the failover
                pass
            time.sleep(0.5)
        assert marks == (12, 20), marks
        c.assign([TopicPartition(TOPIC, 0, 0)])
        got = []
        while time.time() < deadline and len(got) < 8:
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(int(msg.value()))
        c.close()
        assert got == list(range(12, 20))
    finally:
        cluster.close()
