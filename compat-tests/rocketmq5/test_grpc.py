"""The RocketMQ 5 Python client (rocketmq-python-client, gRPC) against
rokka: sends, pop consumption (receive, ack, invisible durations,
redelivery, dead letters), delay and FIFO messages, and crossings with
remoting (rocketmq-client-rust) and Kafka (kafka-python) clients."""
import os
import threading
import time
import uuid

import pytest
from conftest import harness, receive_all
from kafka import KafkaConsumer, KafkaProducer
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    ConsumeResult,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)


def config(rokka):
    return ClientConfiguration(f"127.0.0.1:{rokka.grpc_port}", Credentials())


def name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Clients:
    """Producers and consumers a test started, shut down at its end."""

    def __init__(self, rokka):
        self.rokka = rokka
        self.started = []

    def producer(self, *topics):
        p = Producer(config(self.rokka), topics)
        p.startup()
        self.started.append(p)
        return p

    def consumer(self, group, topic, expr="*", wait=2):
        c = SimpleConsumer(config(self.rokka), group, {topic: FilterExpression(expr)}, await_duration=wait)
        c.startup()
        self.started.append(c)
        return c

    def close(self):
        for c in reversed(self.started):
            try:
                c.shutdown()
            except Exception:  # noqa: BLE001 - a client failing to stop must not hide the test's result
                pass


@pytest.fixture
def clients(rokka):
    c = Clients(rokka)
    yield c
    c.close()


def message(topic, body, tag=None, keys=None, props=None, group=None, deliver_at=None):
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys
    for k, v in (props or {}).items():
        m.add_property(k, v)
    if group:
        m.message_group = group
    if deliver_at:
        m.delivery_timestamp = deliver_at
    return m


def metric(rokka, name, **labels):
    total = 0.0
    for k, v in rokka.metric_values().items():
        if k == name or k.startswith(name + "{"):
            if all(f'{lk}="{lv}"' in k for lk, lv in labels.items()):
                total += v
    return total


def raw_meta(client_id, language="JAVA"):
    """Metadata of a raw call (grpcio with Apache's generated stubs)."""
    return [("x-mq-client-id", client_id), ("x-mq-language", language), ("x-mq-protocol", "v2")]


def receive_request(group, topic, batch=1, invisible=30, wait=None, attempt=None):
    """A raw ReceiveMessageRequest: a pop from any queue of `topic`, TAG *."""
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s

    req = s.ReceiveMessageRequest(
        group=d.Resource(name=group),
        message_queue=d.MessageQueue(topic=d.Resource(name=topic), id=-1),
        filter_expression=d.FilterExpression(type=d.FilterType.TAG, expression="*"),
        batch_size=batch,
        auto_renew=False,
    )
    if attempt is not None:
        req.attempt_id = attempt
    req.invisible_duration.seconds = invisible
    if wait is not None:
        req.long_polling_timeout.seconds = wait
    return req


def raw_message(topic, body=b"x", kind=None):
    """A raw message to send: a fresh id, plain body, NORMAL unless `kind`."""
    from rocketmq.grpc_protocol import definition_pb2 as d

    m = d.Message(topic=d.Resource(name=topic), body=body)
    m.system_properties.message_id = uuid.uuid4().hex.upper()
    m.system_properties.body_encoding = d.Encoding.IDENTITY
    m.system_properties.message_type = d.MessageType.NORMAL if kind is None else kind
    return m


def test_messages_sent_over_grpc_are_received_byte_exact(rokka, clients):
    topic, group = name("g5-basic"), name("g5-basic-g")
    p = clients.producer(topic)
    sent = {}
    for i in range(20):
        body = os.urandom(64) + f"-{i}-é".encode()
        r = p.send(message(topic, body, tag="TagA" if i % 2 == 0 else "TagB", keys=f"key-{i}", props={"n": str(i), "u": "é"}))
        sent[r.message_id] = (i, body)
    assert len(sent) == 20, "every send got its own message id"
    c = clients.consumer(group, topic)
    got = receive_all(c, 20)
    assert len(got) == 20, f"received {len(got)} of 20"
    for m in got:
        i, body = sent[m.message_id]
        assert m.body == body, f"message {i} not byte-exact"
        assert m.tag == ("TagA" if i % 2 == 0 else "TagB")
        assert m.keys == {f"key-{i}"}
        assert m.properties == {"n": str(i), "u": "é"}
        assert m.delivery_attempt == 1
        assert not m.corrupted, "the body digest rokka sent matches the body"
    assert len({m.message_id for m in got}) == 20, "none twice"
    # Acked: nothing comes back, even after the invisible time.
    assert receive_all(c, 1, invisible=1, timeout=4) == []
    # A tag filter gets only its tag (a new group starts at the queue's start).
    only_b = clients.consumer(name("g5-basic-tag"), topic, expr="TagB")
    tagged = receive_all(only_b, 10)
    assert sorted(sent[m.message_id][0] for m in tagged) == list(range(1, 20, 2))
    assert metric(rokka, "rokka_rocketmq5_messages_acked_total") >= 30


def test_a_tag_filter_tells_apart_tags_whose_hashes_collide(rokka, clients):
    """"Aa" and "BB" have the same Java hash (the ConsumeQueue's tag code):
    a receive filtering on one gets only it, as Apache's proxy checks the
    tag itself after the code."""
    topic = name("g5-collide")
    p = clients.producer(topic)
    for i in range(4):
        p.send(message(topic, f"aa-{i}".encode(), tag="Aa"))
        p.send(message(topic, f"bb-{i}".encode(), tag="BB"))
    got = receive_all(clients.consumer(name("g5-collide-g"), topic, expr="Aa"), 8, timeout=6)
    assert sorted(m.body for m in got) == [f"aa-{i}".encode() for i in range(4)], [m.body for m in got]


