"""One ACL table for both protocols (docs/security.md, "Authorization"):
ACLs created, listed and deleted through the Kafka admin API (confluent-kafka
and kafka-python) decide what Kafka clients (SASL users, and anonymous ones
on the plaintext listener) and RocketMQ clients (rocketmq-client-rust,
anonymous) may do; refusals carry each protocol's own error.

RocketMQ answers are read on the wire through a RemotingTap (the client
library does not show the response code of a refused send or pull)."""
import json
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from realclients import Harness, RemotingTap, metric, run_harness, wait_for
from rokka_fixture import Rokka, results_dir

SEND_MESSAGE, SEND_MESSAGE_V2, PULL_MESSAGE, NO_PERMISSION = 10, 310, 11, 16
PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
CAROL = "carol-secret"


@pytest.fixture(scope="module")
def rokka():
    tap = RemotingTap()
    r = Rokka(
        results_dir("cross", "test_acls"),
        kafka_extra='sasl_listen = "127.0.0.1:0"\nsasl_max_failures_per_address = 1000\n',
        rocketmq_extra=f'advertised_addr = "127.0.0.1:{tap.port}"\nauth_max_failures_per_address = 1000\n'
        '[group]\ninitial_rebalance_delay_ms = 0\n[security]\nsuper_users = ["User:admin"]\n',
    )
    r.start()
    tap.target = r.broker_port
    r.tap = tap
    try:
        # Users first, with authorization off (as Kafka's SCRAM users are
        # made before its authorizer has anyone to trust).
        # (confluent-kafka's describe_acls drops the top-level error:
        # kafka-python's shows it.)
        from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType
        from kafka.admin import KafkaAdminClient, ResourcePatternFilter
        from kafka.admin import ResourceType as KpResourceType
        from kafka.errors import SecurityDisabledError

        kp = KafkaAdminClient(bootstrap_servers=r.bootstrap)
        with pytest.raises(SecurityDisabledError):
            kp.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                       ResourcePatternFilter(KpResourceType.ANY, None, ACLResourcePatternType.ANY)))
        kp.close()
        plain = AdminClient({"bootstrap.servers": r.bootstrap})
        ups = [UserScramCredentialUpsertion(u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), p.encode())
               for u, p in PASSWORDS.items()]
        for f in plain.alter_user_scram_credentials(ups).values():
            f.result(15)
        # carol is made through RocketMQ's user admin (AUTH_CREATE_USER):
        # her password is her RocketMQ secret and her Kafka SCRAM password.
        h = run_harness(r, "create-carol", "create-user", f"127.0.0.1:{r.broker_port}", "carol", CAROL)
        assert h.lines("created carol"), h.lines()
        r.restart_with_authorization()
        yield r
    finally:
        tap.close()
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"


def sasl(r, user):
    return {
        "bootstrap.servers": f"127.0.0.1:{r.sasl_port}",
        "security.protocol": "sasl_plaintext",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": PASSWORDS[user],
    }


def acl(rtype, name, principal, op, pattern=ResourcePatternType.LITERAL, perm=AclPermissionType.ALLOW):
    return AclBinding(rtype, name, pattern, principal, "*", op, perm)


def create(admin, bindings):
    for f in admin.create_acls(bindings).values():
        f.result(15)


def produce(conf, topic, n, tag):
    """Delivery errors (None for each delivered record)."""
    errors = []
    p = Producer({**conf, "message.timeout.ms": 10000})
    for i in range(n):
        p.produce(topic, value=f"{tag}-{i}".encode(), partition=i % 2,
                  on_delivery=lambda err, _m: errors.append(err))
    p.flush(30)
    return errors


def consume(conf, topic, group, n, timeout=30):
    """(values, consumer errors) of a group member reading `topic` from the start."""
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got, errs, deadline = [], [], time.time() + timeout
    while len(got) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            errs.append(m.error().code())
            if m.error().code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED):
                break
            continue
        got.append(m.value().decode())
    if got:
        c.commit(asynchronous=False)
    c.close()
    return got, errs


