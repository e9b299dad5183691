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


@pytest.fixture(scope="module")
def mtls_rokka():
    pki = make_pki(results_dir("rocketmq5", "mtls-pki"))
    extra = (
        GRPC + f'tls_certificate = "{pki["server.pem"]}"\ntls_key = "{pki["server.key"]}"\n'
        f'tls_client_ca = "{pki["ca.pem"]}"\n'
    )
    # Kafka's plaintext clients (User:ANONYMOUS) make the topic; every gRPC
    # caller presents a certificate.
    sections = '[security]\nauthorization = true\nsuper_users = ["User:CN=alice", "User:ANONYMOUS"]\n'
    with running("rocketmq5", "mtls", grpc_extra=extra + sections) as r:
        r.pki = pki
        yield r


def query_route(r, topic, cert, key):
    """QueryRoute over gRPC with a client certificate (grpcio, the RocketMQ
    client's own protocol modules: the Python client has no setting for a
    client certificate); the answer's status code, or the RpcError's."""
    from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

    pki = r.pki
    creds = grpc.ssl_channel_credentials(
        root_certificates=open(pki["ca.pem"], "rb").read(),
        private_key=open(key, "rb").read() if key else None,
        certificate_chain=open(cert, "rb").read() if cert else None,
    )
    # A channel of its own subchannels: gRPC core shares connections
    # between channels of equal arguments, and credentials are compared by
    # address — a freed one's address reused would send this call over
    # the previous call's TLS session, under the other certificate.
    with grpc.secure_channel(f"127.0.0.1:{r.grpc_port}", creds, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        req = service_pb2.QueryRouteRequest(
            topic=definition_pb2.Resource(name=topic),
            endpoints=definition_pb2.Endpoints(
                scheme=definition_pb2.AddressScheme.IPv4,
                addresses=[definition_pb2.Address(host="127.0.0.1", port=r.grpc_port)],
            ),
        )
        try:
            resp = stub.QueryRoute(req, timeout=10)
        except grpc.RpcError as e:
            return e.code()
        return resp.status.code


def test_a_client_certificate_names_the_caller_the_acls_decide_for(mtls_rokka):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": mtls_rokka.bootstrap})
    for f in admin.create_topics([NewTopic("g5-mtls", 2, 1)]).values():
        f.result(15)
    pki = mtls_rokka.pki
    # CN=alice is a super user; CN=node, signed by the same CA, has no ACL;
    # no certificate: no TLS session at all.
    got = [
        query_route(mtls_rokka, "g5-mtls", pki["client.pem"], pki["client.key"]),
        query_route(mtls_rokka, "g5-mtls", pki["node.pem"], pki["node.key"]),
        query_route(mtls_rokka, "g5-mtls", None, None),
    ]
    assert got == [20000, 40300, grpc.StatusCode.UNAVAILABLE], got  # OK, FORBIDDEN, no session
    denied = sum(v for k, v in mtls_rokka.metric_values().items()
                 if k.startswith("rokka_authorization_denied_total{") and 'protocol="rocketmq5"' in k)
    assert denied >= 1


def test_client_certificates_asked_on_a_plaintext_port_stop_the_start():
    """grpc.tls_client_ca without a server certificate would ask no one for
    a certificate: the node does not start, and says why."""
    from rokka_fixture import Rokka

    r = Rokka(results_dir("rocketmq5", "mtls-no-cert"), grpc_extra=GRPC + 'tls_client_ca = "ca.pem"\n')
    with pytest.raises(RuntimeError):
        r.start(timeout=15)
    r.close()
    with open(r.log_path) as f:
        log = f.read()
    assert "grpc.tls_client_ca needs grpc.tls_certificate" in log, log[-2000:]