def test_keys_with_spaces_are_taken_as_apache_takes_them_and_control_characters_refused(rokka, clients):
    # Apache's proxy takes a key holding spaces (the stored KEYS property is
    # space-separated, so it reads back as its words) and refuses only a
    # blank key or one with a control character (ILLEGAL_MESSAGE_KEY).
    topic, group = name("g5-keys"), name("g5-keys-g")
    p = clients.producer(topic)
    p.send(message(topic, b"spaced", keys="order 42"))
    with pytest.raises(Exception) as refused:
        p.send(message(topic, b"bell", keys="bad\x07key"))
    assert "key" in str(refused.value).lower(), refused.value
    got = receive_all(clients.consumer(group, topic), 1)
    assert [m.body for m in got] == [b"spaced"]
    assert got[0].keys == {"order", "42"}


def test_an_unacked_message_comes_back_with_attempt_2_and_its_old_handle_is_refused(rokka, clients):
    topic, group = name("g5-redeliver"), name("g5-redeliver-g")
    p = clients.producer(topic)
    mid = p.send(message(topic, b"come back")).message_id
    c = clients.consumer(group, topic)
    first = receive_all(c, 1, invisible=5, ack=False)
    handed = time.time()
    assert [m.message_id for m in first] == [mid]
    old_handle = first[0].receipt_handle
    # Invisible for 5 s: not handed out again meanwhile (this receive
    # long-polls the consumer's 2 s).
    assert receive_all(c, 1, invisible=5, timeout=1, ack=False) == []
    again = receive_all(c, 1, invisible=10, timeout=10, ack=False)
    assert time.time() - handed >= 4.5, "not before its invisible time ended"
    assert [m.message_id for m in again] == [mid]
    assert again[0].delivery_attempt == 2
    assert again[0].body == b"come back"
    assert again[0].receipt_handle != old_handle
    # The first delivery's handle no longer acks it.
    first[0].receipt_handle = old_handle
    with pytest.raises(Exception) as refused:
        c.ack(first[0])
    assert "40013" in str(refused.value) or "receipt" in str(refused.value).lower(), refused.value
    c.ack(again[0])
    assert receive_all(c, 1, invisible=1, timeout=12) == [], "acked: not delivered again"


def test_change_invisible_duration_keeps_a_message_hidden_longer(rokka, clients):
    topic, group = name("g5-change"), name("g5-change-g")
    clients.producer(topic).send(message(topic, b"slow work"))
    c = clients.consumer(group, topic)
    m = receive_all(c, 1, invisible=2, ack=False)[0]
    handle = m.receipt_handle
    c.change_invisible_duration(m, 20)
    assert m.receipt_handle != handle, "a changed duration gives a new handle"
    # Past the first 2 s the message stays hidden.
    time.sleep(3)
    assert receive_all(c, 1, invisible=2, timeout=2, ack=False) == []
    c.ack(m)  # with the new handle


def attempts_until_dead(c, n):
    """Receives the one message sent, never acked, until it came n times;
    checks the next pop after its last invisible time (the one that moves
    it to the dead letters) gets nothing; the delivery attempts seen."""
    attempts = []
    deadline = time.time() + 30
    while time.time() < deadline and len(attempts) < n + 1:
        for m in c.receive(4, 1):
            attempts.append(m.delivery_attempt)
        time.sleep(0.2)
        if len(attempts) == n:
            time.sleep(1.5)
            assert receive_all(c, 1, invisible=1, timeout=3, ack=False) == []
            break
    return attempts


def test_after_max_attempts_a_message_goes_to_the_dead_letter_queue(rokka, clients):
    # The fixture sets grpc.max_delivery_attempts = 3.
    topic, group = name("g5-dlq"), name("g5-dlq-g")
    p = clients.producer(topic)
    mid = p.send(message(topic, b"poison", keys="poison-key", props={"why": "fails"})).message_id
    c = clients.consumer(group, topic)
    attempts = attempts_until_dead(c, 3)
    assert attempts == [1, 2, 3], attempts
    dlq = clients.consumer(name("g5-dlq-reader"), f"%DLQ%{group}")
    dead = receive_all(dlq, 1)
    assert len(dead) == 1
    assert dead[0].body == b"poison" and dead[0].message_id == mid
    assert dead[0].keys == {"poison-key"} and dead[0].properties.get("why") == "fails"
    assert metric(rokka, "rokka_rocketmq5_dlq_messages_total", group=group) == 1


def test_a_groups_config_sets_its_attempts_and_turns_its_consumption_off(rokka, clients):
    """mqadmin updateSubGroup (rocketmq-client-rust's admin) of a gRPC
    consumer's group, as Apache's proxy reads it: retryMaxTimes 1 means two
    deliveries before the dead letters (the node's own
    grpc.max_delivery_attempts is 3), and consumption turned off is
    FORBIDDEN until turned on again. (Before: both settings refused as not
    supported.)"""
    topic, group = name("g5-subgroup"), name("g5-subgroup-g")
    broker = f"127.0.0.1:{rokka.broker_port}"
    assert harness(rokka, "subgroup-set", broker, group, "true", 1) == ["set: ok", "RESULT subgroup-set ok"]
    p = clients.producer(topic)
    p.send(message(topic, b"poison"))
    c = clients.consumer(group, topic)
    attempts = attempts_until_dead(c, 2)
    assert attempts == [1, 2], attempts
    dead = receive_all(clients.consumer(name("g5-subgroup-dlq"), f"%DLQ%{group}"), 1)
    assert [m.body for m in dead] == [b"poison"]

    assert harness(rokka, "subgroup-set", broker, group, "false", 1) == ["set: ok", "RESULT subgroup-set ok"]
    p.send(message(topic, b"later"))
    err = None
    try:
        c.receive(4, 10)
    except Exception as e:  # noqa: BLE001
        err = e
    assert type(err).__name__ == "ForbiddenException" and "no permission" in str(err), repr(err)
    assert harness(rokka, "subgroup-set", broker, group, "true", 16) == ["set: ok", "RESULT subgroup-set ok"]
    assert [m.body for m in receive_all(c, 1)] == [b"later"]

    # A receive held in its long poll when consumption is turned off is
    # refused when it wakes, not handed what woke it.
    held = clients.consumer(group, topic, wait=20)
    out = {}

    def receive_held():
        try:
            out["got"] = [m.body for m in held.receive(4, 10)]
        except Exception as e:  # noqa: BLE001
            out["err"] = e

    t = threading.Thread(target=receive_held)
    t.start()
    time.sleep(1)
    assert harness(rokka, "subgroup-set", broker, group, "false", 16) == ["set: ok", "RESULT subgroup-set ok"]
    assert t.is_alive(), f"the receive was not held: {out}"
    p.send(message(topic, b"while-off"))
    t.join(30)
    assert type(out.get("err")).__name__ == "ForbiddenException", out