def test_kafka_acls_decide_what_each_user_may_do(rokka):
    admin = AdminClient(sasl(rokka, "admin"))
    for f in admin.create_topics([NewTopic(t, 2, 1) for t in ("acl-a1", "acl-b1")]).values():
        f.result(15)
    create(admin, [
        acl(ResourceType.TOPIC, "acl-a", "User:alice", AclOperation.WRITE, ResourcePatternType.PREFIXED),
        acl(ResourceType.TOPIC, "acl-a", "User:alice", AclOperation.READ, ResourcePatternType.PREFIXED),
        acl(ResourceType.GROUP, "acl-ga", "User:alice", AclOperation.READ),
        acl(ResourceType.GROUP, "acl-gb", "User:bob", AclOperation.READ),
        acl(ResourceType.TOPIC, "acl-b1", "User:bob", AclOperation.WRITE),
    ])
    denied_before = metric(rokka, "rokka_authorization_denied_total", protocol="kafka")

    alice, bob = sasl(rokka, "alice"), sasl(rokka, "bob")
    assert produce(alice, "acl-a1", 20, "alice") == [None] * 20
    # bob may not write acl-a1: every record fails with the topic error,
    # while alice, connected at the same time, keeps writing.
    errs = produce(bob, "acl-a1", 4, "bob")
    assert errs and all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in errs), errs
    assert produce(alice, "acl-a1", 10, "alice2") == [None] * 10
    assert produce(bob, "acl-b1", 6, "bob") == [None] * 6

    got, errs = consume(alice, "acl-a1", "acl-ga", 30)
    assert sorted(got) == sorted([f"alice-{i}" for i in range(20)] + [f"alice2-{i}" for i in range(10)]), errs
    # bob: no READ on the topic (his group he may use) — topic error; in
    # alice's group — group error.
    got, errs = consume(bob, "acl-a1", "acl-gb", 1, timeout=20)
    assert got == [] and KafkaError.TOPIC_AUTHORIZATION_FAILED in errs, errs
    got, errs = consume(bob, "acl-b1", "acl-ga", 1, timeout=20)
    assert got == [] and KafkaError.GROUP_AUTHORIZATION_FAILED in errs, errs

    # Listings leave out what the caller may not describe.
    assert "acl-a1" in AdminClient(alice).list_topics(timeout=10).topics
    bob_topics = AdminClient(bob).list_topics(timeout=10).topics
    assert "acl-a1" not in bob_topics and "acl-b1" in bob_topics
    # Only the cluster's ALTER (admin: a super user) changes ACLs.
    with pytest.raises(KafkaException) as e:
        create(AdminClient(bob), [acl(ResourceType.TOPIC, "acl-a1", "User:bob", AclOperation.ALL)])
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, e.value
    assert metric(rokka, "rokka_authorization_denied_total", protocol="kafka") > denied_before

    # Listed and deleted through the admin API; the deletion takes effect
    # at once.
    flt = AclBindingFilter(ResourceType.TOPIC, "acl-a", ResourcePatternType.PREFIXED, "User:alice", None,
                           AclOperation.WRITE, AclPermissionType.ANY)
    described = admin.describe_acls(flt).result(15)
    assert [(b.name, b.operation) for b in described] == [("acl-a", AclOperation.WRITE)], described
    for f in admin.delete_acls([flt]).values():
        assert [b.name for b in f.result(15)] == ["acl-a"]
    errs = produce(alice, "acl-a1", 2, "late")
    assert errs and all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in errs), errs


def test_a_topic_the_producer_may_write_but_not_create_is_an_authorization_error(rokka):
    """bob may write topics named acl-new-* (WRITE implies DESCRIBE) but not
    create them: producing to one that does not exist fails at once with
    TOPIC_AUTHORIZATION_FAILED, as Kafka answers where auto-creation is on
    (unauthorizedForCreateTopics) — not an unknown topic waited for until
    the message timeout. Once the topic exists (made by the admin), bob
    writes it."""
    admin = AdminClient(sasl(rokka, "admin"))
    create(admin, [acl(ResourceType.TOPIC, "acl-new-", "User:bob", AclOperation.WRITE, ResourcePatternType.PREFIXED)])
    bob = sasl(rokka, "bob")
    t0 = time.time()
    errs = produce(bob, "acl-new-orders", 2, "bob")
    assert errs and all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in errs), errs
    assert time.time() - t0 < 8, "refused at once, not after the message timeout"
    assert "acl-new-orders" not in AdminClient(sasl(rokka, "admin")).list_topics(timeout=10).topics
    for f in admin.create_topics([NewTopic("acl-new-orders", 2, 1)]).values():
        f.result(15)
    assert produce(bob, "acl-new-orders", 4, "bob") == [None] * 4


def test_kafka_python_lists_and_creates_acls(rokka):
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KpResourceType

    a = KafkaAdminClient(
        bootstrap_servers=f"127.0.0.1:{rokka.sasl_port}",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="admin",
        sasl_plain_password=PASSWORDS["admin"],
    )
    try:
        res = a.create_acls([ACL("User:carol", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                                 ResourcePattern(KpResourceType.TOPIC, "kp-acl", ACLResourcePatternType.LITERAL))])
        assert not res["failed"], res
        acls, err = a.describe_acls(ACLFilter("User:carol", None, ACLOperation.ANY, ACLPermissionType.ANY,
                                              ResourcePatternFilter(KpResourceType.ANY, None,
                                                                    ACLResourcePatternType.ANY)))
        assert [x.resource_pattern.resource_name for x in acls] == ["kp-acl"], (acls, err)
    finally:
        a.close()


def refused(tap, since, group):
    """(request code, remark) of the requests about `group` answered NO_PERMISSION."""
    with tap._lock:
        seen = list(tap.exchanges[since:])
    return [(q, r) for q, ext, c, r in seen if c == NO_PERMISSION and group in str(ext.get("consumerGroup"))]


