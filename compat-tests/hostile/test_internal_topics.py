"""The broker's own topics (delay levels, the timer wheel, transactions)
take no client's records, whatever its protocol: librdkafka gets Kafka's
"invalid topic" (as Kafka refuses appends to its internal topics), a
RocketMQ send NO_PERMISSION (RocketMQ's TopicValidator); a user topic
beside them is written as ever."""
import json
import os
import socket
import struct
import sys
import time

import pytest
from confluent_kafka import KafkaError, Producer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402
from test_hostile import recv_exact, rmq_frame  # noqa: E402

OWN = ["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "rmq_sys_wheel_timer"]


@pytest.fixture(scope="module")
def rokka():
    with running("hostile", "internal-topics") as r:
        yield r


def test_kafka_producers_cannot_write_the_brokers_own_topics(rokka):
    errors = {}

    def report(err, msg):
        errors[msg.topic()] = err

    p = Producer({"bootstrap.servers": rokka.bootstrap, "message.timeout.ms": 15000, "retries": 0})
    for t in OWN + ["user-topic"]:
        p.produce(t, value=b"0,1,2,", partition=0, on_delivery=report)
    p.flush(30)
    assert errors.get("user-topic") is None, errors
    for t in OWN:
        e = errors.get(t)
        assert e is not None and e.code() == KafkaError.TOPIC_EXCEPTION, f"{t}: {e}"


def test_rocketmq_sends_to_the_brokers_own_topics_are_refused(rokka):
    with socket.create_connection(("127.0.0.1", rokka.broker_port), timeout=10) as s:
        for i, t in enumerate(OWN):
            props = "TAGS\x01d\x02UNIQ_KEY\x01AB\x02"
            ext = {"producerGroup": "pg", "topic": t, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
                   "queueId": "0", "sysFlag": "0", "bornTimestamp": "1700000000000", "flag": "0", "properties": props}
            s.sendall(rmq_frame(10, i + 1, ext, body=b"0,1,2,"))
            n = struct.unpack(">i", recv_exact(s, 4))[0]
            frame = recv_exact(s, n)
            hlen = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
            r = json.loads(frame[4 : 4 + hlen])
            assert r["code"] == 16 and "forbidden" in r.get("remark", ""), f"{t}: {r}"


def test_the_brokers_own_topics_are_internal_and_acks0_writes_to_them_close(rokka):
    """Kafka metadata marks the broker's own topics internal (is_internal),
    as __consumer_offsets — pattern subscriptions and mirroring leave them;
    an acks=0 produce that fails (here: to one of them) is not answered,
    and closes its connection, as Kafka's broker does, so the producer
    refreshes its metadata instead of writing on into the void."""
    from kafka import KafkaAdminClient

    # A delayed RocketMQ message makes the delay-level topic.
    with socket.create_connection(("127.0.0.1", rokka.broker_port), timeout=10) as s:
        props = "DELAY\x012\x02UNIQ_KEY\x01DL\x02"
        ext = {"producerGroup": "pg", "topic": "user-topic", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
               "queueId": "0", "sysFlag": "0", "bornTimestamp": "1700000000000", "flag": "0", "properties": props}
        s.sendall(rmq_frame(10, 1, ext, body=b"later"))
        n = struct.unpack(">i", recv_exact(s, 4))[0]
        frame = recv_exact(s, n)
        hlen = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
        assert json.loads(frame[4 : 4 + hlen])["code"] == 0
    a = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    described = {t["name"]: t for t in a.describe_topics()}
    a.close()
    assert described["SCHEDULE_TOPIC_XXXX"]["is_internal"] is True, described["SCHEDULE_TOPIC_XXXX"]
    assert described["user-topic"]["is_internal"] is False
    before = rokka.metric_values().get("rokka_kafka_acks0_failures_closed_total", 0)
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": 0, "message.timeout.ms": 5000})
    p.produce("SCHEDULE_TOPIC_XXXX", value=b"x", partition=0)
    p.flush(10)
    # acks=0: flushed once written to the socket, maybe before the broker
    # read it.
    deadline = time.time() + 10
    while time.time() < deadline and rokka.metric_values().get("rokka_kafka_acks0_failures_closed_total", 0) < before + 1:
        time.sleep(0.1)
    assert rokka.metric_values().get("rokka_kafka_acks0_failures_closed_total", 0) >= before + 1


def test_rocketmq_commits_and_resets_under_the_brokers_own_groups_are_refused(rokka):
    """`%SCHEDULE%`'s offsets are the delay levels' progress: a raw
    UPDATE_CONSUMER_OFFSET to the queue end (authorization off, the default)
    skipped every pending delayed message. It, an offset reset and a pull's
    piggy-backed commit under it are refused or ignored; an ordinary group's
    commit goes through."""
    def call(s, code, opaque, ext, body=b""):
        s.sendall(rmq_frame(code, opaque, ext, body))
        while True:
            n = struct.unpack(">i", recv_exact(s, 4))[0]
            frame = recv_exact(s, n)
            hlen = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
            r = json.loads(frame[4 : 4 + hlen])
            if r.get("opaque") == opaque:
                return r

    topic = "SCHEDULE_TOPIC_XXXX"
    with socket.create_connection(("127.0.0.1", rokka.broker_port), timeout=10) as s:
        # A message delayed by level 3: the level's queue 2 exists.
        props = "DELAY\x013\x02UNIQ_KEY\x01AC\x02"
        sent = call(s, 10, 99, {"producerGroup": "pg", "topic": "user-delayed", "defaultTopic": "TBW102",
                                "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
                                "bornTimestamp": "1700000000000", "flag": "0", "properties": props}, b"later")
        assert sent["code"] == 0, sent
        query = {"consumerGroup": "%SCHEDULE%", "topic": topic, "queueId": "2"}
        before = call(s, 14, 1, query)
        for i, group in enumerate(("%SCHEDULE%", "CID_RMQ_SYS_TRANS")):
            r = call(s, 15, 10 + i, {"consumerGroup": group, "topic": topic, "queueId": "2", "commitOffset": "1000000"})
            assert r["code"] == 16 and "system consumer group" in r.get("remark", ""), r
        r = call(s, 222, 20, {"topic": topic, "group": "%SCHEDULE%", "timestamp": "-1", "isForce": "true"})
        assert r["code"] == 16, r
        # A pull under it with the commit flag: served (nothing there), the commit not taken.
        call(s, 11, 30, {"consumerGroup": "%SCHEDULE%", "topic": topic, "queueId": "2", "queueOffset": "0",
                         "maxMsgNums": "1", "sysFlag": "1", "commitOffset": "1000000", "suspendTimeoutMillis": "0",
                         "subscription": "*", "subVersion": "0"})
        after = call(s, 14, 31, query)
        assert (after["code"], after.get("extFields", {}).get("offset")) == (
            before["code"], before.get("extFields", {}).get("offset")), (before, after)
        # An ordinary group's commit: taken.
        r = call(s, 15, 40, {"consumerGroup": "own-ok", "topic": topic, "queueId": "2", "commitOffset": "0"})
        assert r["code"] == 0, r
