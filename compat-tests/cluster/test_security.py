"""Kafka SASL and ACLs in cluster mode (docs/security.md): two broker sets
behind etcd, every node with a SASL listener and authorization on (the
plaintext listener's anonymous clients are super users here; resources no
ACL names are open). A user created on one node's plaintext listener
reaches every node through etcd's users table; a SCRAM client
bootstrapping at another set's node is told every node's SASL listener (not
the plaintext ones) and produces to and consumes from partitions on both
sets; a deleted user is refused everywhere. An ACL created on one node
decides on every node of both sets, and its deletion on another node
reaches them all."""
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from conftest import TwoSets, sasl_conf


@pytest.fixture(scope="module")
def cluster():
    c = TwoSets(
        "security",
        # The deleted user's retries are failed authentications: not enough
        # to lock 127.0.0.1 out of the later tests.
        kafka_extra='sasl_listen = "127.0.0.1:0"\nsasl_max_failures_per_address = 1000',
        sections='[security]\nauthorization = true\nsuper_users = ["User:ANONYMOUS"]\n'
        "allow_everyone_if_no_acl_found = true\n",
    )
    yield c
    c.close()


def test_a_user_made_on_one_node_logs_in_everywhere(cluster):
    cluster.masters(60)
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    ups = [UserScramCredentialUpsertion("erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"erin-pw")]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(15)
    for f in admin.create_topics([NewTopic("secure-spread", 4, 1)]).values():
        f.result(15)
    # Every node takes the user from etcd within its poll interval.
    deadline = time.time() + 20
    for i, node in cluster.nodes.items():
        while True:
            try:
                md = AdminClient(sasl_conf(node, "erin", "erin-pw")).list_topics(timeout=5)
                break
            except KafkaException:
                assert time.time() < deadline, f"node {i} never accepted erin"
        # Metadata over SASL names the nodes' SASL listeners.
        assert sorted(b.port for b in md.brokers.values()) == sorted(n.sasl_port for n in cluster.nodes.values()), i
    conf = sasl_conf(cluster.nodes[3], "erin", "erin-pw")
    p = Producer(conf)
    for i in range(40):
        p.produce("secure-spread", value=f"s-{i}".encode(), partition=i % 4)
    assert p.flush(30) == 0
    c = Consumer({**conf, "group.id": "secure-group", "auto.offset.reset": "earliest"})
    c.subscribe(["secure-spread"])
    got, deadline = [], time.time() + 40
    while len(got) < 40 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition("secure-spread", q) for q in range(4)], timeout=10)
    c.close()
    assert sorted(got) == sorted(f"s-{i}" for i in range(40))
    assert sum(tp.offset for tp in committed) == 40
    # Deleted on node 4: refused on node 1 too, once etcd's table reaches it.
    admin4 = AdminClient({"bootstrap.servers": cluster.nodes[4].bootstrap})
    for f in admin4.alter_user_scram_credentials([UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_512)]).values():
        f.result(15)
    deadline = time.time() + 20
    while True:
        try:
            AdminClient(sasl_conf(cluster.nodes[1], "erin", "erin-pw")).list_topics(timeout=3)
        except KafkaException:
            break
        assert time.time() < deadline, "node 1 still accepts a deleted user"
        time.sleep(0.5)


def test_an_acl_made_on_one_node_decides_on_every_node(cluster):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    cluster.masters(60)
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    ups = [UserScramCredentialUpsertion("gus", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"gus-pw")]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(15)
    for f in admin.create_topics([NewTopic("acl-spread", 4, 1)]).values():
        f.result(15)

    def writes(node):
        """Delivery error codes of gus's records to every partition (both sets) through `node`."""
        errs = []
        p = Producer({**sasl_conf(cluster.nodes[node], "gus", "gus-pw"), "message.timeout.ms": 8000})
        for q in range(4):
            p.produce("acl-spread", value=b"x", partition=q, on_delivery=lambda e, _m: errs.append(e and e.code()))
        p.flush(20)
        return errs

    # Named by an ACL (for someone else): no longer open to gus, on any node.
    for f in admin.create_acls([AclBinding(ResourceType.TOPIC, "acl-spread", ResourcePatternType.LITERAL,
                                           "User:other", "*", AclOperation.WRITE, AclPermissionType.ALLOW)]).values():
        f.result(15)
    def acls_everywhere(n):
        deadline = time.time() + 20
        while (seen := {i: node.metric_values().get("rokka_acls") for i, node in cluster.nodes.items()}) != {
            i: float(n) for i in cluster.nodes
        }:
            assert time.time() < deadline, f"ACL counts per node: {seen}"
            time.sleep(0.3)

    acls_everywhere(1)
    for node in (2, 3, 4):
        deadline = time.time() + 20
        while (errs := writes(node)) != [KafkaError.TOPIC_AUTHORIZATION_FAILED] * 4:
            assert time.time() < deadline, f"node {node}: {errs}"
            time.sleep(0.5)
    # Deleted through another set's node: gus writes again everywhere.
    admin3 = AdminClient({"bootstrap.servers": cluster.nodes[3].bootstrap})
    flt = AclBindingFilter(ResourceType.TOPIC, "acl-spread", ResourcePatternType.ANY, None, None,
                           AclOperation.ANY, AclPermissionType.ANY)
    for f in admin3.delete_acls([flt]).values():
        assert len(f.result(15)) == 1
    acls_everywhere(0)
    for node in (1, 2, 4):
        deadline = time.time() + 20
        while (errs := writes(node)) != [None] * 4:
            assert time.time() < deadline, f"node {node}: {errs}"
            time.sleep(0.5)


def test_a_user_change_is_answered_once_etcd_holds_it(cluster):
    """AlterUserScramCredentials is answered once etcd holds the change (as
    Kafka answers after its metadata log commit): with etcd paused the
    change is answered REQUEST_TIMED_OUT (stored on the node, queued), not
    success; once etcd is back it is written and reaches another set's
    node."""
    import signal

    from confluent_kafka import KafkaError

    masters = cluster.masters(60)
    node = masters["set-a"]
    admin = AdminClient({"bootstrap.servers": cluster.nodes[node].bootstrap, "socket.timeout.ms": 30000})
    ups = [UserScramCredentialUpsertion("hank", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"hank-pw")]
    cluster.etcd.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.time()
        for f in admin.alter_user_scram_credentials(ups, request_timeout=30).values():
            with pytest.raises(KafkaException) as e:
                f.result(40)
            assert e.value.args[0].code() == KafkaError.REQUEST_TIMED_OUT, e.value
        assert time.time() - started >= 9, "answered before the wait for etcd was over"
    finally:
        cluster.etcd.proc.send_signal(signal.SIGCONT)
    cluster.masters(60)
    other = masters["set-b"]
    deadline = time.time() + 30
    while True:
        try:
            AdminClient(sasl_conf(cluster.nodes[other], "hank", "hank-pw")).list_topics(timeout=3)
            break
        except KafkaException:
            assert time.time() < deadline, f"node {other} never accepted hank: the queued change was not written"
            time.sleep(0.3)
