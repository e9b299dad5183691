"""Every refusal documented in docs/*.md, hit by a real client and answered
as documented (issue 18, item 5):

- rocketmq.md, CONSUMER_SEND_MSG_BACK: a Kafka-produced record cannot be
  sent back — SYSTEM_ERROR, and the client redelivers it itself
  (rocketmq-client-rust push consumer; a RocketMQ-produced one is accepted);
- kafka.md, OffsetDelete: refused for topics the group's members subscribe
  to — GROUP_SUBSCRIBED_TO_TOPIC (kafka-python admin; confluent-kafka's
  Python admin has no OffsetDelete);
- migration.md, mixed groups: a RocketMQ client subscribing to other topics
  than the group's Kafka members is not added to the group, its heartbeat
  gets SYSTEM_ERROR with a remark naming both subscriptions, and it is
  counted (rocketmq-client-rust next to a confluent-kafka member);
- kafka.md, Produce: v0–2 refused — no error form, so the connection is
  closed (librdkafka told the broker is 0.9.0);
- kafka.md, Transactions: a transaction.timeout.ms above the broker's
  maximum — INVALID_TRANSACTION_TIMEOUT, fatal at once (confluent-kafka and
  kafka-python transactional producers);
- kafka.md, CreateTopics: replication factor must be 1 —
  INVALID_REPLICATION_FACTOR (confluent-kafka and kafka-python admins);
- rocketmq.md, name server: GET_ROUTEINFO_BY_TOPIC of an unknown topic → 17;
  each port answers its own family of codes, the other family gets 3
  (rocketmq-client-rust, once given the broker port as its name server).

rocketmq-client-rust logs a refused send-back or heartbeat without the
response code, so the RocketMQ answers are read on the wire: the clients
reach rokka through a `RemotingTap` (realclients.py) that records each
request code with the response code and remark rokka sent back (the
broker's routes point there: `rocketmq.advertised_addr`).

Not here: JoinGroup error 23 in a mixed group (test_cross.py), and the
UNSUPPORTED_VERSION answers to ApiVersions / other APIs at versions Rokka
does not list (no real client sends a version the broker did not list).
"""
import re
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from realclients import (
    Harness,
    RemotingTap,
    create_topics,
    log_since,
    log_size,
    metric,
    run_harness,
    wait_for,
    watermarks,
)
from rokka_fixture import Rokka, results_dir

# RocketMQ request and response codes (RequestCode / ResponseCode).
HEART_BEAT, CONSUMER_SEND_MSG_BACK, GET_ROUTEINFO_BY_TOPIC = 34, 36, 105
SYSTEM_ERROR, REQUEST_CODE_NOT_SUPPORTED, TOPIC_NOT_EXIST = 1, 3, 17


@pytest.fixture(scope="module")
def rokka():
    tap = RemotingTap()
    r = Rokka(
        results_dir("cross", "test_refusals"),
        # Redeliveries (delay level 3 + reconsume times) after 1 s, not 10 s.
        rocketmq_extra=f'advertised_addr = "127.0.0.1:{tap.port}"\n'
        "[broker]\ndelay_levels_ms = [1000, 1000, 1000, 1000]\n[group]\ninitial_rebalance_delay_ms = 0",
    )
    r.start()
    tap.target = r.broker_port
    r.tap = tap
    try:
        yield r
    finally:
        tap.close()
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"


def deliveries(h):
    """[(reconsume times, body)] of a dur-consume run."""
    return [(int(l.split()[4]), l.split()[5]) for l in h.lines("got ")]


def test_send_back_of_a_kafka_produced_record_is_refused(rokka):
    ktopic, rtopic = "RefSendBackK", "RefSendBackR"
    create_topics(rokka, {ktopic: 1})
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all"})
    for i in range(3):
        p.produce(ktopic, value=f"kafka-{i}".encode())
    assert p.flush(10) == 0
    run_harness(rokka, "send", "dur-send", rtopic, "rmq", 3)

    # A push consumer failing each message once (RECONSUME_LATER → CONSUMER_SEND_MSG_BACK).
    mark = rokka.tap.mark()
    hk = run_harness(rokka, "fail-kafka", "dur-consume", ktopic, "ref-sb-k", 40, 6, 1, timeout=90)
    mark_r = rokka.tap.mark()
    hr = run_harness(rokka, "fail-rmq", "dur-consume", rtopic, "ref-sb-r", 40, 6, 1, timeout=90)

    # The Kafka-produced ones: SYSTEM_ERROR, the broker stored nothing for
    # them, the client reported the refusal ...
    answers = rokka.tap.answers(CONSUMER_SEND_MSG_BACK, mark, group="ref-sb-k")
    assert len(answers) == 3, answers
    assert all(c == SYSTEM_ERROR and r.startswith("look message by offset failed") for c, r in answers), answers
    assert metric(rokka, "rokka_rocketmq_retries_total", group="ref-sb-k") == 0
    assert len([l for l in hk.text().splitlines() if "send message back error" in l]) == 3, hk.path
    # ... and redelivered each itself (its fallback: a plain send to the retry topic), once.
    got = sorted(deliveries(hk))
    assert got == sorted([(0, f"kafka-{i}") for i in range(3)] + [(1, f"kafka-{i}") for i in range(3)]), got

    # RocketMQ-produced ones are sent back by the broker (the same client, accepted).
    answers = rokka.tap.answers(CONSUMER_SEND_MSG_BACK, mark_r, group="ref-sb-r")
    assert answers == [(0, None)] * 3, answers
    assert metric(rokka, "rokka_rocketmq_retries_total", group="ref-sb-r") == 3
    assert not [l for l in hr.text().splitlines() if "send message back error" in l]
    got = sorted(deliveries(hr))
    assert got == sorted([(0, f"rmq-{i}") for i in range(3)] + [(1, f"rmq-{i}") for i in range(3)]), got