def test_a_group_configured_orderly_is_served_fifo(rokka, clients):
    """consumeMessageOrderly set with mqadmin updateSubGroup
    (rocketmq-client-rust's admin), as Apache's proxy reads it: the group
    is served FIFO without being in grpc.fifo_groups — a queue hands it one
    batch at a time, the next once it is acked."""
    topic, group = name("g5-sub-ordered"), name("g5-sub-ordered-g")
    broker = f"127.0.0.1:{rokka.broker_port}"
    set_ = harness(rokka, "subgroup-set", broker, group, "true", 16, "true")
    assert set_ == ["set: ok", "RESULT subgroup-set ok"], set_
    p = clients.producer(topic)
    for i in range(4):
        p.send(message(topic, f"o-{i}".encode(), group="one-order"))
    c = clients.consumer(group, topic)
    first = []
    deadline = time.time() + 10
    while len(first) < 2 and time.time() < deadline:
        first += c.receive(2 - len(first), 5)
    assert [m.body for m in first] == [b"o-0", b"o-1"]
    assert c.receive(4, 5) == [], "held back until the batch is acked"
    for m in first:
        c.ack(m)
    assert [m.body for m in receive_all(c, 2)] == [b"o-2", b"o-3"]


def test_a_delay_message_arrives_after_its_delivery_time(rokka, clients):
    topic, group = name("g5-delay"), name("g5-delay-g")
    p = clients.producer(topic)
    c = clients.consumer(group, topic)
    # The Python client puts delivery_timestamp on the wire as seconds.
    due = int(time.time()) + 4
    p.send(message(topic, b"later", deliver_at=due))
    p.send(message(topic, b"now"))
    early = receive_all(c, 2, timeout=2)
    assert [m.body for m in early] == [b"now"], "the delay message is not visible before its time"
    late = receive_all(c, 1, timeout=15)
    assert [m.body for m in late] == [b"later"]
    assert time.time() >= due - 0.5


def test_fifo_messages_of_one_group_land_on_one_queue_in_order(rokka, clients):
    topic, group = name("g5-fifo"), name("g5-fifo-g")
    p = clients.producer(topic)
    receipts = {}
    for g in ("order-1", "order-2", "order-3"):
        for i in range(5):
            r = p.send(message(topic, f"{g}:{i}".encode(), group=g))
            receipts.setdefault(g, []).append(r)
    c = clients.consumer(group, topic)
    got = receive_all(c, 15)
    by_group = {}
    for m in got:
        assert m.message_group in ("order-1", "order-2", "order-3")
        by_group.setdefault(m.message_group, []).append(m)
    for g, ms in by_group.items():
        assert [m.body.decode() for m in ms] == [f"{g}:{i}" for i in range(5)], "a group's messages in send order"
    # One message group, one queue: its sends took increasing offsets there.
    for g, rs in receipts.items():
        offs = [r.offset for r in rs]
        assert offs == sorted(offs) and len(set(offs)) == 5, offs


def test_grpc_messages_cross_to_remoting_and_kafka_consumers(rokka, clients):
    topic = name("g5-out")
    p = clients.producer(topic)
    bodies = [f"grpc-{i}-é".encode() + os.urandom(8) for i in range(6)]
    for i, b in enumerate(bodies):
        p.send(message(topic, b, tag="TagG", keys=f"gk-{i}", props={"p": f"v{i}"}))
    # A remoting push consumer (rocketmq-client-rust).
    lines = harness(rokka, "cross-consume", topic, name("g5-out-rmq"), 6)
    msgs = [l[len("msg "):].split(" ") for l in lines if l.startswith("msg ")]
    assert len(msgs) == 6, lines[-5:]
    seen = {}
    for q, off, born, body, keys, tags, props, host in msgs:
        body = bytes.fromhex(body)
        seen[body] = (bytes.fromhex(keys).decode(), bytes.fromhex(tags).decode(), bytes.fromhex(props))
    assert sorted(seen) == sorted(bodies)
    for i, b in enumerate(bodies):
        keys, tags, props = seen[b]
        assert (keys, tags) == (f"gk-{i}", "TagG")
        assert f"p\x01v{i}\x02".encode() in props
    # A Kafka consumer.
    k = KafkaConsumer(
        topic,
        bootstrap_servers=rokka.bootstrap,
        group_id=name("g5-out-kafka"),
        auto_offset_reset="earliest",
        consumer_timeout_ms=8000,
    )
    try:
        records = []
        for r in k:
            records.append(r)
            if len(records) == 6:
                break
    finally:
        k.close()
    assert sorted(r.value for r in records) == sorted(bodies)
    for r in records:
        i = bodies.index(r.value)
        headers = dict(r.headers)
        assert r.key == f"gk-{i}".encode()
        assert headers.get("rocketmq.tags") == b"TagG" and headers.get("p") == f"v{i}".encode()