def test_rocketmq_clients_obey_the_same_acls(rokka):
    admin = AdminClient(sasl(rokka, "admin"))
    for f in admin.create_topics([NewTopic("acl-rmq", 2, 1)]).values():
        f.result(15)
    denied_before = metric(rokka, "rokka_authorization_denied_total", protocol="rocketmq")
    # A RocketMQ client without credentials is User:ANONYMOUS: no PUB yet.
    mark = rokka.tap.mark()
    h = Harness(rokka, "acl-produce-denied", "cross-produce", "acl-rmq", 5)
    assert h.wait(60) != 0, h.lines()[-5:]
    answers = rokka.tap.answers(SEND_MESSAGE, mark) + rokka.tap.answers(SEND_MESSAGE_V2, mark)
    assert answers and all(c == NO_PERMISSION for c, _ in answers), answers
    assert "PUB" in answers[0][1] and "acl-rmq" in answers[0][1], answers
    assert metric(rokka, "rokka_authorization_denied_total", protocol="rocketmq") > denied_before

    # WRITE granted through the Kafka admin API is RocketMQ's PUB.
    create(admin, [acl(ResourceType.TOPIC, "acl-rmq", "User:ANONYMOUS", AclOperation.WRITE)])
    run_harness(rokka, "acl-produce", "cross-produce", "acl-rmq", 5)

    # SUB needs READ on the topic and on the group: the topic alone is not
    # enough, pulls are refused.
    create(admin, [acl(ResourceType.TOPIC, "acl-rmq", "User:ANONYMOUS", AclOperation.READ)])
    mark = rokka.tap.mark()
    h = Harness(rokka, "acl-consume-denied", "cross-consume", "acl-rmq", "acl-rg-denied", 5)
    try:
        # The consumer's first offset query (or pull) for the group is
        # refused, and so is every pull it tries.
        wait_for("a refused consumer request", lambda: refused(rokka.tap, mark, "acl-rg-denied"), 60)
        assert all(c == NO_PERMISSION for c, _ in rokka.tap.answers(PULL_MESSAGE, mark)), rokka.tap.answers(PULL_MESSAGE, mark)
        remark = refused(rokka.tap, mark, "acl-rg-denied")[0][1]
        assert "group acl-rg-denied" in remark and "ANONYMOUS" in remark, remark
        assert h.lines("msg ") == []
        # Its heartbeats are refused too (Apache 5: SUB on the group): it is
        # no member others would hand queues to.
        beats = rokka.tap.answers(34, mark)  # HEART_BEAT
        assert any(c == NO_PERMISSION and "acl-rg-denied" in r for c, r in beats), beats
    finally:
        h.kill()
    create(admin, [acl(ResourceType.GROUP, "acl-rg", "User:ANONYMOUS", AclOperation.READ)])
    h = run_harness(rokka, "acl-consume", "cross-consume", "acl-rmq", "acl-rg", 5)
    assert len(h.lines("msg ")) == 5, h.lines()[-5:]

    # The same ACLs hold for Kafka clients of the plaintext listener (also
    # User:ANONYMOUS): the group goes on in Kafka where RocketMQ stopped;
    # acl-a1 they may not write.
    run_harness(rokka, "acl-produce-more", "cross-produce", "acl-rmq", 3)
    got, errs = consume({"bootstrap.servers": rokka.bootstrap}, "acl-rmq", "acl-rg", 3, timeout=30)
    assert sorted(got) == sorted(f"rmq-{i}-é" for i in range(3)), (got, errs)
    errs = produce({"bootstrap.servers": rokka.bootstrap}, "acl-a1", 2, "anon")
    assert errs and all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in errs), errs


def signed_as(user, secret):
    return {"COMPAT_ACCESS_KEY": user, "COMPAT_SECRET_KEY": secret}


def refusals(tap, since):
    """Remarks of every NO_PERMISSION answer after exchange `since`."""
    with tap._lock:
        return [r for _q, _e, c, r in tap.exchanges[since:] if c == NO_PERMISSION]


