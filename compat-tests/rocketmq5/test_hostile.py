"""Broken and hostile input on the gRPC port: garbage bytes, oversized and
malformed requests, unknown methods. Each gets a clean error or close;
the broker keeps serving real clients."""
import socket
import time
import uuid

import grpc
import pytest
from conftest import receive_all
from test_grpc import Clients, message

SERVICE = "/apache.rocketmq.v2.MessagingService/"


def raw_call(rokka, method, payload, timeout=5):
    with grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}") as ch:
        call = ch.unary_unary(SERVICE + method, request_serializer=None, response_deserializer=None)
        return call(payload, timeout=timeout)


def still_serves(rokka):
    topic = f"g5-alive-{uuid.uuid4().hex[:8]}"
    c = Clients(rokka)
    try:
        c.producer(topic).send(message(topic, b"alive"))
        got = receive_all(c.consumer(f"g5-alive-g-{uuid.uuid4().hex[:6]}", topic), 1)
        assert [m.body for m in got] == [b"alive"]
    finally:
        c.close()


def test_garbage_bytes_get_the_connection_closed(rokka):
    for junk in (b"\x00" * 64, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 100):
        s = socket.create_connection(("127.0.0.1", rokka.grpc_port), timeout=10)
        s.sendall(junk)
        deadline = time.time() + 10
        closed = False
        while time.time() < deadline:
            try:
                if s.recv(65536) == b"":
                    closed = True
                    break
            except (ConnectionResetError, socket.timeout):
                closed = True
                break
        s.close()
        assert closed, f"connection left open after {junk[:20]!r}"
    still_serves(rokka)


def test_oversized_malformed_and_unknown_requests_get_status_codes(rokka):
    # Over grpc.max_request_bytes (8 MiB by default).
    with pytest.raises(grpc.RpcError) as big:
        raw_call(rokka, "SendMessage", b"\x0a" + b"\xff" * (9 << 20), timeout=20)
    # tonic refuses by the length prefix, before reading the body.
    assert big.value.code() == grpc.StatusCode.OUT_OF_RANGE, big.value
    # Not protobuf: a lying length prefix inside the message.
    with pytest.raises(grpc.RpcError) as bad:
        raw_call(rokka, "SendMessage", b"\x0a\xff\xff\xff\xff\x0f" + b"x" * 10)
    assert bad.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT), bad.value
    with pytest.raises(grpc.RpcError) as unknown:
        raw_call(rokka, "NoSuchMethod", b"")
    assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED, unknown.value
    # A receipt handle that is not one: a per-entry status, not a failure.
    from rocketmq.grpc_protocol import service_pb2

    req = service_pb2.AckMessageRequest()
    req.group.name = "g5-nobody"
    req.topic.name = "g5-nothing"
    e = req.entries.add()
    e.message_id = "x"
    e.receipt_handle = "r1_ffffffff_ffffffffffffffff_0" + "z" * 1000
    resp = service_pb2.AckMessageResponse.FromString(raw_call(rokka, "AckMessage", req.SerializeToString()))
    assert resp.entries[0].status.code == 40013  # INVALID_RECEIPT_HANDLE
    still_serves(rokka)


def test_offsets_of_queues_that_do_not_exist_are_refused(rokka):
    # The committed-offset table is shared by every protocol and budgeted:
    # UpdateOffset names an existing topic's existing queue, or is refused.
    from rocketmq.grpc_protocol import service_pb2

    topic = f"g5-upd-{uuid.uuid4().hex[:8]}"
    c = Clients(rokka)
    try:
        c.producer(topic).send(message(topic, b"x"))
    finally:
        c.close()

    def update(t, q):
        req = service_pb2.UpdateOffsetRequest()
        req.group.name = "g5-upd-group"
        req.message_queue.topic.name = t
        req.message_queue.id = q
        req.offset = 1
        return service_pb2.UpdateOffsetResponse.FromString(raw_call(rokka, "UpdateOffset", req.SerializeToString()))

    assert update(topic, 0).status.code == 20000  # OK
    assert update(topic, 4096).status.code == 40000  # BAD_REQUEST: no such queue
    assert update(f"{topic}-none", 0).status.code == 40402  # TOPIC_NOT_FOUND


