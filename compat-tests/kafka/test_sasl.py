"""Kafka SASL (docs/security.md): SCRAM-SHA-256/512 and PLAIN against one
users table, whose salted credentials are managed with
AlterUserScramCredentials. Clients: confluent-kafka (librdkafka) over
SASL_PLAINTEXT and SASL_SSL, kafka-python with PLAIN, and kafka-python 2.0.2
(SaslHandshake v0: raw tokens) with PLAIN and SCRAM."""
import os
import socket
import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
from conftest import results_dir, running
from test_tls import make_pki

USERS = {
    "alice": (ScramMechanism.SCRAM_SHA_512, "alice-secret"),
    "bob": (ScramMechanism.SCRAM_SHA_256, "bob-secret"),
}


@pytest.fixture(scope="module")
def pki():
    return make_pki(results_dir("kafka", "sasl-pki"))


@pytest.fixture(scope="module")
def sasl(pki):
    extra = (
        'sasl_listen = "127.0.0.1:0"\nsuper_users = ["alice"]\nsasl_max_failures_per_address = 1000\n'
        'ssl_listen = "127.0.0.1:0"\nssl_sasl = true\n'
        f'ssl_certificate = "{pki["server.pem"]}"\nssl_key = "{pki["server.key"]}"\n'
    )
    with running("kafka", "sasl", kafka_extra=extra) as r:
        # Users are made over the plaintext (loopback) listener, as Kafka's
        # are bootstrapped before any SASL client can connect.
        admin = AdminClient({"bootstrap.servers": r.bootstrap})
        ups = [UserScramCredentialUpsertion(u, ScramCredentialInfo(m, 4096), p.encode()) for u, (m, p) in USERS.items()]
        for f in admin.alter_user_scram_credentials(ups).values():
            f.result(15)
        yield r


def scram(r, user, password=None, mechanism=None, ssl=None):
    m, p = USERS[user]
    conf = {
        "bootstrap.servers": f"127.0.0.1:{r.sasl_port}",
        "security.protocol": "sasl_plaintext",
        "sasl.mechanism": mechanism or ("SCRAM-SHA-512" if m == ScramMechanism.SCRAM_SHA_512 else "SCRAM-SHA-256"),
        "sasl.username": user,
        "sasl.password": password or p,
    }
    if ssl:
        conf.update({"bootstrap.servers": f"127.0.0.1:{r.ssl_port}", "security.protocol": "sasl_ssl", "ssl.ca.location": ssl})
    return conf