def test_rocketmq_credentials_are_the_users_and_their_kafka_acls_decide(rokka):
    admin = AdminClient(sasl(rokka, "admin"))
    for f in admin.create_topics([NewTopic("acl-carol", 2, 1)]).values():
        f.result(15)
    carol = signed_as("carol", CAROL)
    # Signed and verified, but no PUB yet: refused as User:carol.
    mark = rokka.tap.mark()
    h = Harness(rokka, "carol-denied", "cross-produce", "acl-carol", 3, env=carol)
    assert h.wait(60) != 0, h.lines()[-5:]
    assert any("User:carol may not Write topic acl-carol (PUB)" in r for r in refusals(rokka.tap, mark)), \
        refusals(rokka.tap, mark)
    # A wrong secret and an unknown AccessKey: refused before any ACL.
    for label, env, why in [
        ("carol-wrong", signed_as("carol", "not-her-secret"), "signature mismatch"),
        ("mallory", signed_as("mallory", "x"), "unknown AccessKey"),
    ]:
        mark = rokka.tap.mark()
        h = Harness(rokka, label, "cross-produce", "acl-carol", 1, env=env)
        assert h.wait(60) != 0, h.lines()[-5:]
        assert any(why in r for r in refusals(rokka.tap, mark)), (label, refusals(rokka.tap, mark))

    # Her Kafka ACLs are her RocketMQ rights.
    create(admin, [
        acl(ResourceType.TOPIC, "acl-carol", "User:carol", AclOperation.WRITE),
        acl(ResourceType.TOPIC, "acl-carol", "User:carol", AclOperation.READ),
        acl(ResourceType.GROUP, "acl-carol-g", "User:carol", AclOperation.READ),
    ])
    run_harness(rokka, "carol-produce", "cross-produce", "acl-carol", 5, env=carol)
    h = run_harness(rokka, "carol-consume", "cross-consume", "acl-carol", "acl-carol-g", 5, env=carol)
    assert len(h.lines("msg ")) == 5, h.lines()[-5:]
    # Anonymous RocketMQ clients still may not.
    h = Harness(rokka, "anon-carol-topic", "cross-produce", "acl-carol", 1)
    assert h.wait(60) != 0
    # The same name and password log into Kafka (SCRAM), under the same ACLs.
    kc = {**sasl(rokka, "admin"), "sasl.username": "carol", "sasl.password": CAROL, "sasl.mechanism": "SCRAM-SHA-256"}
    assert produce(kc, "acl-carol", 2, "carol-kafka") == [None, None]
    errs = produce(kc, "acl-a1", 1, "carol-kafka")
    assert errs and errs[0] is not None and errs[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errs
    # Only the cluster's ALTER makes users: carol may not.
    mark = rokka.tap.mark()
    h = Harness(rokka, "carol-create", "create-user", f"127.0.0.1:{rokka.broker_port}", "eve", "eve-pw", env=carol)
    assert h.wait(60) != 0, h.lines()
    assert metric(rokka, "rokka_rocketmq_authentications_failed_total") >= 2


def test_failed_signatures_hold_off_the_address_for_a_while():
    """rocketmq.auth_max_failures_per_address: after that many failed
    signatures from an address, its signed requests are refused unchecked
    (even a right one) until the window has passed; anonymous ones are not
    authentication and stay served."""
    tap = RemotingTap()
    window_ms = 20000
    r = Rokka(
        results_dir("cross", "test_acls_holdoff"),
        rocketmq_extra=f'advertised_addr = "127.0.0.1:{tap.port}"\n'
        f"auth_max_failures_per_address = 3\nauth_failure_window_ms = {window_ms}\n"
        '[security]\nauthorization = true\nsuper_users = ["User:ANONYMOUS", "User:dave"]\n',
    )
    r.start()
    tap.target = r.broker_port
    try:
        h = run_harness(r, "create-dave", "create-user", f"127.0.0.1:{r.broker_port}", "dave", "dave-secret")
        assert h.lines("created dave"), h.lines()
        dave = signed_as("dave", "dave-secret")
        run_harness(r, "dave-before", "cross-produce", "holdoff", 1, env=dave)
        # Signed as a user with no RocketMQ secret (unknown here; a user made
        # through Kafka's SCRAM API alike — the web console signs as its
        # logged-in user): refused, but no secret was guessed, so the
        # address is not held off.
        h = Harness(r, "nobody", "cross-produce", "holdoff", 1, env=signed_as("nobody", "x"))
        assert h.wait(60) != 0, h.lines()[-5:]
        assert metric(r, "rokka_rocketmq_authentications_failed_total", reason="signature") >= 3
        run_harness(r, "dave-after-nobody", "cross-produce", "holdoff", 1, env=dave)
        started = time.time()
        h = Harness(r, "dave-wrong", "cross-produce", "holdoff", 1, env=signed_as("dave", "guess"))
        assert h.wait(60) != 0, h.lines()[-5:]
        assert metric(r, "rokka_rocketmq_authentications_failed_total", reason="signature") >= 6
        # The right secret, from the same address, inside the window: refused unchecked.
        mark = tap.mark()
        h = Harness(r, "dave-held-off", "cross-produce", "holdoff", 1, env=dave)
        assert h.wait(60) != 0, h.lines()[-5:]
        assert time.time() - started < window_ms / 1000, "the window passed before the check: lengthen it"
        assert any("too many failed authentications" in x for x in refusals(tap, mark)), refusals(tap, mark)
        assert metric(r, "rokka_rocketmq_authentications_failed_total", reason="held_off") >= 1
        assert metric(r, "rokka_rocketmq_auth_failing_addresses") == 1
        # Anonymous requests are served meanwhile.
        run_harness(r, "anonymous-meanwhile", "cross-produce", "holdoff", 1)
        # Once the window has passed, the right secret works again.
        time.sleep(max(0.0, started + window_ms / 1000 + 0.5 - time.time()))
        run_harness(r, "dave-after", "cross-produce", "holdoff", 1, env=dave)
    finally:
        tap.close()
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"


def test_acls_survive_a_kill_9(rokka):
    # Answered once stored: a SIGKILL right after the answer loses nothing.
    create(AdminClient(sasl(rokka, "admin")),
           [acl(ResourceType.GROUP, "acl-killed", "User:ANONYMOUS", AclOperation.DESCRIBE)])
    rokka.kill()
    rokka.start()
    admin = AdminClient(sasl(rokka, "admin"))
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:ANONYMOUS", None,
                           AclOperation.ANY, AclPermissionType.ANY)
    got = sorted((b.restype, b.name, b.operation) for b in admin.describe_acls(flt).result(15))
    assert got == sorted([
        (ResourceType.TOPIC, "acl-rmq", AclOperation.WRITE),
        (ResourceType.TOPIC, "acl-rmq", AclOperation.READ),
        (ResourceType.GROUP, "acl-rg", AclOperation.READ),
        (ResourceType.GROUP, "acl-killed", AclOperation.DESCRIBE),
    ]), got
    # And still decide: alice's group READ is there, her topic WRITE gone.
    errs = produce(sasl(rokka, "alice"), "acl-a1", 1, "after")
    assert errs and errs[0] is not None and errs[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_the_admin_cli_logs_in_and_obeys_the_acls(rokka):
    """`rokka topic …` logs into the SASL listener with PLAIN; `rokka message
    …` signs its remoting requests with the same user's RocketMQ secret; both
    are held to the one ACL table."""
    import json
    import subprocess

    from rokka_fixture import rokka_bin

    def cli(*args):
        p = subprocess.run([rokka_bin(), *args, "--output", "json"], capture_output=True, text=True, timeout=60)
        return p.returncode, (json.loads(p.stdout) if p.stdout.strip() else {}), p.stderr

    sasl_at = ["--brokers", f"127.0.0.1:{rokka.sasl_port}"]
    rc, _, err = cli("topic", "create", "acl-cli", "--partitions", "2", *sasl_at,
                     "--user", "admin", "--password", PASSWORDS["admin"])
    assert rc == 0, err
    rc, out, err = cli("topic", "list", *sasl_at, "--user", "admin", "--password", PASSWORDS["admin"])
    assert rc == 0, err
    assert "acl-cli" in {t["topic"] for t in out["topics"]}
    rc, _, err = cli("topic", "list", *sasl_at, "--user", "admin", "--password", "wrong")
    assert rc == 1 and "logging in as admin" in err, err
    # Anonymous on the plaintext listener: no ACL lets it create topics.
    rc, _, err = cli("topic", "create", "cli-anonymous", "--brokers", rokka.bootstrap)
    assert rc == 1 and "AUTHORIZATION_FAILED" in err, err
    # carol may read and write acl-cli-carol (ACLs made here, so this test
    # stands alone): signed, the lookup by key of what she sent works.
    admin = AdminClient(sasl(rokka, "admin"))
    for f in admin.create_topics([NewTopic("acl-cli-carol", 2, 1)]).values():
        f.result(15)
    create(admin, [
        acl(ResourceType.TOPIC, "acl-cli-carol", "User:carol", AclOperation.WRITE),
        acl(ResourceType.TOPIC, "acl-cli-carol", "User:carol", AclOperation.READ),
    ])
    run_harness(rokka, "cli-carol-produce", "cross-produce", "acl-cli-carol", 2, env=signed_as("carol", CAROL))
    ns = ["--namesrv", f"127.0.0.1:{rokka.namesrv_port}"]
    get = ["message", "get", "--topic", "acl-cli-carol", "--key", "key-1", *ns]
    rc, out, err = cli(*get, "--user", "carol", "--password", CAROL)
    assert rc == 0, err
    assert [m["body"] for m in out["messages"]] == ["rmq-1-é"]
    rc, _, err = cli(*get, "--user", "carol", "--password", "x")
    assert rc == 1 and "signature mismatch" in err, err
    rc, _, err = cli(*get)
    assert rc == 1 and "response code 16" in err, err


class RemotingConn:
    """One kept connection for raw RocketMQ remoting requests (a name
    server drops a broker when the connection it registered on closes)."""

    def __init__(self, port):
        import socket

        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.opaque = 0

    def call(self, code, ext, body=b""):
        """(response code, remark, body)."""
        import json
        import socket
        import struct

        self.opaque += 1
        header = json.dumps({"code": code, "language": "JAVA", "version": 475, "opaque": self.opaque, "flag": 0,
                             "extFields": ext}).encode()
        self.s.sendall(struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body)
        n = struct.unpack(">I", self.s.recv(4, socket.MSG_WAITALL))[0]
        data = self.s.recv(n, socket.MSG_WAITALL)
        hlen = struct.unpack(">I", data[:4])[0] & 0xFFFFFF
        h = json.loads(data[4:4 + hlen])
        return h["code"], h.get("remark") or "", data[4 + hlen:]

    def close(self):
        self.s.close()


def signed(ext, body, user, secret):
    """`ext` with RocketMQ's AccessKey and Signature (HMAC-SHA1 of the
    field values in key order, then the body; AclClientRPCHook)."""
    import base64
    import hashlib
    import hmac

    ext = {**ext, "AccessKey": user}
    content = "".join(ext[k] for k in sorted(ext)).encode() + body
    return {**ext, "Signature": base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()}


def test_only_the_cluster_registers_brokers_at_the_name_server(rokka):
    """Under authorization, a REGISTER_BROKER puts an address in the routes
    of every topic it names — a stranger's would take the clients' sends —
    so it needs CLUSTER_ACTION on the cluster (anonymous here has nothing):
    refused, the routes untouched; the same registration signed by a super
    user is taken, and UNREGISTER_BROKER is held to the same rule."""
    import json
    import zlib

    REGISTER, UNREGISTER, ROUTE, SUCCESS = 103, 104, 105, 0
    admin = AdminClient(sasl(rokka, "admin"))
    for f in admin.create_topics([NewTopic("acl-routes", 1, 1)]).values():
        f.result(15)
    body = json.dumps({
        "topicConfigSerializeWrapper": {
            "topicConfigTable": {"acl-routes": {"topicName": "acl-routes", "readQueueNums": 1, "writeQueueNums": 1,
                                                "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
                                                "order": False, "attributes": {}}},
            "dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": 0},
        },
        "filterServerList": [],
    }).encode()
    ext = {"brokerName": "mallory", "brokerAddr": "127.0.0.1:1", "clusterName": "DefaultCluster",
           "haServerAddr": "", "brokerId": "0", "compressed": "false",
           "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)}
    conn = RemotingConn(rokka.namesrv_port)

    def route_addrs():
        code, remark, data = conn.call(ROUTE, {"topic": "acl-routes"})
        assert code == SUCCESS, remark
        return [a for b in json.loads(data)["brokerDatas"] for a in b["brokerAddrs"].values()]

    for who in ({}, {"user": "carol", "secret": CAROL}):
        fields = signed(ext, body, who["user"], who["secret"]) if who else ext
        code, remark, _ = conn.call(REGISTER, fields, body)
        assert code == NO_PERMISSION and "ClusterAction" in remark, (who, code, remark)
    assert "127.0.0.1:1" not in route_addrs()
    # The ACL decides: carol, granted CLUSTER_ACTION, registers.
    grant = acl(ResourceType.BROKER, "kafka-cluster", "User:carol", AclOperation.CLUSTER_ACTION)
    create(admin, [grant])
    try:
        code, remark, _ = conn.call(REGISTER, signed(ext, body, "carol", CAROL), body)
        assert code == SUCCESS, remark
        assert "127.0.0.1:1" in route_addrs()
        unreg = {"brokerName": "mallory", "brokerAddr": "127.0.0.1:1", "clusterName": "DefaultCluster",
                 "brokerId": "0"}
        code, remark, _ = conn.call(UNREGISTER, unreg)
        assert code == NO_PERMISSION, (code, remark)
        assert "127.0.0.1:1" in route_addrs()
        code, remark, _ = conn.call(UNREGISTER, signed(unreg, b"", "carol", CAROL))
        assert code == SUCCESS, remark
        assert "127.0.0.1:1" not in route_addrs()
    finally:
        conn.close()
        for f in admin.delete_acls([AclBindingFilter(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                                                     "User:carol", "*", AclOperation.ANY,
                                                     AclPermissionType.ANY)]).values():
            f.result(15)


def test_rocketmq_sends_make_topics_only_with_create_and_locks_need_the_topics(rokka):
    """A RocketMQ send to a topic that does not exist makes it — only for
    a principal with CREATE (on the topic or the cluster), as QueryRoute
    and Kafka's Metadata make topics: a prefixed WRITE grant alone made
    topics up to the broker's limit. LOCK_BATCH_MQ needs READ on each
    queue's topic beside the group (Apache 5: SUB on every topic of mqSet)."""
    import json

    admin = AdminClient(sasl(rokka, "admin"))
    create(admin, [acl(ResourceType.TOPIC, "carol-pfx-", "User:carol", AclOperation.WRITE,
                       pattern=ResourcePatternType.PREFIXED)])
    conn = RemotingConn(rokka.broker_port)
    try:
        def send(topic):
            ext = {"producerGroup": "carol-pg", "topic": topic, "defaultTopic": "TBW102",
                   "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
                   "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
                   "properties": "UNIQ_KEY\x01C0FFEE02\x02"}
            return conn.call(SEND_MESSAGE, signed(ext, b"b", "carol", CAROL), b"b")

        code, remark, _ = send("carol-pfx-new-1")
        assert code == 17, (code, remark)  # TOPIC_NOT_EXIST: not made
        create(admin, [acl(ResourceType.TOPIC, "carol-pfx-", "User:carol", AclOperation.CREATE,
                           pattern=ResourcePatternType.PREFIXED)])
        code, remark, _ = send("carol-pfx-new-1")
        assert code == 0, (code, remark)
        # carol reads group acl-carol-g and topic acl-carol, not acl-a1.
        body = json.dumps({"consumerGroup": "acl-carol-g", "clientId": "carol@lock", "mqSet": [
            {"topic": "acl-carol", "brokerName": "broker-a", "queueId": 0},
            {"topic": "acl-a1", "brokerName": "broker-a", "queueId": 0}]}).encode()
        code, remark, _ = conn.call(41, signed({}, body, "carol", CAROL), body)  # LOCK_BATCH_MQ
        assert code == NO_PERMISSION and "acl-a1" in remark, (code, remark)
        body = json.dumps({"consumerGroup": "acl-carol-g", "clientId": "carol@lock", "mqSet": [
            {"topic": "acl-carol", "brokerName": "broker-a", "queueId": 0}]}).encode()
        code, remark, _ = conn.call(41, signed({}, body, "carol", CAROL), body)
        assert code == 0, (code, remark)
    finally:
        conn.close()


def test_rocketmq_listings_show_only_what_the_caller_may_describe(rokka):
    """QUERY_TOPIC_CONSUME_BY_WHO lists the groups of a topic, and
    GET_CONSUME_STATS without a topic a group's topics with their offsets:
    with authorization on, only groups and topics the caller may describe
    (as Kafka's ListGroups and OffsetFetch of all topics filter them)."""
    from confluent_kafka import TopicPartition

    admin_conf = sasl(rokka, "admin")
    # Offsets carol may not see: another group on her topic, and her group
    # on a topic she may not describe (the super user commits both).
    for group, topic in (("acl-admin-g", "acl-carol"), ("acl-carol-g", "acl-a1")):
        c = Consumer({**admin_conf, "group.id": group, "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        c.close()
    conn = RemotingConn(rokka.broker_port)
    try:
        code, remark, body = conn.call(300, signed({"topic": "acl-carol"}, b"", "carol", CAROL))
        assert code == 0, (code, remark)
        groups = json.loads(body)["groupList"]
        assert "acl-carol-g" in groups and "acl-admin-g" not in groups, groups
        code, remark, body = conn.call(208, signed({"consumerGroup": "acl-carol-g"}, b"", "carol", CAROL))
        assert code == 0, (code, remark)
        assert b"acl-carol" in body and b"acl-a1" not in body, body[:300]
    finally:
        conn.close()


def test_grants_on_every_group_and_topic_do_not_reach_the_brokers_own(rokka):
    """READ on every group and topic (`*`: a mirror's, a backup's) does not
    let a client commit under the broker's own groups — `%SCHEDULE%` is
    the delay levels' progress: committed to the queue end, every pending
    delayed message and retry would be skipped. Only an ACL naming such a
    group or topic literally grants it (super users aside)."""
    from confluent_kafka import TopicPartition

    admin = AdminClient(sasl(rokka, "admin"))
    wide = [acl(ResourceType.GROUP, "*", "User:bob", AclOperation.READ),
            acl(ResourceType.TOPIC, "*", "User:bob", AclOperation.READ)]
    create(admin, wide)
    try:
        # An ordinary group and topic: the grant works.
        admin.create_topics([NewTopic("acl-wide", 1, 1)])["acl-wide"].result(15)
        c = Consumer({**sasl(rokka, "bob"), "group.id": "bob-wide"})
        c.commit(offsets=[TopicPartition("acl-wide", 0, 0)], asynchronous=False)
        c.close()
        from confluent_kafka import ConsumerGroupTopicPartitions

        bob = AdminClient(sasl(rokka, "bob"))
        for group, topic in (("%SCHEDULE%", "SCHEDULE_TOPIC_XXXX"), ("CID_RMQ_SYS_TRANS", "RMQ_SYS_TRANS_HALF_TOPIC")):
            fs = bob.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 1_000_000)])], request_timeout=15)
            with pytest.raises(KafkaException) as e:
                fs[group].result(20)
            assert e.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED, (group, e.value)
    finally:
        for f in admin.delete_acls([AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal,
                                                     b.host, b.operation, b.permission_type) for b in wide]).values():
            f.result(15)


