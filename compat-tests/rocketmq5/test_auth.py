"""Authentication and ACLs on the gRPC listener with the RocketMQ 5 Python
client's Credentials (MQv2-HMAC-SHA1): users made through RocketMQ's user
admin (the remoting harness), ACLs made through the Kafka admin API
(kafka-python over SASL PLAIN as a super user) — one table both decide by."""
import os
import sys
import time
import uuid

import pytest
from conftest import GRPC, harness, receive_all
from kafka.admin import ACL, ACLOperation, ACLPermissionType, KafkaAdminClient, ResourcePattern, ResourceType
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from test_grpc import message, metric

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from dashboard import families, metric_names  # noqa: E402
from rokka_fixture import running  # noqa: E402

PASSWORDS = {"admin": "admin-pw", "grace": "grace-pw", "hank": "hank-pw"}
RUN = uuid.uuid4().hex[:6]
TOPIC, GROUP = f"g5-auth-{RUN}", f"g5-auth-g-{RUN}"


@pytest.fixture(scope="module")
def rokka():
    with running(
        "rocketmq5",
        "auth",
        grpc_extra=GRPC + "auth_max_failures_per_address = 1000\n",
        kafka_extra='sasl_listen = "127.0.0.1:0"\n',
        broker_extra="default_partitions = 2",
        rocketmq_extra='[security]\nsuper_users = ["User:admin"]\n',
    ) as r:
        # Users first, with authorization off; each password is the user's
        # RocketMQ secret and its SCRAM/PLAIN password.
        for user, pw in PASSWORDS.items():
            assert "created " + user in harness(r, "create-user", f"127.0.0.1:{r.broker_port}", user, pw)
        r.restart_with_authorization()
        admin = kafka_admin(r)
        allow = lambda rt, n, op: ACL("User:grace", "*", op, ACLPermissionType.ALLOW, ResourcePattern(rt, n))  # noqa: E731
        res = admin.create_acls([
            allow(ResourceType.TOPIC, TOPIC, ACLOperation.WRITE),
            allow(ResourceType.TOPIC, TOPIC, ACLOperation.READ),
            allow(ResourceType.GROUP, GROUP, ACLOperation.READ),
            allow(ResourceType.CLUSTER, "kafka-cluster", ACLOperation.CREATE),
            # hank may read the topic, but not as a member of GROUP.
            ACL("User:hank", "*", ACLOperation.READ, ACLPermissionType.ALLOW, ResourcePattern(ResourceType.TOPIC, TOPIC)),
        ])
        assert not res["failed"], res
        admin.close()
        yield r


def kafka_admin(r):
    return KafkaAdminClient(
        bootstrap_servers=f"127.0.0.1:{r.sasl_port}",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="admin",
        sasl_plain_password=PASSWORDS["admin"],
    )


def cfg(r, user=None, secret=None):
    creds = Credentials(user, secret if secret is not None else PASSWORDS[user]) if user else Credentials()
    return ClientConfiguration(f"127.0.0.1:{r.grpc_port}", creds)


def send_error(r, topic, user=None, secret=None):
    """The exception a producer of `user` gets sending to `topic` (None: sent)."""
    p = Producer(cfg(r, user, secret), (topic,))
    p.startup()
    try:
        p.send(message(topic, b"x"))
        return None
    except Exception as e:  # noqa: BLE001 - the client's own exception types are what is checked
        return e
    finally:
        p.shutdown()


def test_a_user_with_the_acls_sends_and_receives(rokka):
    p = Producer(cfg(rokka, "grace"), (TOPIC,))
    p.startup()
    try:
        bodies = [os.urandom(80) for _ in range(6)]
        for b in bodies:
            p.send(message(TOPIC, b))
    finally:
        p.shutdown()
    c = SimpleConsumer(cfg(rokka, "grace"), GROUP, {TOPIC: FilterExpression("*")}, await_duration=2)
    c.startup()
    try:
        got = receive_all(c, 6)
    finally:
        c.shutdown()
    assert sorted(m.body for m in got) == sorted(bodies)


def refused_route(caplog, code, text):
    """Whether the client logged a route query refused with `code` and `text`
    (a producer reports a refused route as a failed route fetch)."""
    return any(f"{code}, " in r.getMessage() and text in r.getMessage() for r in caplog.records)


