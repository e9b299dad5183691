"""The Kafka SSL listener (docs/security.md): TLS beside the plaintext
listener, with certificates this suite makes with openssl; optional client
certificates (mTLS). Clients: confluent-kafka (librdkafka) and kcat."""
import os
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from conftest import results_dir, running
from pki import make_pki  # noqa: F401 (test_sasl imports it from here)


@pytest.fixture(scope="module")
def pki():
    return make_pki(results_dir("kafka", "tls-pki"))


def ssl_extra(pki, client_ca=False):
    extra = (
        'ssl_listen = "127.0.0.1:0"\n'
        f'ssl_certificate = "{pki["server.pem"]}"\nssl_key = "{pki["server.key"]}"\n'
    )
    if client_ca:
        extra += f'ssl_client_ca = "{pki["ca.pem"]}"\n'
    return extra


@pytest.fixture(scope="module")
def tls(pki):
    with running("kafka", "tls", kafka_extra=ssl_extra(pki)) as r:
        yield r


def ssl_conf(r, pki, **extra):
    return {"bootstrap.servers": f"127.0.0.1:{r.ssl_port}", "security.protocol": "ssl",
            "ssl.ca.location": pki["ca.pem"], **extra}


def read(conf, topic, n, timeout=20):
    c = Consumer({**conf, "group.id": f"g-{time.time()}", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    got, deadline = [], time.time() + timeout
    while len(got) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    c.close()
    return got


def test_produce_consume_and_metadata_over_ssl_beside_plaintext(tls, pki):
    conf = ssl_conf(tls, pki)
    p = Producer(conf)
    for i in range(50):
        p.produce("tls-topic", value=f"secret-{i}".encode())
    assert p.flush(30) == 0
    # Metadata over SSL names the SSL listener (a client follows it).
    md = AdminClient(conf).list_topics(timeout=10)
    assert [(b.host, b.port) for b in md.brokers.values()] == [("127.0.0.1", tls.ssl_port)]
    assert read(conf, "tls-topic", 50) == [f"secret-{i}" for i in range(50)]
    # The plaintext listener serves the same store, and names itself.
    plain = {"bootstrap.servers": tls.bootstrap}
    assert [(b.host, b.port) for b in AdminClient(plain).list_topics(timeout=10).brokers.values()] == [
        ("127.0.0.1", tls.kafka_port)
    ]
    assert read(plain, "tls-topic", 50) == [f"secret-{i}" for i in range(50)]
    # A group over SSL: the coordinator is found on the SSL listener.
    c = Consumer({**conf, "group.id": "tls-group", "auto.offset.reset": "earliest"})
    c.subscribe(["tls-topic"])
    got, deadline = [], time.time() + 30
    while len(got) < 50 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition("tls-topic", 0)], timeout=10)
    c.close()
    assert len(got) == 50 and committed[0].offset == 50


def test_large_fetches_over_ssl(tls, pki):
    """Several MB each way: every encrypted byte of a response is sent (a
    TLS writer holds what it has not flushed)."""
    conf = ssl_conf(tls, pki)
    p = Producer({**conf, "linger.ms": 20})
    blob = "x" * 10_000
    for i in range(600):
        p.produce("tls-large", value=f"{i}:{blob}".encode())
    assert p.flush(60) == 0
    got = read({**conf, "fetch.max.bytes": 8 * 1024 * 1024}, "tls-large", 600, timeout=60)
    assert [int(v.split(":", 1)[0]) for v in got] == list(range(600))


def test_kcat_over_ssl(tls, pki, tmp_path):
    base = ["kcat", "-b", f"127.0.0.1:{tls.ssl_port}", "-X", "security.protocol=ssl",
            "-X", f"ssl.ca.location={pki['ca.pem']}"]
    lines = "".join(f"k{i}:kcat {i}\n" for i in range(20))
    subprocess.run([*base, "-P", "-t", "tls-kcat", "-K:"], input=lines.encode(), check=True, timeout=30)
    out = subprocess.run([*base, "-C", "-t", "tls-kcat", "-e", "-f", "%k=%s\n"], capture_output=True,
                         check=True, timeout=30).stdout.decode().splitlines()
    assert out == [f"k{i}=kcat {i}" for i in range(20)]


def test_a_client_that_does_not_trust_the_certificate_fails_fast(tls, pki):
    """A wrong CA is the client's TLS error within its timeout, not a hang;
    plaintext spoken to the SSL port is closed by the handshake timeout at
    the latest, and the listener goes on serving."""
    bad = AdminClient(ssl_conf(tls, pki, **{"ssl.ca.location": pki["other-ca.pem"]}))
    started = time.time()
    with pytest.raises(KafkaException):
        bad.list_topics(timeout=5)
    assert time.time() - started < 10
    plain_to_ssl = AdminClient({"bootstrap.servers": f"127.0.0.1:{tls.ssl_port}"})
    with pytest.raises(KafkaException):
        plain_to_ssl.list_topics(timeout=5)
    assert AdminClient(ssl_conf(tls, pki)).list_topics(timeout=10).brokers
    metrics = tls.metrics()
    failed = [l for l in metrics.splitlines() if l.startswith("rokka_kafka_tls_handshakes_total") and 'result="failed"' in l]
    assert failed and float(failed[0].rsplit(" ", 1)[1]) >= 1, failed