def test_remoting_and_kafka_messages_cross_to_a_grpc_consumer(rokka, clients):
    topic = name("g5-in")
    harness(rokka, "cross-produce", topic, 4)
    kp = KafkaProducer(bootstrap_servers=rokka.bootstrap)
    for i in range(4):
        kp.send(topic, key=f"kk-{i}".encode(), value=f"kafka-{i}".encode(), headers=[("rocketmq.tags", b"TagK"), ("h", b"x")])
    kp.flush()
    kp.close()
    c = clients.consumer(name("g5-in-g"), topic)
    got = receive_all(c, 8)
    assert len(got) == 8, [m.body for m in got]
    remoting = sorted((m for m in got if m.body.startswith(b"rmq-")), key=lambda m: m.body)
    kafka = sorted((m for m in got if m.body.startswith(b"kafka-")), key=lambda m: m.body)
    assert [m.body for m in remoting] == [f"rmq-{i}-é".encode() for i in range(4)]
    for i, m in enumerate(remoting):
        assert m.keys == {f"key-{i}"} and m.tag == ("TagX" if i % 2 == 0 else "TagY")
        assert m.properties.get("p1") == f"v{i}" and m.properties.get("unicode") == f"é{i}"
    assert [m.body for m in kafka] == [f"kafka-{i}".encode() for i in range(4)]
    for i, m in enumerate(kafka):
        assert m.keys == {f"kk-{i}"} and m.tag == "TagK" and m.properties.get("h") == "x"
    assert len({m.message_id for m in got}) == 8


def test_a_large_kafka_batch_is_received_in_parts_and_decoded_once(rokka, clients):
    """Kafka producers batch thousands of small records; a receive takes 16
    of them, and the batch stays decoded between receives (it was decoded
    whole at every receive: draining it was quadratic)."""
    topic = name("g5-big")
    n = 1500
    kp = KafkaProducer(bootstrap_servers=rokka.bootstrap, batch_size=1 << 20, linger_ms=500, compression_type="gzip")
    for i in range(n):
        kp.send(topic, value=f"big-{i:05d}-".encode() + b"x" * 80, partition=0)
    kp.flush()
    kp.close()
    hits = metric(rokka, "rokka_cross_decoded_batch_hits_total")
    c = clients.consumer(name("g5-big-g"), topic)
    got = receive_all(c, n, timeout=60)
    bodies = [m.body[:10] for m in got]
    assert len(bodies) == n and len(set(bodies)) == n, f"{len(bodies)} received, {len(set(bodies))} distinct"
    assert bodies == sorted(bodies), "one queue's records in order"
    # Each receive after the first in a batch is served from the decoded batch.
    assert metric(rokka, "rokka_cross_decoded_batch_hits_total") - hits >= n // 16 - 10
    assert metric(rokka, "rokka_cross_decoded_batch_bytes") > 0


def test_a_compressed_remoting_body_reaches_a_grpc_consumer_as_sent(rokka, clients):
    """A remoting producer compresses bodies over 4 KiB (zlib, the
    COMPRESSED flag): a gRPC consumer gets the body as the producer gave
    it, its digest over those bytes — not the compressed bytes."""
    topic = name("g5-z")
    harness(rokka, "cross-produce", topic, 3, 10_000)
    c = clients.consumer(name("g5-z-g"), topic)
    got = receive_all(c, 3)
    assert len(got) == 3
    for m in got:
        i = int(next(iter(m.keys)).split("-")[1])
        want = f"rmq-{i}-é".encode()
        while len(want) < 10_000:
            want += f" {i}:{len(want)}".encode()
        assert m.body == want, m.body[:40]


def test_a_tag_filter_finds_its_messages_behind_a_backlog_of_others(rokka, clients):
    """A consumer filtering by tag behind thousands of other-tag messages
    gets its messages in one long poll, as Apache's proxy scans on while
    messages are left — not a batch's worth of skipped messages per poll
    (6000 here over four queues, past one pass's 1024 a queue: the scan
    goes on at once)."""
    topic = name("g5-skip")
    # One stored message each (a Kafka batch of many records is skipped
    # whole).
    p = clients.producer(topic)
    for i in range(6000):
        p.send(message(topic, f"a-{i}".encode(), tag="TagA"))
    for i in range(3):
        p.send(message(topic, f"b-{i}".encode(), tag="TagB"))
    c = clients.consumer(name("g5-skip-g"), topic, expr="TagB")
    t0 = time.time()
    got = receive_all(c, 3, timeout=60)
    took = time.time() - t0
    assert sorted(m.body for m in got) == [b"b-0", b"b-1", b"b-2"]
    assert took < 20, f"{took:.1f} s to find them"


def test_a_receive_without_a_long_polling_time_polls_until_its_deadline(rokka, clients):
    """A ReceiveMessage that gives no long_polling_timeout (the Go
    SimpleConsumer's, which relies on the call's deadline) long-polls until
    about a second before its deadline, as Apache's proxy derives it — not
    answered MESSAGE_NOT_FOUND at once (a tight request loop). Raw, with
    grpcio and Apache's generated stubs the Python client ships."""
    import threading

    import grpc
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    topic, group = name("g5-deadline"), name("g5-deadline-g")
    p = clients.producer(topic)
    p.send(message(topic, b"warm-up"))
    # The group starts from its first message: take the warm-up away.
    c = clients.consumer(group, topic)
    assert [m.body for m in receive_all(c, 1)] == [b"warm-up"]
    later = threading.Timer(2.0, lambda: p.send(message(topic, b"after 2 s")))
    chan = grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}")
    try:
        stub = MessagingServiceStub(chan)
        req = receive_request(group, topic)
        meta = raw_meta("raw-deadline-client", "GOLANG")
        t0 = time.time()
        later.start()
        bodies, codes = [], []
        for r in stub.ReceiveMessage(req, timeout=8, metadata=meta):
            if r.HasField("status"):
                codes.append(r.status.code)
            if r.HasField("message"):
                bodies.append(r.message.body)
        took = time.time() - t0
    finally:
        later.cancel()
        chan.close()
    assert bodies == [b"after 2 s"], (codes, bodies, took)
    assert 1.5 <= took < 7.5, took