def round_trip(conf, topic, n=30):
    p = Producer(conf)
    for i in range(n):
        p.produce(topic, value=f"{topic}-{i}".encode())
    assert p.flush(30) == 0
    c = Consumer({**conf, "group.id": f"{topic}-group", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got, deadline = [], time.time() + 30
    while len(got) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    c.close()
    assert got == [f"{topic}-{i}" for i in range(n)]
    assert committed == n


def test_scram_sha_512_and_256_produce_consume_and_groups(sasl):
    round_trip(scram(sasl, "alice"), "sasl-512")
    round_trip(scram(sasl, "bob"), "sasl-256")


def test_scram_sha_512_over_sasl_ssl(sasl, pki):
    round_trip(scram(sasl, "alice", ssl=pki["ca.pem"]), "sasl-ssl")


def test_kafka_python_with_plain(sasl):
    from kafka import KafkaConsumer, KafkaProducer

    common = dict(
        bootstrap_servers=f"127.0.0.1:{sasl.sasl_port}",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="bob",
        sasl_plain_password="bob-secret",
    )
    p = KafkaProducer(**common)
    for i in range(10):
        p.send("sasl-plain", f"plain-{i}".encode())
    p.flush(30)
    p.close()
    c = KafkaConsumer("sasl-plain", group_id="plain-group", auto_offset_reset="earliest", consumer_timeout_ms=10000, **common)
    got = [m.value.decode() for m in c]
    c.close()
    assert got == [f"plain-{i}" for i in range(10)]


# kafka-python up to 2.0.2 (PyPI's release from 2020 into 2025, still in
# many installs) sends SaslHandshake v0 and then the mechanism's messages
# as raw size-prefixed tokens; run.sh installs it in a venv of its own.
KP202 = os.path.join(os.path.dirname(__file__), "..", "..", "target", "kp202-venv", "bin", "python")
KP202_SCRIPT = r"""
import sys
from kafka import KafkaConsumer, KafkaProducer
port, mech, user, password, topic = sys.argv[1:6]
common = dict(bootstrap_servers=f"127.0.0.1:{port}", security_protocol="SASL_PLAINTEXT",
              sasl_mechanism=mech, sasl_plain_username=user, sasl_plain_password=password)
p = KafkaProducer(**common)
for i in range(5):
    p.send(topic, f"{topic}-{i}".encode())
p.flush(30)
p.close()
c = KafkaConsumer(topic, group_id=topic + "-g", auto_offset_reset="earliest", consumer_timeout_ms=20000, **common)
got = []
for m in c:
    got.append(m.value.decode())
    if len(got) == 5:
        break
print(",".join(got))
c.close()
"""


@pytest.mark.parametrize("mech,user", [("PLAIN", "bob"), ("SCRAM-SHA-256", "bob"), ("SCRAM-SHA-512", "alice")])
def test_kafka_python_2_0_2_with_raw_sasl_tokens(sasl, mech, user):
    import subprocess

    assert os.path.exists(KP202), "run.sh installs kafka-python 2.0.2 in target/kp202-venv"
    topic = f"sasl-v0-{mech.lower()}"
    out = subprocess.run(
        [KP202, "-c", KP202_SCRIPT, str(sasl.sasl_port), mech, user, USERS[user][1], topic],
        capture_output=True, text=True, timeout=90,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == ",".join(f"{topic}-{i}" for i in range(5))
    # A wrong password: the connection is closed (no error can be sent in
    # the raw form), and the client reports an authentication failure.
    bad = subprocess.run(
        [KP202, "-c", KP202_SCRIPT, str(sasl.sasl_port), mech, user, "wrong", topic],
        capture_output=True, text=True, timeout=90,
    )
    assert bad.returncode != 0
    assert "Authentication" in bad.stderr or "authentication" in bad.stderr or "NoBrokersAvailable" in bad.stderr, bad.stderr[-2000:]


def test_a_wrong_password_is_an_authentication_error_not_a_hang(sasl):
    for conf in (scram(sasl, "alice", password="wrong"), scram(sasl, "bob", mechanism="PLAIN", password="wrong"),
                 scram(sasl, "alice", mechanism="SCRAM-SHA-256")):  # alice has no SHA-256 credential
        errors = []
        p = Producer({**conf, "error_cb": errors.append})
        started = time.time()
        while not errors and time.time() - started < 15:
            p.poll(0.2)
        assert errors, conf
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), [str(e) for e in errors]
        assert time.time() - started < 10
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KPError

    started = time.time()
    with pytest.raises(KPError):
        kp = KafkaProducer(bootstrap_servers=f"127.0.0.1:{sasl.sasl_port}", security_protocol="SASL_PLAINTEXT",
                           sasl_mechanism="PLAIN", sasl_plain_username="bob", sasl_plain_password="nope",
                           max_block_ms=5000, request_timeout_ms=5000)
        kp.send("sasl-plain", b"never").get(timeout=10)
    # kafka-python 3.0 retries a refused bootstrap until its own timeout
    # (30 s), then fails: bounded, not a hang.
    assert time.time() - started < 45
    failed = [l for l in sasl.metrics().splitlines()
              if l.startswith("rokka_kafka_sasl_authentications_total") and 'result="failed"' in l]
    assert sum(float(l.rsplit(" ", 1)[1]) for l in failed) >= 4, failed


def test_unauthenticated_clients_are_refused_on_the_sasl_listener(sasl):
    plain = AdminClient({"bootstrap.servers": f"127.0.0.1:{sasl.sasl_port}"})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)
    refused = [l for l in sasl.metrics().splitlines() if l.startswith("rokka_kafka_unauthenticated_requests_total")]
    assert refused and float(refused[0].rsplit(" ", 1)[1]) >= 1, refused


def test_credentials_are_described_and_removed_through_the_admin_api(sasl):
    from confluent_kafka.admin import UserScramCredentialDeletion

    admin = AdminClient(scram(sasl, "alice"))
    desc = {u: f.result(10) for u, f in admin.describe_user_scram_credentials(["alice", "bob"]).items()}
    assert [(i.mechanism, i.iterations) for i in desc["alice"].scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_512, 4096)
    ]
    assert [(i.mechanism, i.iterations) for i in desc["bob"].scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_256, 4096)
    ]
    # Only super users change credentials over SASL (no ACLs yet).
    as_bob = AdminClient(scram(sasl, "bob"))
    attempt = [UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"takeover")]
    with pytest.raises(KafkaException) as refused:
        for f in as_bob.alter_user_scram_credentials(attempt).values():
            f.result(10)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, refused.value
    assert AdminClient(scram(sasl, "bob")).list_topics(timeout=10).brokers, "bob's password unchanged"
    # The credentials file is the broker user's alone.
    mode = os.stat(os.path.join(sasl.workdir, "data", "config", "users.json")).st_mode
    assert mode & 0o077 == 0, oct(mode)
    # A third user, then removed: it can no longer log in.
    ups = [UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"carol-pw")]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(10)
    carol = {**scram(sasl, "bob"), "sasl.username": "carol", "sasl.password": "carol-pw"}
    assert AdminClient(carol).list_topics(timeout=10).brokers
    for f in admin.alter_user_scram_credentials([UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256)]).values():
        f.result(10)
    with pytest.raises(KafkaException):
        AdminClient(carol).list_topics(timeout=5)