def test_deleting_a_group_does_not_lift_an_operators_subscription_group_config(rokka):
    """A subscription-group config is set with ALTER on the cluster
    (mqadmin updateSubGroup); deleting the group takes DELETE on it. An
    application allowed to delete its own group must not lift an operator's
    consumeEnable=false that way: mqadmin deleteSubGroup
    (rocketmq-client-rust's admin, signed) is refused without ALTER on the
    cluster, and a Kafka DeleteGroups (confluent-kafka) deletes the group's
    offsets but leaves the config — or, when the config is all there is,
    answers GROUP_AUTHORIZATION_FAILED. A super user's DeleteGroups takes
    it."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    admin = AdminClient(sasl(rokka, "admin"))
    broker = f"127.0.0.1:{rokka.broker_port}"
    group = "acl-op-g"
    carol = signed_as("carol", CAROL)
    topic = "acl-op-t"
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)

    def config():
        return run_harness(rokka, "carol-subgroup-get", "subgroup-get", broker, group, env=carol).lines("config: ")[0]

    alter = acl(ResourceType.BROKER, "kafka-cluster", "User:carol", AclOperation.ALTER)
    grants = [acl(ResourceType.GROUP, group, "User:carol", AclOperation.DELETE),
              acl(ResourceType.GROUP, group, "User:carol", AclOperation.DESCRIBE),
              acl(ResourceType.GROUP, group, "User:bob", AclOperation.DELETE),
              acl(ResourceType.GROUP, group, "User:bob", AclOperation.READ),
              acl(ResourceType.TOPIC, topic, "User:bob", AclOperation.READ)]
    create(admin, [alter, *grants])
    try:
        h = run_harness(rokka, "carol-subgroup-set", "subgroup-set", broker, group, "false", 5, env=carol)
        assert h.lines("set: ") == ["set: ok"], h.lines()
        for f in admin.delete_acls([AclBindingFilter(alter.restype, alter.name, alter.resource_pattern_type,
                                                     alter.principal, alter.host, alter.operation,
                                                     alter.permission_type)]).values():
            f.result(15)
        # DELETE on the group is not enough to take the config away.
        mark = rokka.tap.mark()
        # (through the tap, which shows the refusal the client's error hides)
        h = Harness(rokka, "carol-subgroup-delete", "subgroup-delete", f"127.0.0.1:{rokka.tap.port}", group, env=carol)
        assert h.wait(60) != 0, h.lines()
        assert any("User:carol may not Alter cluster" in r for r in refusals(rokka.tap, mark)), \
            refusals(rokka.tap, mark)
        assert config() == "config: consumeEnable=false retryMaxTimes=5"
        # A Kafka DeleteGroups by bob: the offsets go, the config stays.
        c = Consumer({**sasl(rokka, "bob"), "group.id": group, "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        c.close()
        bob = AdminClient(sasl(rokka, "bob"))
        bob.delete_consumer_groups([group], request_timeout=30)[group].result(30)
        fs = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])])
        assert fs[group].result(15).topic_partitions[0].offset < 0, "the offsets went"
        assert config() == "config: consumeEnable=false retryMaxTimes=5"
        # Nothing but the config left: bob may not delete it.
        with pytest.raises(KafkaException) as e:
            bob.delete_consumer_groups([group], request_timeout=30)[group].result(30)
        assert e.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED, e.value
        assert config() == "config: consumeEnable=false retryMaxTimes=5"
        # A super user's DeleteGroups takes it.
        admin.delete_consumer_groups([group], request_timeout=30)[group].result(30)
        assert config().startswith("config: none"), config()
    finally:
        for f in admin.delete_acls([AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal,
                                                     b.host, b.operation, b.permission_type)
                                    for b in [alter, *grants]]).values():
            f.result(15)


def test_a_scram_credential_deleted_through_kafka_revokes_a_rocketmq_users_password(rokka):
    """carol was made by RocketMQ's user admin: one password, her RocketMQ
    secret and both SCRAM credentials. An admin revoking her through Kafka
    (deleting SCRAM-SHA-512) revokes the password everywhere: her signed
    RocketMQ sends and her SCRAM-SHA-256 login stop working too."""
    from confluent_kafka.admin import UserScramCredentialDeletion

    admin = AdminClient(sasl(rokka, "admin"))
    carol = signed_as("carol", CAROL)
    run_harness(rokka, "carol-before", "cross-produce", "acl-carol", 1, env=carol)
    for f in admin.alter_user_scram_credentials([UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512)]).values():
        f.result(15)
    mark = rokka.tap.mark()
    h = Harness(rokka, "carol-revoked", "cross-produce", "acl-carol", 1, env=carol)
    assert h.wait(60) != 0, h.lines()[-5:]
    assert any("unknown AccessKey" in r or "signature" in r for r in refusals(rokka.tap, mark)), refusals(rokka.tap, mark)
    kc = {**sasl(rokka, "admin"), "sasl.username": "carol", "sasl.password": CAROL, "sasl.mechanism": "SCRAM-SHA-256"}
    errs = produce(kc, "acl-carol", 1, "carol-revoked")
    assert errs and errs[0] is not None, errs