def test_a_consumer_group_or_topic_longer_than_a_name_can_be_is_refused(rokka, clients):
    """A group is kept per queue of its topic (pop state), per consumer and
    per renewal, and its retry and dead-letter topics (`%RETRY%<group>`)
    must be topics: a call naming one longer than 248 bytes is refused
    ILLEGAL_CONSUMER_GROUP before anything is kept, as Apache's proxy
    validates groups (its clients: 120 characters); a topic longer than a
    topic can be, ILLEGAL_TOPIC. Raw, with Apache's generated stubs (the
    Python client checks neither)."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    topic = name("g5-longnames")
    clients.producer(topic).send(message(topic, b"x"))
    meta = raw_meta("raw-longnames-client", "PYTHON")
    chan = grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}")
    try:
        stub = MessagingServiceStub(chan)

        def receive(group, t):
            """(status codes, message bodies) of one ReceiveMessage."""
            req = receive_request(group, t, wait=1)
            out = list(stub.ReceiveMessage(req, timeout=8, metadata=meta))
            return [r.status.code for r in out if r.HasField("status")], [r.message.body for r in out if r.HasField("message")]

        assert receive("g" * 249, topic)[0] == [d.Code.ILLEGAL_CONSUMER_GROUP]
        assert receive("g" * 20, "t" * 300)[0] == [d.Code.ILLEGAL_TOPIC]
        hb = stub.Heartbeat(
            s.HeartbeatRequest(group=d.Resource(name="h" * 256), client_type=d.ClientType.SIMPLE_CONSUMER),
            timeout=8,
            metadata=meta,
        )
        assert hb.status.code == d.Code.ILLEGAL_CONSUMER_GROUP, hb.status
        # At 248 bytes the group is served: the message is received.
        got = receive("g" * 248, topic)[1]
        assert got == [b"x"], got
    finally:
        chan.close()


def test_a_group_moves_from_remoting_push_consumers_to_a_simple_consumer(rokka, clients):
    topic, group = name("g5-move"), name("g5-move-g")
    harness(rokka, "cross-produce", topic, 10)
    # The remoting group consumes all 10 and commits its offsets at shutdown.
    lines = harness(rokka, "cross-consume", topic, group, 10)
    assert len([l for l in lines if l.startswith("msg ")]) >= 10
    p = clients.producer(topic)
    new = [f"after-move-{i}".encode() for i in range(5)]
    for b in new:
        p.send(message(topic, b))
    c = clients.consumer(group, topic)
    got = receive_all(c, 5)
    time.sleep(1)
    got += receive_all(c, 1, timeout=2)
    assert sorted(m.body for m in got) == sorted(new), "the group continues where the remoting consumers stopped"


class Checker(TransactionChecker):
    """Answers the broker's checks: commit what was meant to commit."""

    def __init__(self):
        self.asked = []

    def check(self, message):
        self.asked.append(message.message_id)
        return TransactionResolution.COMMIT if message.body.startswith(b"commit") else TransactionResolution.ROLLBACK


def test_transactions_commit_roll_back_and_are_checked_when_left_open(rokka, clients):
    topic, group = name("g5-tx"), name("g5-tx-g")
    checker = Checker()
    p = Producer(config(rokka), (topic,), checker=checker)
    p.startup()
    clients.started.append(p)
    c = clients.consumer(group, topic)
    tx = p.begin_transaction()
    p.send(message(topic, b"committed"), tx)
    assert receive_all(c, 1, timeout=2) == [], "a half message is not visible"
    tx.commit()
    tx2 = p.begin_transaction()
    p.send(message(topic, b"rolled back"), tx2)
    tx2.rollback()
    # Left open: the broker asks the producer (Telemetry), which commits
    # the one whose body says so and rolls back the other.
    for body in (b"commit me on check", b"roll me back on check"):
        p.send(message(topic, body), p.begin_transaction())
    got = receive_all(c, 2, timeout=30)
    time.sleep(3)
    got += receive_all(c, 1, timeout=2)
    assert sorted(m.body for m in got) == [b"commit me on check", b"committed"]
    assert len(checker.asked) >= 2, "both open transactions were checked"


def test_a_transactional_message_due_past_the_timer_limit_is_refused_at_its_send(rokka, clients):
    """The Java client sends a transactional message's delivery time with
    it: one the timer wheel cannot take (past timer_max_delay_ms) is
    ILLEGAL_DELIVERY_TIME at the send, as Apache's proxy validates every
    message — accepted, its commit could never be stored. Raw, with grpcio
    and Apache's generated stubs (the Python client refuses the pair)."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    topic = name("g5-tx-far")
    clients.producer(topic)  # makes the topic
    meta = raw_meta("raw-tx-far")

    def send(due_s):
        m = raw_message(topic, b"later", d.MessageType.TRANSACTION)
        m.system_properties.delivery_timestamp.seconds = due_s
        with grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}") as ch:
            res = MessagingServiceStub(ch).SendMessage(s.SendMessageRequest(messages=[m]), timeout=10, metadata=meta)
        return res.status.code

    assert send(int(time.time()) + 400 * 86400) == d.Code.ILLEGAL_DELIVERY_TIME
    assert send(int(time.time()) + 60) == d.Code.OK


def test_sends_are_checked_as_apaches_proxy_checks_them(rokka, clients):
    """A tag holding '|' (matched by no filter), a message group of 64
    bytes or more, more than 128 user properties: refused with Apache's
    codes, so a producer that works here works against Apache. Raw, with
    grpcio and Apache's generated stubs."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    topic = name("g5-checked")
    clients.producer(topic)
    meta = raw_meta("raw-checked")

    def send(tag="", group="", props=None):
        m = raw_message(topic, kind=d.MessageType.FIFO if group else d.MessageType.NORMAL)
        if tag:
            m.system_properties.tag = tag
        if group:
            m.system_properties.message_group = group
        for k, v in (props or {}).items():
            m.user_properties[k] = v
        with grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}") as ch:
            return MessagingServiceStub(ch).SendMessage(s.SendMessageRequest(messages=[m]), timeout=10, metadata=meta).status.code

    assert send(tag="a|b") == d.Code.ILLEGAL_MESSAGE_TAG
    assert send(group="g" * 64) == d.Code.ILLEGAL_MESSAGE_GROUP
    assert send(props={f"p{i}": "v" for i in range(129)}) == d.Code.MESSAGE_PROPERTIES_TOO_LARGE
    assert send(tag="ok", group="g" * 63, props={f"p{i}": "v" for i in range(128)}) == d.Code.OK


