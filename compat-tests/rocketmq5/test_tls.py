"""TLS on the gRPC listener with the RocketMQ 5 Python client's
tls_enable (gRPC's secure channel, trusting the test CA)."""
import os
import sys
import uuid

import grpc
import pytest
from conftest import GRPC, receive_all
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from test_grpc import message

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from pki import make_pki  # noqa: E402
from rokka_fixture import results_dir, running  # noqa: E402


@pytest.fixture(scope="module")
def tls_rokka():
    pki = make_pki(results_dir("rocketmq5", "tls-pki"))
    # gRPC core reads its default roots from here at the first secure channel.
    os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = pki["ca.pem"]
    extra = GRPC + f'tls_certificate = "{pki["server.pem"]}"\ntls_key = "{pki["server.key"]}"\n'
    with running("rocketmq5", "tls", grpc_extra=extra) as r:
        yield r


def test_the_python_client_sends_and_receives_over_tls(tls_rokka):
    cfg = ClientConfiguration(f"127.0.0.1:{tls_rokka.grpc_port}", Credentials())
    topic = f"g5-tls-{uuid.uuid4().hex[:8]}"
    p = Producer(cfg, (topic,), tls_enable=True)
    p.startup()
    try:
        bodies = [os.urandom(100) for _ in range(5)]
        for b in bodies:
            p.send(message(topic, b))
    finally:
        p.shutdown()
    c = SimpleConsumer(cfg, f"g5-tls-g-{uuid.uuid4().hex[:6]}", {topic: FilterExpression("*")}, await_duration=2, tls_enable=True)
    c.startup()
    try:
        got = receive_all(c, 5)
    finally:
        c.shutdown()
    assert sorted(m.body for m in got) == sorted(bodies)
    assert tls_rokka.metric_values().get('rokka_rocketmq5_tls_handshakes_total{result="ok"}', 0) >= 2


def test_plaintext_is_refused_on_the_tls_port(tls_rokka):
    with grpc.insecure_channel(f"127.0.0.1:{tls_rokka.grpc_port}") as ch:
        call = ch.unary_unary("/apache.rocketmq.v2.MessagingService/Heartbeat", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as e:
            call(b"", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
    assert tls_rokka.metric_values().get('rokka_rocketmq5_tls_handshakes_total{result="failed"}', 0) >= 1