def test_sends_without_write_are_forbidden_and_wrong_secrets_unauthorized(rokka, caplog):
    before = metric(rokka, "rokka_authorization_denied_total", protocol="rocketmq5")
    other = f"g5-auth-other-{RUN}"
    # No DESCRIBE on the topic: its route is refused FORBIDDEN (40300).
    e = send_error(rokka, other, "grace")
    assert e is not None and refused_route(caplog, 40300, f"User:grace may not Describe topic {other}"), repr(e)
    # Anonymous (the client's empty Credentials) has no ACL of its own.
    e = send_error(rokka, TOPIC)
    assert e is not None and refused_route(caplog, 40300, "User:ANONYMOUS may not Describe"), repr(e)
    # hank sees the topic (READ implies DESCRIBE) but may not write to it.
    e = send_error(rokka, TOPIC, "hank")
    assert type(e).__name__ == "ForbiddenException" and "User:hank may not Write topic" in str(e), repr(e)
    # A wrong secret or an unknown user: UNAUTHORIZED (40100), whatever asked.
    e = send_error(rokka, TOPIC, "grace", "not-her-secret")
    assert e is not None and refused_route(caplog, 40100, "AccessKey grace failed: signature mismatch"), repr(e)
    e = send_error(rokka, TOPIC, "nobody", "pw")
    assert e is not None and refused_route(caplog, 40100, "AccessKey nobody failed: unknown AccessKey"), repr(e)
    assert metric(rokka, "rokka_authorization_denied_total", protocol="rocketmq5") >= before + 3
    assert metric(rokka, "rokka_rocketmq5_authentications_failed_total", reason="signature") >= 2
    # The refused topic was not auto-created by the refused route queries:
    # grace may create (CLUSTER CREATE) but not see it (no DESCRIBE).
    admin = kafka_admin(rokka)
    try:
        assert other not in admin.list_topics()
    finally:
        admin.close()


def test_a_consumer_without_read_on_its_group_is_forbidden(rokka):
    c = SimpleConsumer(cfg(rokka, "hank"), GROUP, {TOPIC: FilterExpression("*")}, await_duration=1)
    c.startup()
    try:
        deadline, err = time.time() + 10, None
        while err is None and time.time() < deadline:
            try:
                c.receive(4, 10)
            except Exception as e:  # noqa: BLE001
                err = e
    finally:
        c.shutdown()
    assert type(err).__name__ == "ForbiddenException" and f"Read group {GROUP}" in str(err), repr(err)


def test_the_dashboards_security_metrics_are_exported(rokka):
    """With security on and the refusals above (plus a remoting request
    signed with a wrong secret): every metric of the dashboard's Security
    row is exported, with its HELP."""
    lines = harness(rokka, "create-user", f"127.0.0.1:{rokka.broker_port}", "ivy", "ivy-pw",
                    env={"COMPAT_ACCESS_KEY": "grace", "COMPAT_SECRET_KEY": "wrong"}, check=False)
    assert any("create-user failed" in l for l in lines), lines
    seen = families(rokka.metrics())
    used = metric_names("Security")
    missing = {m: where for m, where in used.items() if m not in seen}
    assert not missing, f"used by the dashboard but not exported: {missing}"
    assert all(seen[m] for m in used), "every one has a HELP text"


def test_the_go_and_cpp_clients_credential_forms_name_the_user(rokka):
    """The Go client signs `Credential=<ak>//Rocketmq`, the C++ client
    `Credential=<ak>/<region>/RocketMQ`: the user is the part before the
    first '/', as Apache's proxy reads it. Raw SendMessage calls with
    grpcio and Apache's stubs, signed as those clients sign (hex HMAC-SHA1
    of x-mq-date-time with the secret)."""
    import hashlib
    import hmac

    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    def send(credential, secret):
        when = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        sig = hmac.new(secret.encode(), when.encode(), hashlib.sha1).hexdigest().upper()
        meta = [
            ("x-mq-client-id", f"raw-{credential}"),
            ("x-mq-language", "GOLANG"),
            ("x-mq-protocol", "v2"),
            ("x-mq-date-time", when),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={credential}, SignedHeaders=x-mq-date-time, Signature={sig}"),
        ]
        m = d.Message(topic=d.Resource(name=TOPIC), body=b"signed")
        m.system_properties.message_id = uuid.uuid4().hex.upper()
        m.system_properties.body_encoding = d.Encoding.IDENTITY
        m.system_properties.message_type = d.MessageType.NORMAL
        with grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}") as ch:
            res = MessagingServiceStub(ch).SendMessage(s.SendMessageRequest(messages=[m]), timeout=10, metadata=meta)
        return res.status.code

    assert send("grace//Rocketmq", PASSWORDS["grace"]) == d.Code.OK
    assert send("grace/cn-hangzhou/RocketMQ", PASSWORDS["grace"]) == d.Code.OK
    assert send("grace//Rocketmq", "wrong") == d.Code.UNAUTHORIZED
    # hank may not write the topic: the user named is the one decided on.
    assert send("hank//Rocketmq", PASSWORDS["hank"]) == d.Code.FORBIDDEN