def test_an_ack_repeated_is_ok_and_a_handle_never_handed_out_is_not(rokka, clients):
    """A client that lost an ack's answer acks again: OK, as Apache's ack
    (the Python client raised for a message it had acked); a handle for an
    offset never handed out is still INVALID_RECEIPT_HANDLE."""
    topic, group = name("g5-reack"), name("g5-reack-g")
    p = clients.producer(topic)
    p.send(message(topic, b"once"))
    c = clients.consumer(group, topic)
    got = receive_all(c, 1, ack=False)
    assert [m.body for m in got] == [b"once"]
    c.ack(got[0])
    c.ack(got[0])
    forged = got[0].receipt_handle.split("_")
    forged[2] = format(int(forged[2], 16) + 1000, "x")
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    meta = raw_meta("raw-reack")
    with grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}") as ch:
        res = MessagingServiceStub(ch).AckMessage(s.AckMessageRequest(
            group=d.Resource(name=group), topic=d.Resource(name=topic),
            entries=[s.AckMessageEntry(message_id=got[0].message_id, receipt_handle="_".join(forged))]),
            timeout=10, metadata=meta)
    assert [e.status.code for e in res.entries] == [d.Code.INVALID_RECEIPT_HANDLE]


class Collect(MessageListener):
    def __init__(self, who, seen, lock):
        self.who, self.seen, self.lock = who, seen, lock

    def consume(self, message):
        with self.lock:
            self.seen.append((self.who, message.body))
        return ConsumeResult.SUCCESS


def test_push_consumers_share_a_topic_and_one_takes_over_when_the_other_leaves(rokka, clients):
    import threading

    topic, group = name("g5-push"), name("g5-push-g")
    p = clients.producer(topic)
    seen, lock = [], threading.Lock()
    members = []
    for who in ("a", "b"):
        c = PushConsumer(config(rokka), group, Collect(who, seen, lock), {topic: FilterExpression("*")})
        c.startup()
        members.append(c)
    try:
        # Both members polling (each scans its assignment at start).
        time.sleep(3)
        first = [f"first-{i}".encode() for i in range(40)]
        for b in first:
            p.send(message(topic, b))
            time.sleep(0.02)
        deadline = time.time() + 30
        while time.time() < deadline and len(seen) < 40:
            time.sleep(0.2)
        with lock:
            assert sorted(b for _, b in seen) == sorted(first), "each message once over both members"
            by = {w for w, _ in seen}
        assert by == {"a", "b"}, f"both members consumed: {by}"
        # b leaves; a gets everything sent afterwards.
        members[1].shutdown()
        members.pop()
        with lock:
            seen.clear()
        second = [f"second-{i}".encode() for i in range(20)]
        for b in second:
            p.send(message(topic, b))
        deadline = time.time() + 30
        while time.time() < deadline and len(seen) < 20:
            time.sleep(0.2)
        time.sleep(1)
        with lock:
            assert sorted(b for _, b in seen) == sorted(second)
            assert {w for w, _ in seen} == {"a"}
    finally:
        for c in members:
            c.shutdown()


def test_a_fifo_group_gets_a_queue_one_batch_at_a_time_in_order(rokka, clients):
    # g5-fifo-ordered is in the fixture's grpc.fifo_groups.
    topic = name("g5-ordered")
    p = clients.producer(topic)
    for i in range(6):
        p.send(message(topic, f"o-{i}".encode(), group="one-order"))
    c = clients.consumer("g5-fifo-ordered", topic)
    first = []
    deadline = time.time() + 10
    while len(first) < 2 and time.time() < deadline:
        first += c.receive(2 - len(first), 5)
    assert [m.body for m in first] == [b"o-0", b"o-1"]
    # Unacked and invisible: the queue gives this group nothing more.
    assert c.receive(4, 5) == []
    # A group not in fifo_groups is not held back.
    other = clients.consumer(name("g5-unordered"), topic)
    assert len(receive_all(other, 6)) == 6
    for m in first:
        c.ack(m)
    rest = receive_all(c, 4)
    assert [m.body for m in rest] == [f"o-{i}".encode() for i in range(2, 6)], "in send order after the acks"


def test_a_fifo_queue_redelivers_to_a_receive_asking_for_fewer_than_are_due(rokka, clients):
    topic = name("g5-ordered-few")
    p = clients.producer(topic)
    for i in range(3):
        p.send(message(topic, f"f-{i}".encode(), group="one-order"))
    c = clients.consumer("g5-fifo-ordered", topic)
    first = []
    deadline = time.time() + 10
    while len(first) < 2 and time.time() < deadline:
        first += c.receive(2 - len(first), 2)
    assert [m.body for m in first] == [b"f-0", b"f-1"]
    time.sleep(3)
    # Both are due again; asking for one must give the first of them, not
    # read as "some still invisible" and hold the queue for good.
    again = []
    deadline = time.time() + 10
    while not again and time.time() < deadline:
        again = c.receive(1, 5)
    assert [m.body for m in again] == [b"f-0"]
    assert again[0].delivery_attempt == 2