def test_client_certificates_required_when_a_client_ca_is_set(pki):
    with running("kafka", "mtls", kafka_extra=ssl_extra(pki, client_ca=True)) as r:
        with_cert = ssl_conf(r, pki, **{"ssl.certificate.location": pki["client.pem"],
                                        "ssl.key.location": pki["client.key"]})
        p = Producer(with_cert)
        p.produce("mtls-topic", value=b"by alice")
        assert p.flush(30) == 0
        assert read(with_cert, "mtls-topic", 1) == ["by alice"]
        without = AdminClient(ssl_conf(r, pki))
        with pytest.raises(KafkaException):
            without.list_topics(timeout=5)


def test_a_client_certificate_names_the_principal_the_acls_decide_for(pki):
    """mTLS with authorization on: the connection is User:CN=alice (the
    certificate's subject, as Kafka's default SSL principal builder), and
    only her ACLs let her in."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, NewTopic,
                                       ResourcePatternType, ResourceType)

    security = '[security]\nauthorization = true\nsuper_users = ["User:ANONYMOUS"]\n'
    with running("kafka", "mtls-acl", kafka_extra=ssl_extra(pki, client_ca=True), rocketmq_extra=security) as r:
        admin = AdminClient({"bootstrap.servers": r.bootstrap})  # plaintext: a super user here
        for f in admin.create_topics([NewTopic(t, 1, 1) for t in ("mtls-acl", "mtls-other")]).values():
            f.result(15)
        alice = "User:CN=alice"
        for f in admin.create_acls([
            AclBinding(ResourceType.TOPIC, "mtls-acl", ResourcePatternType.LITERAL, alice, "*", op, AclPermissionType.ALLOW)
            for op in (AclOperation.WRITE, AclOperation.READ)
        ] + [AclBinding(ResourceType.GROUP, "g-", ResourcePatternType.PREFIXED, alice, "*", AclOperation.READ,
                        AclPermissionType.ALLOW)]).values():
            f.result(15)
        with_cert = ssl_conf(r, pki, **{"ssl.certificate.location": pki["client.pem"],
                                        "ssl.key.location": pki["client.key"]})
        errs = []
        p = Producer(with_cert)
        p.produce("mtls-acl", value=b"by alice", on_delivery=lambda e, _m: errs.append(e))
        p.produce("mtls-other", value=b"not hers", on_delivery=lambda e, _m: errs.append(e))
        p.flush(30)
        codes = sorted(e.code() if e else 0 for e in errs)
        assert codes == [0, KafkaError.TOPIC_AUTHORIZATION_FAILED], errs
        assert read(with_cert, "mtls-acl", 1) == ["by alice"]
        assert f"principal=\"{alice}\"" in open(r.log_path).read()


def test_a_bad_certificate_file_stops_the_start_with_the_reason(pki):
    d = results_dir("kafka", "tls-bad")
    bogus = os.path.join(d, "bogus.pem")
    with open(bogus, "w") as f:
        f.write("not a certificate\n")
    from rokka_fixture import Rokka

    r = Rokka(d, kafka_extra=f'ssl_listen = "127.0.0.1:0"\nssl_certificate = "{bogus}"\nssl_key = "{pki["server.key"]}"\n')
    with pytest.raises(RuntimeError):
        r.start(timeout=15)
    r.close()
    with open(r.log_path) as f:
        log = f.read()
    assert "bogus.pem" in log and "Kafka SSL listener" in log, log[-2000:]


def test_metrics_over_https_with_scraper_certificates(pki):
    """metrics.tls_*: /metrics is HTTPS only; with a client CA a scraper
    without a certificate is refused (counted), one with a certificate
    gets the metrics, and a plain-HTTP scrape gets nothing."""
    import http.client
    import ssl
    import urllib.request

    metrics = (f'tls_certificate = "{pki["server.pem"]}"\ntls_key = "{pki["server.key"]}"\n'
               f'tls_client_ca = "{pki["ca.pem"]}"\n')
    with running("kafka", "metrics-tls", metrics_extra=metrics) as r:
        url = f"https://127.0.0.1:{r.metrics_port}/metrics"
        ctx = ssl.create_default_context(cafile=pki["ca.pem"])
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(url, timeout=5, context=ctx).read()
        ctx.load_cert_chain(pki["client.pem"], pki["client.key"])
        with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
            assert resp.status == 200
            text = resp.read().decode()
        assert "rokka_metrics_tls_handshakes_total" in text
        failed = [l for l in text.splitlines()
                  if l.startswith("rokka_metrics_tls_handshakes_total") and 'result="failed"' in l]
        assert failed and float(failed[0].rsplit(" ", 1)[1]) >= 1, failed
        # Plain HTTP on the HTTPS port: no metrics.
        conn = http.client.HTTPConnection("127.0.0.1", r.metrics_port, timeout=5)
        try:
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
        except (http.client.HTTPException, OSError):
            body = b""
        assert b"rokka_" not in body, "metrics served over plain HTTP on the HTTPS port"
