"""Calls between broker sets under authorization (docs/cluster.md): with
ACLs on and anonymous clients no super users, a Kafka group coordinator
still commits and reads the offsets of partitions another set holds — its
calls to that set's master are signed as the cluster's own (a secret the
nodes share through etcd), not made as User:ANONYMOUS, whom the group's
ACLs do not name. A client cannot pass for the cluster: a request signed
with a made-up cluster signature is refused."""
import json
import socket
import struct
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
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
from conftest import TwoSets, sasl_conf


@pytest.fixture(scope="module")
def cluster():
    c = TwoSets(
        "cross-set-auth",
        kafka_extra='sasl_listen = "127.0.0.1:0"',
        # Nobody is a super user; what no ACL names is open (so the
        # plaintext admin below may make users and ACLs).
        sections="[security]\nauthorization = true\nallow_everyone_if_no_acl_found = true\n",
    )
    yield c
    c.close()


def dora(node):
    return sasl_conf(node, "dora", "dora-pw")


def test_a_coordinator_commits_offsets_of_the_other_set_under_acls(cluster):
    cluster.masters(60)
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    ups = [UserScramCredentialUpsertion("dora", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"dora-pw")]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(15)
    for f in admin.create_topics([NewTopic("guarded", 4, 1)]).values():
        f.result(15)
    # (Asked before the ACLs: then User:ANONYMOUS may not describe it.)
    md = admin.list_topics("guarded", timeout=10)
    leaders = {p.leader for p in md.topics["guarded"].partitions.values()}
    assert len(leaders) == 2, f"the topic spreads over both sets: leaders {leaders}"
    # Only dora may use the topic and the group: User:ANONYMOUS may not.
    acls = [
        AclBinding(rt, name, ResourcePatternType.LITERAL, "User:dora", "*", AclOperation.ALL, AclPermissionType.ALLOW)
        for rt, name in ((ResourceType.TOPIC, "guarded"), (ResourceType.GROUP, "guarded-g"))
    ]
    for f in admin.create_acls(acls).values():
        f.result(15)
    deadline = time.time() + 20
    while any(n.metric_values().get("rokka_acls") != 2.0 for n in cluster.nodes.values()):
        assert time.time() < deadline, "the ACLs reach every node"
        time.sleep(0.2)

    deadline = time.time() + 20
    while True:
        try:
            AdminClient(dora(cluster.nodes[1])).list_topics(timeout=5)
            break
        except Exception:
            assert time.time() < deadline, "dora logs in"
            time.sleep(0.5)
    p = Producer(dora(cluster.nodes[2]))
    for i in range(40):
        p.produce("guarded", value=f"g-{i}".encode(), partition=i % 4)
    assert p.flush(30) == 0
    c = Consumer({**dora(cluster.nodes[3]), "group.id": "guarded-g", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe(["guarded"])
    got, deadline = [], time.time() + 40
    while len(got) < 40 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    assert sorted(got) == sorted(f"g-{i}" for i in range(40))
    # Committed through the group's coordinator, half of it on the other
    # set's master.
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition("guarded", q) for q in range(4)], timeout=10)
    c.close()
    assert [tp.error for tp in committed] == [None] * 4
    assert sorted(tp.offset for tp in committed) == [10, 10, 10, 10]


def remoting(port, code, ext):
    header = json.dumps({"code": code, "language": "JAVA", "version": 475, "opaque": 1, "flag": 0,
                         "extFields": ext}).encode()
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(frame)
        n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
        data = s.recv(n, socket.MSG_WAITALL)
    hlen = struct.unpack(">I", data[:4])[0] & 0xFFFFFF
    return json.loads(data[4 : 4 + hlen])


def test_a_client_cannot_pass_for_the_cluster(cluster):
    masters = cluster.masters(60)
    port = cluster.nodes[masters["set-a"]].broker_port
    # UPDATE_CONSUMER_OFFSET (15) for dora's group, signed as if by a node.
    ext = {"consumerGroup": "guarded-g", "topic": "guarded", "queueId": "0", "commitOffset": "0",
           "AccessKey": "rokka-cluster:node-9", "Signature": "bm90IGEgc2lnbmF0dXJl"}
    h = remoting(port, 15, ext)
    assert h["code"] == 16, h  # NO_PERMISSION
    assert "not signed by this cluster" in h.get("remark", ""), h


def test_transaction_calls_between_sets_must_be_signed(cluster):
    """ROKKA_TXN_JOIN / ROKKA_TXN_END (32001 / 32002) make a master take
    part in, commit or abort another set's transaction. From a node's own
    address (127.0.0.1 here) but unsigned, they were served: any process on
    a node's host could end any producer's part."""
    masters = cluster.masters(60)
    port = cluster.nodes[masters["set-a"]].broker_port
    for code, ext in ((32002, {"producerId": "1", "producerEpoch": "0", "commit": "true"}),
                      (32001, {"producerId": "1", "producerEpoch": "0", "coordinator": "set-b"})):
        h = remoting(port, code, ext)
        assert h["code"] == 16, h  # NO_PERMISSION
        assert "cluster's own" in h.get("remark", ""), h


def remoting_body(port, code, ext):
    """One raw remoting request: (header, body bytes)."""
    header = json.dumps({"code": code, "language": "JAVA", "version": 475, "opaque": 1, "flag": 0,
                         "extFields": ext}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(struct.pack(">II", 4 + len(header), len(header)) + header)
        n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
        data = s.recv(n, socket.MSG_WAITALL)
    hlen = struct.unpack(">I", data[:4])[0] & 0xFFFFFF
    return json.loads(data[4 : 4 + hlen]), data[4 + hlen:]


def test_nodes_register_at_each_others_name_servers_under_acls(cluster):
    """Once the cluster resource has ACLs, User:ANONYMOUS may not register
    brokers (CLUSTER_ACTION); the nodes' own registrations are signed as
    the cluster's and still taken: a node restarted is listed again by
    every name server. A stranger's registration is refused."""
    cluster.masters(60)
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    acl = AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:dora", "*",
                     AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    before = cluster.nodes[1].metric_values().get("rokka_acls", 0)
    for f in admin.create_acls([acl]).values():
        f.result(15)
    deadline = time.time() + 20
    while any(n.metric_values().get("rokka_acls", 0) < before + 1 for n in cluster.nodes.values()):
        assert time.time() < deadline, "the cluster ACL reaches every node"
        time.sleep(0.2)
    ext = {"brokerName": "mallory", "brokerAddr": "127.0.0.1:1", "clusterName": "DefaultCluster",
           "haServerAddr": "", "brokerId": "0"}
    h, _ = remoting_body(cluster.nodes[1].namesrv_port, 103, ext)
    assert h["code"] == 16, h
    # Node 4 restarts: it registers afresh with every node's name server.
    node = cluster.nodes[4]
    node.stop()
    node.start()
    addr = f"127.0.0.1:{node.broker_port}"
    for i in (1, 2, 3):
        deadline = time.time() + 30
        while True:
            h, body = remoting_body(cluster.nodes[i].namesrv_port, 106, {})
            if h["code"] == 0 and addr.encode() in body:
                break
            assert time.time() < deadline, f"node {i}'s name server does not list node 4 again: {body[:400]!r}"
            time.sleep(0.5)