def test_before_authentication_a_large_frame_or_silence_closes_the_connection(sasl):
    """Kafka's sasl.server.max.receive.size: a frame announced above 512
    KiB before authentication closes the connection at once (nothing is
    reserved for it); so does not authenticating in time."""
    with socket.create_connection(("127.0.0.1", sasl.sasl_port), timeout=10) as s:
        s.sendall(struct.pack(">i", 50 * 1024 * 1024) + b"\x00" * 16)
        s.settimeout(5)
        assert s.recv(1) == b"", "closed"


def test_an_address_whose_authentications_keep_failing_is_held_off():
    """Three failures within the window: the address's next SASL
    connection is closed at accept, even with the right password; the
    plaintext listener is not affected."""
    extra = 'sasl_listen = "127.0.0.1:0"\nsasl_max_failures_per_address = 3\nsasl_failure_window_ms = 60000\n'
    with running("kafka", "sasl-limit", kafka_extra=extra) as r:
        admin = AdminClient({"bootstrap.servers": r.bootstrap})
        ups = [UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"dave-pw")]
        for f in admin.alter_user_scram_credentials(ups).values():
            f.result(15)
        conf = {"bootstrap.servers": f"127.0.0.1:{r.sasl_port}", "security.protocol": "sasl_plaintext",
                "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "dave"}
        assert AdminClient({**conf, "sasl.password": "dave-pw"}).list_topics(timeout=10).brokers
        for _ in range(3):
            with pytest.raises(KafkaException):
                AdminClient({**conf, "sasl.password": "wrong", "reconnect.backoff.ms": 5000}).list_topics(timeout=3)
        with pytest.raises(KafkaException):
            AdminClient({**conf, "sasl.password": "dave-pw"}).list_topics(timeout=5)
        refused = [l for l in r.metrics().splitlines() if l.startswith("rokka_kafka_sasl_connections_refused_total")]
        assert refused and float(refused[0].rsplit(" ", 1)[1]) >= 1, refused
        assert admin.list_topics(timeout=10).brokers