def test_offset_delete_of_a_subscribed_topic_is_refused(rokka):
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP
    from kafka.errors import GroupSubscribedToTopicError, NoError

    group, subscribed, other = "ref-offdel", "RefOffDelA", "RefOffDelB"
    create_topics(rokka, {subscribed: 1, other: 1})
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for t in (subscribed, other):
        for i in range(3):
            p.produce(t, value=b"x")
    assert p.flush(10) == 0
    # A live member subscribed to one topic commits there, and for the other.
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.subscribe([subscribed])
    k = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                c.commit(message=m, asynchronous=False)
                break
        c.commit(offsets=[TopicPartition(other, 0, 2)], asynchronous=False)

        res = k.delete_group_offsets(group, [KTP(subscribed, 0), KTP(other, 0)])
        assert res == {KTP(subscribed, 0): GroupSubscribedToTopicError, KTP(other, 0): NoError}, res
        assert GroupSubscribedToTopicError.errno == 86
        offs = {tp.topic: om.offset for tp, om in k.list_group_offsets(group)[group].items() if om.offset >= 0}
        assert offs == {subscribed: 1}, offs
    finally:
        k.close()
        c.close()


def test_a_rocketmq_client_with_another_subscription_is_not_added_to_a_mixed_group(rokka):
    group, kafka_topic, rmq_topic = "ref-mixed", "RefMixedK", "RefMixedR"
    create_topics(rokka, {kafka_topic: 2, rmq_topic: 2})
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for i in range(4):
        p.produce(rmq_topic, value=f"r-{i}".encode(), partition=i % 2)
    assert p.flush(10) == 0
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.subscribe([kafka_topic])
    mark = log_size(rokka)
    tap_mark = rokka.tap.mark()
    try:
        assert wait_for("assignment", lambda: c.poll(0.2) is None and len(c.assignment()) == 2, 20), c.assignment()
        h = Harness(rokka, "mixed", "dur-consume", rmq_topic, group, 10)
        deadline = time.time() + 40
        while h.running() and time.time() < deadline:
            c.poll(0.2)  # the Kafka member stays
        assert h.wait(10) == 0, h.lines()[-5:]
        assigned = sorted(tp.partition for tp in c.assignment())
    finally:
        c.close()
    # Refused: its heartbeats answered SYSTEM_ERROR naming both
    # subscriptions, nothing consumed, rokka counted and logged the
    # conflict; the Kafka member kept its partitions.
    answers = rokka.tap.answers(HEART_BEAT, tap_mark)
    refused = [(c, r) for c, r in answers if c != 0]
    assert refused, answers
    for c, r in refused:
        assert c == SYSTEM_ERROR and group in r and rmq_topic in r and kafka_topic in r, (c, r)
    assert h.lines("got ") == [], h.lines("got ")
    assert re.search(r"send heart beat to broker\[.*\] failed", h.text()), f"no failed heartbeat ({h.path})"
    assert metric(rokka, "rokka_mixed_group_conflicts_total", group=group, side="rocketmq") >= 1
    refusals = [l for l in log_since(rokka, mark).splitlines() if "RocketMQ consumer refused" in l]
    assert refusals and rmq_topic in refusals[0] and kafka_topic in refusals[0], refusals[:1]
    assert assigned == [0, 1]


def test_produce_v0_to_v2_is_refused(rokka):
    topic = "RefProduceOld"
    create_topics(rokka, {topic: 1})
    before = metric(rokka, "rokka_kafka_errors_total", api="Produce", code="35")
    mark = log_size(rokka)
    # librdkafka told the broker is 0.9.0 sends Produce v1 (message format v0).
    p = Producer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "api.version.request": False,
            "broker.version.fallback": "0.9.0",
            "message.timeout.ms": 3000,
        }
    )
    errors = []
    p.produce(topic, value=b"old", on_delivery=lambda e, m: errors.append(e))
    p.flush(20)
    assert len(errors) == 1 and errors[0] is not None, errors
    # Produce has no top-level error code: the connection is closed, logged, counted.
    assert metric(rokka, "rokka_kafka_errors_total", api="Produce", code="35") > before
    assert "Produce v1 is not supported" in log_since(rokka, mark)
    assert watermarks(rokka, topic)[0] == (0, 0), "a refused produce stored something"