def test_a_fifo_receive_retried_with_its_attempt_id_gets_the_same_batch(rokka, clients):
    """A client whose receive timed out (DEADLINE_EXCEEDED: the answer
    lost) retries with the same attempt_id (the Java client, the Python
    PushConsumer): a FIFO queue gives that attempt the batch it took again,
    under new handles and not counted as a delivery, as Apache's orderly
    pop does — not nothing until the invisible time ends. Another attempt
    is still held back. Raw, with grpcio and Apache's generated stubs."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    topic, group = name("g5-attempt"), "g5-fifo-ordered"
    p = clients.producer(topic)
    for i in range(3):
        p.send(message(topic, f"a-{i}".encode(), group="one-order"))
    meta = raw_meta("raw-attempt-client")
    chan = grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}")

    def receive(attempt, batch=2, wait=1):
        req = receive_request(group, topic, batch=batch, invisible=60, wait=wait, attempt=attempt)
        return [r.message for r in stub.ReceiveMessage(req, timeout=10, metadata=meta) if r.HasField("message")]

    try:
        stub = MessagingServiceStub(chan)
        first = receive("attempt-1")
        assert [m.body for m in first] == [b"a-0", b"a-1"]
        again = receive("attempt-1")
        assert [m.body for m in again] == [b"a-0", b"a-1"], "the same attempt gets its batch again"
        assert [m.system_properties.delivery_attempt for m in again] == [1, 1], "not counted as a delivery"
        assert {m.system_properties.receipt_handle for m in again}.isdisjoint(
            m.system_properties.receipt_handle for m in first
        )
        assert receive("attempt-2") == [], "another attempt waits for the batch's acks"
        ack = s.AckMessageRequest(
            group=d.Resource(name=group),
            topic=d.Resource(name=topic),
            entries=[
                s.AckMessageEntry(message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle)
                for m in again
            ],
        )
        res = stub.AckMessage(ack, timeout=10, metadata=meta)
        assert [e.status.code for e in res.entries] == [d.Code.OK, d.Code.OK], res
        assert [m.body for m in receive("attempt-3", wait=5)] == [b"a-2"]
    finally:
        chan.close()


def test_a_waiting_fifo_receive_is_answered_when_the_queue_is_acked_or_nacked(rokka, clients):
    """A push consumer asks for its next batch while it still consumes the
    last one: on a FIFO queue that receive waits. The ack that unblocks
    the queue, or a nack (its retry backoff) that makes a message due
    sooner, answers it at once (Apache's ackOrderly wakes the pop's long
    polling) — not when its 20 s long poll ends. Raw, with grpcio and
    Apache's generated stubs."""
    import threading

    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    topic, group = name("g5-wake"), "g5-fifo-ordered"
    p = clients.producer(topic)
    for i in range(3):
        p.send(message(topic, f"w-{i}".encode(), group="one-order"))
    meta = raw_meta("raw-wake-client")
    chan = grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}")
    stub = MessagingServiceStub(chan)

    def receive(attempt, wait):
        req = receive_request(group, topic, invisible=60, wait=wait, attempt=attempt)
        return [r.message for r in stub.ReceiveMessage(req, timeout=40, metadata=meta) if r.HasField("message")]

    def waiting(attempt):
        """A 20 s receive started now: (thread, result list, start time)."""
        out = []
        t = threading.Thread(target=lambda: out.extend(receive(attempt, 20)))
        t.start()
        return t, out, time.time()

    try:
        first = []
        deadline = time.time() + 10
        while not first and time.time() < deadline:
            first = receive("wake-1", 2)
        assert [m.body for m in first] == [b"w-0"]
        # Acked while the next receive waits.
        t, out, started = waiting("wake-2")
        time.sleep(1.5)
        ack = s.AckMessageRequest(
            group=d.Resource(name=group),
            topic=d.Resource(name=topic),
            entries=[s.AckMessageEntry(message_id=first[0].system_properties.message_id,
                                       receipt_handle=first[0].system_properties.receipt_handle)],
        )
        assert [e.status.code for e in stub.AckMessage(ack, timeout=10, metadata=meta).entries] == [d.Code.OK]
        t.join(30)
        assert [m.body for m in out] == [b"w-1"]
        assert time.time() - started < 10, f"answered {time.time() - started:.1f} s after it began, not at the ack"
        # Nacked (due again in 1 s) while the next receive waits.
        t, again, started = waiting("wake-3")
        time.sleep(1.5)
        nack = s.ChangeInvisibleDurationRequest(
            group=d.Resource(name=group),
            topic=d.Resource(name=topic),
            receipt_handle=out[0].system_properties.receipt_handle,
            message_id=out[0].system_properties.message_id,
        )
        nack.invisible_duration.seconds = 1
        assert stub.ChangeInvisibleDuration(nack, timeout=10, metadata=meta).status.code == d.Code.OK
        t.join(30)
        assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"w-1", 2)]
        assert time.time() - started < 10, f"answered {time.time() - started:.1f} s after it began, not at the nack"
    finally:
        chan.close()


def test_a_group_is_consumed_by_pop_or_by_queue_owners_never_both(rokka, clients):
    """docs/rocketmq5.md: while a group has live Kafka (or remoting)
    members, pops of it are refused; while it has live pop consumers,
    Kafka members (and remoting consumers) are refused. Then the group
    moves across without losing its place."""
    from kafka.errors import KafkaError

    topic, group = name("g5-owners"), name("g5-owners-g")
    p = clients.producer(topic)
    for i in range(10):
        p.send(message(topic, f"k-{i}".encode()))
    k = KafkaConsumer(
        topic,
        bootstrap_servers=rokka.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=8000,
    )
    try:
        got = []
        for r in k:
            got.append(r.value)
            if len(got) == 6:
                break
        k.commit()
        # The Kafka member is live: the group refuses pops.
        c = clients.consumer(group, topic)
        with pytest.raises(Exception) as refused:
            c.receive(16, 10)
        assert "42800" in str(refused.value) or "queue" in str(refused.value), refused.value
    finally:
        k.close()
    # Gone (LeaveGroup): pops take over at the Kafka commit, once the
    # broker saw the group empty (its membership view ticks each second).
    deadline = time.time() + 10
    while True:
        try:
            rest = receive_all(c, 4, timeout=10)
            break
        except Exception as e:  # noqa: BLE001 - refused until the Kafka side is seen gone
            assert "42800" in str(e) and time.time() < deadline, e
            time.sleep(0.5)
    assert sorted(m.body for m in rest) == sorted(f"k-{i}".encode() for i in range(10) if f"k-{i}".encode() not in got)
    # Now pop consumers are live: a Kafka member is refused.
    k2 = KafkaConsumer(topic, bootstrap_servers=rokka.bootstrap, group_id=group, consumer_timeout_ms=3000)
    try:
        with pytest.raises(KafkaError):
            for _ in range(3):
                k2.poll(timeout_ms=2000)
                if k2.assignment():
                    break
        assert not k2.assignment(), "no partitions for a Kafka member of a pop group"
    finally:
        k2.close()
    assert metric(rokka, "rokka_mixed_group_conflicts_total", group=group) >= 2


