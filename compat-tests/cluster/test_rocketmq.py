"""RocketMQ clients and a three-node set: every node's name server routes
the set's broker name to its master as brokerId 0 and the replicas under
their own ids; the real client (rocketmq-client-rust) sends and consumes
through a replica's name server; a failover moves brokerId 0 to the new
master in every name server within seconds."""
import json
import subprocess
import time

import pytest
from conftest import Cluster, etcd_get, remoting

from rokka_fixture import HARNESS


@pytest.fixture(scope="module")
def cluster():
    c = Cluster("rocketmq")
    yield c
    c.close()


def route(node, topic):
    """brokerId -> address of the set in `node`'s name server (via the harness-free raw call)."""
    code, _, body = remoting(node.namesrv_port, 105, {"topic": topic})
    if code != 0:
        return {}
    # brokerAddrs keys are numbers in RocketMQ's fastjson output.
    import re

    addrs = re.search(r'"brokerAddrs":\{([^}]*)\}', body)
    return {int(k): v for k, v in re.findall(r'"?(\d+)"?:"([^"]+)"', addrs.group(1))} if addrs else {}


def test_routes_and_send_consume_through_a_replica_name_server(cluster):
    # Sends wait for the set's replicas (min_insync_replicas 2): below it
    # they are refused before they are stored, as Apache's controller mode.
    assert cluster.wait_in_sync()
    m = cluster.master()
    replica = next(i for i in cluster.nodes if i != m)
    # Registrations reach every name server within a registration round.
    deadline = time.time() + 10
    while time.time() < deadline and len(route(cluster.nodes[replica], "TBW102")) < 3:
        time.sleep(0.2)
    p = subprocess.run(
        [HARNESS, f"127.0.0.1:{cluster.nodes[replica].namesrv_port}", "send-consume"],
        capture_output=True, timeout=150, text=True,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    want_master = f"127.0.0.1:{cluster.nodes[m].broker_port}"
    for i, node in cluster.nodes.items():
        r = route(node, "CompatSendConsume")
        assert r.get(0) == want_master, (i, r)
        assert sorted(r) == sorted([0] + [j + 1 for j in cluster.nodes if j != m]), (i, r)
    # A client before V4_9_4 (rocketmq-client-go up to 2.1.1 says 317) gets
    # the route in fastjson's form, broker ids as bare numbers — it reads a
    # quoted key as id 0, so a replica could pass for the master — as
    # Apache's name server writes it; current clients get standard JSON.
    node = cluster.nodes[replica]
    _, _, old = remoting(node.namesrv_port, 105, {"topic": "CompatSendConsume"}, version=317)
    assert f'0:"{want_master}"' in old and '"0":' not in old, old
    _, _, new_form = remoting(node.namesrv_port, 105, {"topic": "CompatSendConsume", "acceptStandardJsonOnly": "true"},
                              version=317)
    assert f'"0":"{want_master}"' in new_form, new_form
    # Failover: brokerId 0 moves to the new master everywhere.
    cluster.nodes[m].kill()
    new = cluster.master(timeout=30, exclude=(m,))
    want = f"127.0.0.1:{cluster.nodes[new].broker_port}"
    deadline = time.time() + 10
    ok = False
    while time.time() < deadline and not ok:
        ok = all(route(n, "CompatSendConsume").get(0) == want for i, n in cluster.nodes.items() if i != m)
        time.sleep(0.2)
    assert ok, {i: route(n, "CompatSendConsume") for i, n in cluster.nodes.items() if i != m}
    cluster.nodes[m].start()


def test_a_subscription_group_config_set_on_one_node_holds_on_every_node(cluster):
    """mqadmin updateSubGroup at the master (code 200): answered once etcd
    holds the config; every node answers it (352) within a tick and refuses
    the group's pulls (16, NO_PERMISSION); deleted at a replica (207), it
    goes from every node."""
    assert cluster.wait_in_sync()
    m = cluster.master()
    replica = next(i for i in cluster.nodes if i != m)
    group = "cluster-subgroup"
    body = json.dumps({"groupName": group, "consumeEnable": False, "retryMaxTimes": 5}).encode()
    code, _, _ = remoting(cluster.nodes[m].broker_port, 200, {}, body=body)
    assert code == 0
    stored = etcd_get(cluster.etcd.endpoint, f"/rokka/{cluster.name}/subscription-groups/{group}")
    assert stored is not None and json.loads(stored)["consumeEnable"] is False, stored

    def config_at(node):
        code, _, b = remoting(node.broker_port, 352, {"group": group})
        return json.loads(b) if code == 0 else None

    def everywhere(check):
        deadline = time.time() + 15
        while time.time() < deadline and not all(check(config_at(n)) for n in cluster.nodes.values()):
            time.sleep(0.2)
        return [config_at(n) for n in cluster.nodes.values()]

    seen = everywhere(lambda c: c is not None and c["retryMaxTimes"] == 5)
    assert all(c is not None and c["consumeEnable"] is False and c["retryMaxTimes"] == 5 for c in seen), seen
    pull = {"consumerGroup": group, "topic": "TBW102", "queueId": "0", "queueOffset": "0", "maxMsgNums": "1",
            "sysFlag": "0", "suspendTimeoutMillis": "0"}
    for i, n in cluster.nodes.items():
        assert remoting(n.broker_port, 11, pull)[0] == 16, i
    code, _, _ = remoting(cluster.nodes[replica].broker_port, 207, {"groupName": group})
    assert code == 0
    assert everywhere(lambda c: c is None) == [None] * len(cluster.nodes)

    # A list of 300 (mqadmin updateSubGroupList, code 225) goes to etcd in
    # several transactions: answered once etcd holds them all, every one
    # read back at the replica; deleted, each goes.
    names = [f"cluster-subgroup-list-{i}" for i in range(300)]
    body = json.dumps({"groupConfigList": [{"groupName": g, "retryMaxTimes": 3} for g in names]}).encode()
    code, remark, _ = remoting(cluster.nodes[m].broker_port, 225, {}, body=body)
    assert code == 0, remark
    for g in (names[0], names[150], names[-1]):
        assert etcd_get(cluster.etcd.endpoint, f"/rokka/{cluster.name}/subscription-groups/{g}") is not None, g
    deadline = time.time() + 15
    while time.time() < deadline:
        code, _, b = remoting(cluster.nodes[replica].broker_port, 201, {})
        table = json.loads(b)["subscriptionGroupTable"] if code == 0 else {}
        if all(table.get(g, {}).get("retryMaxTimes") == 3 for g in names):
            break
        time.sleep(0.2)
    missing = [g for g in names if table.get(g, {}).get("retryMaxTimes") != 3]
    assert not missing, missing[:5]
    for g in names[:100]:
        assert remoting(cluster.nodes[replica].broker_port, 207, {"groupName": g})[0] == 0, g
    assert etcd_get(cluster.etcd.endpoint, f"/rokka/{cluster.name}/subscription-groups/{names[99]}") is None


def test_an_etcd_taking_fewer_operations_per_transaction_still_takes_every_config():
    """The controller writes users and configs in etcd transactions of up
    to 64; an etcd started with a smaller --max-txn-ops refuses those as
    too large, and the node goes on in smaller ones: a list of 100 is
    answered once etcd holds every config."""
    c = Cluster("rocketmq-small-txn", n=1, min_isr=1, etcd_args=("--max-txn-ops", "8"))
    try:
        assert c.wait_in_sync(size=1)
        node = next(iter(c.nodes.values()))
        names = [f"small-txn-{i}" for i in range(100)]
        body = json.dumps({"groupConfigList": [{"groupName": g, "retryMaxTimes": 4} for g in names]}).encode()
        code, remark, _ = remoting(node.broker_port, 225, {}, body=body)
        assert code == 0, remark
        missing = [g for g in names
                   if etcd_get(c.etcd.endpoint, f"/rokka/{c.name}/subscription-groups/{g}") is None]
        assert not missing, missing[:5]
        assert "etcd refused a transaction as too large" in open(node.log_path, errors="replace").read()
    finally:
        c.close()