def test_a_transaction_timeout_above_the_maximum_is_refused(rokka):
    """transaction.timeout.ms above broker.transaction_max_timeout_ms (15 min)
    is INVALID_TRANSACTION_TIMEOUT, a fatal error for the producer (not a
    retriable one it would retry until its own timeout)."""
    p = Producer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "transactional.id": f"ref-tx-{uuid.uuid4()}",
            "transaction.timeout.ms": 1_000_000,
        }
    )
    t0 = time.time()
    with pytest.raises(KafkaException) as e:
        p.init_transactions(20)
    err = e.value.args[0]
    print("confluent-kafka:", err.code(), err.str())
    assert err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT, err
    assert time.time() - t0 < 15, "answered at once, not retried"

    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KError

    k = KafkaProducer(bootstrap_servers=rokka.bootstrap, transactional_id=f"ref-tx-kp-{uuid.uuid4()}",
                      transaction_timeout_ms=1_000_000, max_block_ms=20000)
    try:
        with pytest.raises(KError) as e:
            k.init_transactions()
        assert re.search(r"InvalidTransactionTimeout|Error 50", str(e.value) + type(e.value).__name__), e.value
    finally:
        k.close(timeout=5)


def test_a_replication_factor_other_than_1_is_refused(rokka):
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    f = a.create_topics([NewTopic("RefRf3", 1, 3)])["RefRf3"]
    with pytest.raises(KafkaException) as e:
        f.result(10)
    assert e.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR, e.value

    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic as KNewTopic
    from kafka.errors import InvalidReplicationFactorError

    k = KafkaAdminClient(bootstrap_servers=rokka.bootstrap)
    try:
        with pytest.raises(InvalidReplicationFactorError):
            k.create_topics([KNewTopic("RefRf2", 1, 2)], raise_errors=True)
        assert "RefRf3" not in k.list_topics() and "RefRf2" not in k.list_topics()
    finally:
        k.close()


def test_unknown_topic_route_and_wrong_port_answers(rokka):
    ns = RemotingTap()
    try:
        # A consumer of a topic nobody created: the name server answers 17.
        ns.target = rokka.namesrv_port
        h = Harness(rokka, "no-topic", "dur-consume", "RefNoSuchTopic", "ref-none", 4, namesrv_port=ns.port)
        assert h.wait(60) == 0, h.lines()[-5:]
        answers = ns.answers(GET_ROUTEINFO_BY_TOPIC, topic="RefNoSuchTopic")
        assert answers and all(c == TOPIC_NOT_EXIST for c, _ in answers), answers
        # A name-server request to the broker port gets 3.
        mark = ns.mark()
        ns.target = rokka.broker_port
        h = Harness(rokka, "wrong-port", "dur-send", "RefWrongPort", "w", 1, 10, namesrv_port=ns.port)
        assert h.wait(60) == 0, h.lines()[-5:]
        assert h.lines("acked ") == [] and len(h.lines("failed ")) == 1, h.lines()
        answers = ns.answers(GET_ROUTEINFO_BY_TOPIC, mark)
        assert answers and all(c == REQUEST_CODE_NOT_SUPPORTED for c, _ in answers), answers
    finally:
        ns.close()


def test_the_brokers_own_groups_offsets_are_no_clients_to_move(rokka):
    """`%SCHEDULE%`'s offsets are the delay levels' progress and
    `CID_RMQ_SYS_TRANS`'s the transaction check's: with authorization off
    (the default) a client committed them — to the queue end, every pending
    delayed message and retry was skipped. Kafka commits and group deletes
    under them are refused, whatever the ACLs (RocketMQ's commits and resets:
    hostile/test_internal_topics.py — rocketmq-client-rust refuses such a
    group name itself)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    # A delayed message (level 1): the level's queue 0 exists, with progress.
    run_harness(rokka, "own-delayed", "dur-delayed", "RefOwnDelayed", "d:1:0:1")
    admin = AdminClient({"bootstrap.servers": rokka.bootstrap})
    for group, topic in (("%SCHEDULE%", "SCHEDULE_TOPIC_XXXX"), ("CID_RMQ_SYS_TRANS", "RMQ_SYS_TRANS_HALF_TOPIC")):
        fs = admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 1_000_000)])], request_timeout=15)
        parts = fs[group].result(20).topic_partitions
        assert [tp.error and tp.error.code() for tp in parts] == [KafkaError.INVALID_GROUP_ID], (group, parts)
        with pytest.raises(KafkaException) as e:
            admin.delete_consumer_groups([group], request_timeout=15)[group].result(20)
        assert e.value.args[0].code() == KafkaError.INVALID_GROUP_ID, (group, e.value)
        # A Kafka consumer joining as one is refused too.
        c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            try:
                parts = c.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
                codes = [tp.error and tp.error.code() for tp in parts]
            except KafkaException as e:
                codes = [e.args[0].code()]
            assert codes == [KafkaError.INVALID_GROUP_ID], (group, codes)
        finally:
            c.close()
    assert metric(rokka, "rokka_kafka_ids_refused_total", id="group_id") >= 4