def test_a_transaction_id_of_another_topics_message_is_refused(rokka):
    # EndTransaction's id names a half message; the request's topic (what
    # the ACL check reads) must be that message's.
    from rocketmq import Producer
    from rocketmq.grpc_protocol import definition_pb2, service_pb2
    from test_grpc import Checker, config

    secret, mine = f"g5-tx-secret-{uuid.uuid4().hex[:6]}", f"g5-tx-mine-{uuid.uuid4().hex[:6]}"
    p = Producer(config(rokka), (secret, mine), checker=Checker())
    p.startup()
    try:
        # A topic of "mine" exists; the half message is of "secret".
        p.send(message(mine, b"mine"))
        receipt = p.send(message(secret, b"pending"), p.begin_transaction())
    finally:
        p.shutdown()
    end = service_pb2.EndTransactionRequest()
    end.topic.name = mine
    end.message_id = receipt.message_id
    end.transaction_id = receipt.transaction_id
    end.resolution = definition_pb2.COMMIT
    resp = service_pb2.EndTransactionResponse.FromString(raw_call(rokka, "EndTransaction", end.SerializeToString()))
    assert resp.status.code == 40008, resp  # INVALID_TRANSACTION_ID
    # Named with its own topic it ends.
    end.topic.name = secret
    resp = service_pb2.EndTransactionResponse.FromString(raw_call(rokka, "EndTransaction", end.SerializeToString()))
    assert resp.status.code == 20000, resp


def test_the_brokers_own_topics_and_groups_are_refused(rokka):
    """A delayed message waits in the broker's own topics until it is due;
    a consumer of those topics would read it (and every other topic's
    delayed and uncommitted messages) early, and one committing under the
    broker's progress groups would move its transaction checks and delays.
    Refused as Apache's proxy refuses them (GrpcValidator: ILLEGAL_TOPIC
    "cannot access system topic", ILLEGAL_CONSUMER_GROUP)."""
    topic = f"g5-sys-{uuid.uuid4().hex[:8]}"
    c = Clients(rokka)
    try:
        c.producer(topic).send(message(topic, b"not-yet", deliver_at=int(time.time()) + 120))
        for sys_topic in ("rmq_sys_wheel_timer", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC"):
            got, error = [], None
            try:
                got = receive_all(c.consumer(f"g5-peek-{uuid.uuid4().hex[:6]}", sys_topic), 1, timeout=3)
            except Exception as e:  # noqa: BLE001 - the client raises the refusal
                error = str(e)
            assert not got, f"{sys_topic}: read the broker's own records {[m.body for m in got]}"
            assert error and ("system topic" in error or "ILLEGAL_TOPIC" in error), f"{sys_topic}: {error}"
        for sys_group in ("CID_RMQ_SYS_TRANS", "%SCHEDULE%"):
            error = None
            try:
                receive_all(c.consumer(sys_group, topic), 1, timeout=3)
            except Exception as e:  # noqa: BLE001
                error = str(e)
            assert error and ("system consumer group" in error or "ILLEGAL_CONSUMER_GROUP" in error), \
                f"{sys_group}: {error}"
    finally:
        c.close()
    still_serves(rokka)


def test_a_client_id_longer_than_a_client_sends_is_refused(rokka):
    """The broker keeps a call's x-mq-client-id with each pop consumer and
    auto-renewed message (the clients send some tens of bytes; hyper takes
    headers of up to 16 KiB): over 256 bytes the call is BAD_REQUEST, a
    Telemetry stream INVALID_ARGUMENT; a real id is served."""
    from rocketmq.grpc_protocol import service_pb2

    req = service_pb2.QueryRouteRequest()
    req.topic.name = f"g5-id-{uuid.uuid4().hex[:8]}"
    with grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}") as ch:
        call = ch.unary_unary(SERVICE + "QueryRoute", request_serializer=None, response_deserializer=None)
        long_id = [("x-mq-client-id", "c" * 4096)]
        resp = service_pb2.QueryRouteResponse.FromString(call(req.SerializeToString(), timeout=5, metadata=long_id))
        assert resp.status.code == 40000, resp.status  # BAD_REQUEST
        assert "x-mq-client-id" in resp.status.message
        ok = service_pb2.QueryRouteResponse.FromString(
            call(req.SerializeToString(), timeout=5, metadata=[("x-mq-client-id", "host@1@0@abcdef")]))
        assert ok.status.code == 20000, ok.status  # OK
        telemetry = ch.stream_stream(SERVICE + "Telemetry", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as e:
            for _ in telemetry(iter([b""]), timeout=5, metadata=long_id):
                pass
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    assert rokka.metric_values().get('rokka_rocketmq5_requests_refused_total{reason="client_id"}', 0) >= 1
    still_serves(rokka)
