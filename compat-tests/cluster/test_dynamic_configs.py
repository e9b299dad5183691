"""Dynamic broker configs in a cluster: a cluster-wide default (AlterConfigs
on BROKER "", what Kafka's `kafka-configs --entity-default` sends) set
through one node reaches every node (etcd), survives that node's death and
applies to topics everywhere; a per-broker value stays on its broker.

librdkafka and kafka-python refuse an empty broker name, so the cluster
default is set with a hand-encoded IncrementalAlterConfigs v0; everything
is checked with confluent-kafka's DescribeConfigs against each node."""
import socket
import struct
import time

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)
from conftest import Cluster


@pytest.fixture(scope="module")
def cluster():
    c = Cluster("dynamic-configs")
    yield c
    c.close()


def s16(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def set_cluster_default(node, key, value):
    """IncrementalAlterConfigs v0, BROKER "" (SET); the error code."""
    body = struct.pack(">i", 1) + struct.pack(">b", 4) + s16("")
    body += struct.pack(">i", 1) + s16(key) + struct.pack(">b", 0) + s16(value) + b"\x00"
    req = struct.pack(">hhi", 44, 0, 7) + s16("cluster-test") + body
    host, port = node.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", len(req)) + req)
        n = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        resp = s.recv(n, socket.MSG_WAITALL)
    corr, _throttle, count, code = struct.unpack(">iiih", resp[:14])
    assert (corr, count) == (7, 1)
    return code


def broker_config(cluster, node_id, key):
    a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    r = ConfigResource(ResourceType.BROKER, str(node_id))
    c = a.describe_configs([r])[r].result(10)[key]
    return c.value, c.source


def wait_for(cluster, node_id, key, want, timeout=10):
    deadline = time.time() + timeout
    got = None
    while time.time() < deadline:
        try:
            got = broker_config(cluster, node_id, key)
        except Exception as e:  # noqa: BLE001 - a node starting
            got = e
        if got == want:
            return
        time.sleep(0.2)
    raise AssertionError(f"node {node_id}: {key} = {got}, want {want}")


def test_the_cluster_default_reaches_every_node_and_a_broker_value_stays(cluster):
    m = cluster.master()
    other = next(i for i in cluster.nodes if i != m)
    assert set_cluster_default(cluster.nodes[other], "log.retention.ms", "3600000") == 0
    for i in cluster.nodes:
        wait_for(cluster, i, "log.retention.ms", ("3600000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value))

    # A topic created afterwards takes it, on whichever node answers.
    a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    from confluent_kafka.admin import NewTopic

    a.create_topics([NewTopic("dyn-topic", num_partitions=1, replication_factor=1)])["dyn-topic"].result(10)
    t = ConfigResource(ResourceType.TOPIC, "dyn-topic")
    c = a.describe_configs([t])[t].result(10)["retention.ms"]
    assert (c.value, c.source) == ("3600000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)

    # A per-broker value stays on its broker.
    r = ConfigResource(
        ResourceType.BROKER,
        str(other),
        incremental_configs=[ConfigEntry("log.retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)],
    )
    a.incremental_alter_configs([r])[r].result(10)
    wait_for(cluster, other, "log.retention.ms", ("7200000", ConfigSource.DYNAMIC_BROKER_CONFIG.value))
    time.sleep(1)
    for i in cluster.nodes:
        if i != other:
            assert broker_config(cluster, i, "log.retention.ms") == (
                "3600000",
                ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value,
            )

    # The node that set the default dies; a change made through another
    # node still reaches the rest, and the dead one when it comes back.
    cluster.nodes[other].kill()
    third = next(i for i in cluster.nodes if i not in (m, other))
    assert set_cluster_default(cluster.nodes[third], "log.retention.ms", "1800000") == 0
    wait_for(cluster, m, "log.retention.ms", ("1800000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value))
    cluster.nodes[other].start()
    # Its own value still wins on it; without it, the new cluster default.
    wait_for(cluster, other, "log.retention.ms", ("7200000", ConfigSource.DYNAMIC_BROKER_CONFIG.value), timeout=20)
    a = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    r = ConfigResource(
        ResourceType.BROKER,
        str(other),
        incremental_configs=[ConfigEntry("log.retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)],
    )
    a.incremental_alter_configs([r])[r].result(10)
    wait_for(cluster, other, "log.retention.ms", ("1800000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value))