def test_a_pop_group_shows_its_consumers_and_follows_a_forced_reset(rokka, clients):
    """`rokka group describe` lists a live SimpleConsumer (protocol
    rocketmq-pop); `reset-offsets` refuses while it lives unless forced;
    forced, the broker's pop state follows the new committed offsets and
    the same consumer receives everything again."""
    import json
    import subprocess

    from rokka_fixture import rokka_bin

    def cli(*args, expect=0):
        p = subprocess.run(
            [rokka_bin(), "group", *args, "--brokers", rokka.bootstrap, "--output", "json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == expect, f"rokka group {' '.join(args)}: exit {p.returncode}, {p.stderr}{p.stdout}"
        return (json.loads(p.stdout) if p.stdout.strip() else {}), p.stderr

    topic, group = name("g5-reset"), name("g5-reset-g")
    p = clients.producer(topic)
    bodies = sorted(f"r-{i}".encode() for i in range(12))
    for b in bodies:
        p.send(message(topic, b))
    c = clients.consumer(group, topic)
    assert sorted(m.body for m in receive_all(c, 12)) == bodies
    # One more, received and held unacked across the reset.
    p.send(message(topic, b"r-late"))
    held = receive_all(c, 1, ack=False)
    assert [m.body for m in held] == [b"r-late"], held
    bodies = sorted(bodies + [b"r-late"])
    d, _ = cli("describe", group)
    pops = [m for m in d["members"] if m["protocol"] == "rocketmq-pop"]
    assert len(pops) == 1 and d["group"][0]["state"] == "Stable", d
    assert sum(x["lag"] for x in d["offsets"] if x["topic"] == topic) == 1, d
    _, err = cli("reset-offsets", group, "--topic", topic, "--to-earliest", "--execute", expect=1)
    assert "member" in err and "--force" in err, err
    out, _ = cli("reset-offsets", group, "--topic", topic, "--to-earliest", "--execute", "--force")
    assert {x["new"] for x in out["plan"]} == {0}, out
    assert [m["protocol"] for m in out["members"]] == ["rocketmq-pop"], out
    # The handle from before the reset is stale: its ack must not commit
    # past the reset.
    with pytest.raises(Exception):
        c.ack(held[0])
    again = receive_all(c, 13)
    assert sorted(m.body for m in again) == bodies, "the pop group starts over at the reset offsets"
    assert all(m.delivery_attempt == 1 for m in again)
    assert metric(rokka, "rokka_rocketmq5_pop_rewinds_total") >= 1


def test_ready_and_invisible_messages_per_group(rokka, clients):
    """RIP-46's ready and in-flight counts per topic and group, read at
    scrape time: what is left to receive, and what is out and invisible."""
    topic, group = name("g5-ready"), name("g5-ready-g")
    p = clients.producer(topic)
    for i in range(6):
        p.send(message(topic, f"ready-{i}".encode()))
    c = clients.consumer(group, topic)
    got = []
    deadline = time.time() + 20
    while not got and time.time() < deadline:
        got = c.receive(2, 30)
    assert 1 <= len(got) <= 2, got
    assert metric(rokka, "rokka_rocketmq5_messages_invisible", topic=topic, group=group) == len(got)
    assert metric(rokka, "rokka_rocketmq5_messages_ready", topic=topic, group=group) == 6 - len(got)
    for m in got:
        c.ack(m)
    assert metric(rokka, "rokka_rocketmq5_messages_invisible", topic=topic, group=group) == 0


def test_sends_to_the_brokers_own_topics_are_forbidden(rokka, clients):
    # The transaction op topic: a record there would be read back as the
    # broker's own (other producers' half messages marked resolved).
    topic = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
    p = clients.producer(topic)
    with pytest.raises(Exception) as e:  # noqa: PT011 - the client's own exception type is checked below
        p.send(message(topic, b"0,1,2,"))
    assert type(e.value).__name__ == "ForbiddenException", repr(e.value)
    assert "is forbidden" in str(e.value), repr(e.value)


def test_routes_name_an_advertised_dns_name_and_the_client_sends_through_it():
    # grpc.advertised_addr as a container or a load balancer is reached: a
    # DNS name. Routes give it as a domain-name endpoint; the client opens
    # its sends and receives at that endpoint, not at the one it dialled.
    from conftest import GRPC, running

    with running("rocketmq5", "advertised-dns", grpc_extra=GRPC + 'advertised_addr = "localhost:1"\n') as r:
        port = r.grpc_port
        r.stop()
        with open(r.config) as f:
            text = f.read()
        with open(r.config, "w") as f:
            f.write(text.replace('"localhost:1"', f'"localhost:{port}"'))
        r.start()
        assert r.grpc_port == port
        clients = Clients(r)
        try:
            topic, group = name("g5-dns"), name("g5-dns-g")
            p = clients.producer(topic)
            for i in range(3):
                p.send(message(topic, f"dns-{i}".encode()))
            got = receive_all(clients.consumer(group, topic), 3)
            assert sorted(m.body for m in got) == [b"dns-0", b"dns-1", b"dns-2"]
        finally:
            clients.close()
