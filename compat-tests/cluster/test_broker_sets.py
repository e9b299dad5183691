"""Two broker sets of two nodes behind one etcd (docs/cluster.md, "Several
broker sets"): a topic's partitions are placed over both sets; Kafka
Metadata from any node names each partition's set master; every name
server routes both sets' queues under their broker names; a message
produced by either protocol to partition p is the one the other reads at
(set, queue); a Kafka group coordinated on one set commits the offsets of
the other set's partitions on that set, where RocketMQ consumers of the
same group find them."""
import collections
import json
import re
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import SETS, TwoSets, read_topic, remoting

HARNESS = __import__("test_rocketmq").HARNESS

@pytest.fixture(scope="module")
def cluster():
    c = TwoSets("sets")
    yield c
    c.close()


def masters(cluster, timeout=30):
    return cluster.masters(timeout)


def queue_counts(node, topic):
    """{broker name: read queue count} in `node`'s name server route."""
    code, _, body = remoting(node.namesrv_port, 105, {"topic": topic})
    if code != 0:
        return {}
    out = {}
    for q in re.findall(r"\{[^{}]*\"brokerName\"[^{}]*\"readQueueNums\"[^{}]*\}", body):
        name = re.search(r'"brokerName":"([^"]+)"', q).group(1)
        out[name] = int(re.search(r'"readQueueNums":(\d+)', q).group(1))
    return out


def create_topic(cluster, topic, partitions, via):
    a = AdminClient({"bootstrap.servers": cluster.nodes[via].bootstrap})
    for f in a.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(15)
    return a


def leaders(admin, topic, want):
    """{partition: leader} once Metadata lists `want` partitions with leaders."""
    deadline = time.time() + 20
    while time.time() < deadline:
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if md and len(md.partitions) == want and all(p.leader >= 0 for p in md.partitions.values()):
            return {p: md.partitions[p].leader for p in md.partitions}
        time.sleep(0.2)
    raise AssertionError(f"{topic}: {want} partitions with leaders")


def placement(lead, masters_by_set):
    """{partition: (set, queue)} from the leaders: a set's queues are its
    partitions in partition order (docs/decisions/0005)."""
    set_of = {m: s for s, m in masters_by_set.items()}
    seen, out = {}, {}
    for p in sorted(lead):
        s = set_of[lead[p]]
        out[p] = (s, seen.get(s, 0))
        seen[s] = seen.get(s, 0) + 1
    return out


def test_partitions_spread_over_both_sets_and_every_node_agrees(cluster):
    m = masters(cluster)
    a = create_topic(cluster, "spread", 12, via=4)
    lead = leaders(a, "spread", 12)
    assert sorted(set(lead.values())) == sorted(m.values()), (lead, m)
    assert sorted(list(lead.values()).count(x) for x in m.values()) == [6, 6], lead
    # Every node's Metadata and every name server say the same.
    for i, node in cluster.nodes.items():
        again = leaders(AdminClient({"bootstrap.servers": node.bootstrap}), "spread", 12)
        assert again == lead, (i, again, lead)
        deadline = time.time() + 10
        while time.time() < deadline and queue_counts(node, "spread") != {"set-a": 6, "set-b": 6}:
            time.sleep(0.2)
        assert queue_counts(node, "spread") == {"set-a": 6, "set-b": 6}, (i, queue_counts(node, "spread"))
    # The name server's cluster info lists both sets' brokers.
    code, _, body = remoting(cluster.nodes[1].namesrv_port, 106, {})
    assert code == 0 and '"set-a"' in body and '"set-b"' in body, body[:500]
    # Adding partitions appends: nothing placed moves.
    from confluent_kafka.admin import NewPartitions

    for f in a.create_partitions([NewPartitions("spread", 16)]).values():
        f.result(15)
    grown = leaders(a, "spread", 16)
    assert {p: grown[p] for p in lead} == lead
    assert sorted(list(grown.values()).count(x) for x in m.values()) == [8, 8], grown


def test_a_new_topic_is_routed_by_every_name_server_at_once(cluster):
    """A RocketMQ client that starts right after a CreateTopics on any node
    must find the route at whichever name server it asks, or it waits for
    its next route poll (30 s): each node routes the topic from its table
    or, before its table has it, from etcd's (not only once every set's
    master has registered it again)."""
    masters(cluster)
    for via in cluster.nodes:
        topic = f"routed-{via}"
        create_topic(cluster, topic, 8, via=via)
        # No waiting: asked the moment CreateTopics answered.
        seen = {i: queue_counts(node, topic) for i, node in cluster.nodes.items()}
        for i, counts in seen.items():
            assert sorted(counts) == ["set-a", "set-b"] and sum(counts.values()) == 8, (via, i, seen)


def test_each_protocol_reads_what_the_other_wrote_at_the_same_set_and_queue(cluster):
    m = masters(cluster)
    topic, per = "crossing", 40
    a = create_topic(cluster, topic, 12, via=1)
    where = placement(leaders(a, topic, 12), m)
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all", "enable.idempotence": True})
    for i in range(per):
        for part in range(12):
            p.produce(topic, value=f"k-{part}-{i}".encode(), partition=part)
    assert p.flush(30) == 0
    # RocketMQ producers spread over both sets' queues.
    out = subprocess.run(
        [HARNESS, f"127.0.0.1:{cluster.nodes[3].namesrv_port}", "cross-produce", topic, "120"],
        capture_output=True, timeout=150, text=True,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    # Kafka reads every message, each partition in order.
    values = read_topic(cluster.bootstrap(), topic, 12)
    kafka_values = [v for v in values if v.startswith("k-")]
    assert len(kafka_values) == 12 * per and len(set(kafka_values)) == 12 * per
    for part in range(12):
        mine = [int(v.split("-")[2]) for v in kafka_values if v.split("-")[1] == str(part)]
        assert mine == list(range(per)), (part, mine[:10])
    assert sorted(v for v in values if v.startswith("rmq-")) == sorted(f"rmq-{i}-é" for i in range(120))
    # A RocketMQ consumer gets each Kafka record from (set, queue) = the
    # partition's place; the storing broker names the set.
    ports = {str(cluster.nodes[i].broker_port): SETS[i] for i in cluster.nodes}
    out = subprocess.run(
        [HARNESS, f"127.0.0.1:{cluster.nodes[2].namesrv_port}", "cross-consume", topic, "sets-cross", str(12 * per + 120)],
        capture_output=True, timeout=150, text=True,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    seen = {}
    for line in out.stdout.splitlines():
        if not line.startswith("compat: msg "):
            continue
        q, _off, _born, body, _keys, _tags, _props, host = line[len("compat: msg "):].split(" ")
        body = bytes.fromhex(body).decode() if body != "-" else ""
        if body.startswith("k-"):
            seen[body] = (ports[host.rsplit(":", 1)[1]], int(q))
    assert len(seen) == 12 * per, len(seen)
    for body, at in seen.items():
        part = int(body.split("-")[1])
        assert at == where[part], (body, at, where[part])


def committed(bootstrap, group, topic, partitions):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
    c.close()
    return {tp.partition: tp.offset for tp in got}


def test_a_kafka_group_commits_on_every_set_and_rocketmq_members_continue(cluster):
    """The sequential migration over two sets: a Kafka group consumes and
    commits (the coordinator forwards the other set's partitions' commits
    to that set's master); RocketMQ consumers of the same group start
    where it stopped, on both sets; their commits are what Kafka reads."""
    m = masters(cluster)
    topic, group = "migrating", "sets-migrate"
    a = create_topic(cluster, topic, 6, via=2)
    where = placement(leaders(a, topic, 6), m)
    assert {s for s, _ in where.values()} == {"set-a", "set-b"}, where
    p = Producer({"bootstrap.servers": cluster.bootstrap()})
    for i in range(60):
        p.produce(topic, value=f"first-{i}".encode(), partition=i % 6)
    assert p.flush(30) == 0
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    got = []
    deadline = time.time() + 40
    while len(got) < 60 and time.time() < deadline:
        msg = c.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value().decode())
    assert len(got) == 60, len(got)
    c.commit(asynchronous=False)
    c.close()
    assert committed(cluster.bootstrap(), group, topic, 6) == {q: 10 for q in range(6)}
    # Each set holds its own queues' offsets: RocketMQ's QUERY_CONSUMER_OFFSET
    # on each set's master answers for its queues.
    for part, (s, q) in where.items():
        code, ext, _ = remoting(cluster.nodes[m[s]].broker_port, 14, {"consumerGroup": group, "topic": topic, "queueId": str(q)})
        assert code == 0 and ext.get("offset") == "10", (part, s, q, code, ext)
    # More messages; RocketMQ members of the group take only those.
    for i in range(60):
        p.produce(topic, value=f"second-{i}".encode(), partition=i % 6)
    assert p.flush(30) == 0
    out = subprocess.run(
        [HARNESS, f"127.0.0.1:{cluster.nodes[1].namesrv_port}", "cross-consume", topic, group, "60"],
        capture_output=True, timeout=150, text=True,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    bodies = [
        bytes.fromhex(l.split(" ")[5]).decode() for l in out.stdout.splitlines() if l.startswith("compat: msg ")
    ]
    assert sorted(bodies) == sorted(f"second-{i}" for i in range(60)), bodies[:5]
    # ... and Kafka reads back what they committed on both sets.
    deadline = time.time() + 15
    while time.time() < deadline and committed(cluster.bootstrap(), group, topic, 6) != {q: 20 for q in range(6)}:
        time.sleep(0.5)
    assert committed(cluster.bootstrap(), group, topic, 6) == {q: 20 for q in range(6)}


def hashed_apart(prefix, other=None):
    """Two names `prefix-N` coordinated by different broker sets (the
    coordinator's set is crc32(name) mod the set count, as FindCoordinator
    places it); with `other`, one name on another set than `other`."""
    import zlib

    names = [f"{prefix}-{i}" for i in range(64)]
    if other is not None:
        return next(n for n in names if zlib.crc32(n.encode()) % 2 != zlib.crc32(other.encode()) % 2)
    first = names[0]
    return first, next(n for n in names if zlib.crc32(n.encode()) % 2 != zlib.crc32(first.encode()) % 2)


def read_all(bootstrap, topic, partitions, isolation, want=None, seconds=8):
    """Every value of `topic` from the start, as `isolation` reads it (until
    `want` values arrived, or for `seconds`)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.time()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.time() + seconds
    while time.time() < deadline and (want is None or len(got) < want):
        for x in c.consume(100, 0.3):
            if not x.error():
                got.append(x.value().decode())
    c.close()
    return got


def test_a_kafka_transaction_spans_both_sets(cluster):
    """Transactions over partitions of both sets, each transactional id's
    coordinator on one set (one id per set): a commit shows every record
    to read_committed readers of both sets' partitions, an abort none (and
    RocketMQ consumers skip them too); an open transaction holds back
    read_committed readers of the other set's partitions until it
    commits; consume-transform-produce commits the offsets of a group
    coordinated by the other set, on the set of each offset's queue,
    only when the transaction commits."""
    m = masters(cluster)
    out, src = "txn-spread", "txn-source"
    a = create_topic(cluster, out, 4, via=1)
    create_topic(cluster, src, 4, via=3)
    where = placement(leaders(a, out, 4), m)
    assert {s for s, _ in where.values()} == {"set-a", "set-b"}, where
    src_where = placement(leaders(a, src, 4), m)
    committed_values = []
    # The names chosen by hash are placed where the test means them to be.
    for key, kind in [(t, 1) for t in hashed_apart("spread-txn")] + [(hashed_apart("ctp-txn")[0], 1)]:
        assert SETS[find_coordinator(cluster.nodes[1], key, kind)] == coordinator_set(key), key
    ctp_group = hashed_apart("ctp-group", other=hashed_apart("ctp-txn")[0])
    assert SETS[find_coordinator(cluster.nodes[1], ctp_group, 0)] != coordinator_set(hashed_apart("ctp-txn")[0])
    for tid in hashed_apart("spread-txn"):
        p = Producer({"bootstrap.servers": cluster.bootstrap(), "transactional.id": tid})
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(8):
            p.produce(out, value=f"{tid}-commit-{i}".encode(), partition=i % 4)
        p.commit_transaction(30)
        committed_values += [f"{tid}-commit-{i}" for i in range(8)]
        p.begin_transaction()
        for i in range(8):
            p.produce(out, value=f"{tid}-abort-{i}".encode(), partition=i % 4)
        # Written before the abort (librdkafka drops what it has not sent).
        assert p.flush(30) == 0
        p.abort_transaction(30)
        # Open: written to every partition, not committed yet.
        p.begin_transaction()
        for i in range(4):
            p.produce(out, value=f"{tid}-open-{i}".encode(), partition=i)
        assert p.flush(30) == 0
        seen = read_all(cluster.bootstrap(), out, 4, "read_committed", seconds=4)
        assert sorted(seen) == sorted(committed_values), (tid, sorted(set(seen) - set(committed_values)))
        p.commit_transaction(30)
        committed_values += [f"{tid}-open-{i}" for i in range(4)]
        seen = read_all(cluster.bootstrap(), out, 4, "read_committed", want=len(committed_values))
        assert sorted(seen) == sorted(committed_values), (tid, len(seen), len(committed_values))
    everything = read_all(cluster.bootstrap(), out, 4, "read_uncommitted", want=len(committed_values) + 16)
    assert len(everything) == len(committed_values) + 16, "the aborted records are in the log"
    # RocketMQ consumers of both sets skip the aborted records.
    r = subprocess.run(
        [HARNESS, f"127.0.0.1:{cluster.nodes[2].namesrv_port}", "cross-consume", out, "txn-rmq-reader", str(len(committed_values))],
        capture_output=True, timeout=150, text=True,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    bodies = [bytes.fromhex(l.split(" ")[5]).decode() for l in r.stdout.splitlines() if l.startswith("compat: msg ")]
    assert sorted(bodies) == sorted(committed_values), sorted(set(bodies) ^ set(committed_values))[:10]

    # Consume-transform-produce: the group's coordinator is on the other set
    # than the transaction's; the source's offsets live on both sets.
    tid = hashed_apart("ctp-txn")[0]
    group = hashed_apart("ctp-group", other=tid)
    seed = Producer({"bootstrap.servers": cluster.bootstrap()})
    for i in range(8):
        seed.produce(src, value=f"in-{i}".encode(), partition=i % 4)
    assert seed.flush(30) == 0
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "transactional.id": tid})
    p.init_transactions(30)
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    c.subscribe([src])
    got = []
    deadline = time.time() + 40
    while len(got) < 8 and time.time() < deadline:
        got += [x for x in c.consume(10, 0.5) if not x.error()]
    assert len(got) == 8, len(got)
    ends = [TopicPartition(src, q, 2) for q in range(4)]
    # Aborted: the offsets do not move.
    p.begin_transaction()
    p.produce(out, value=b"ctp-aborted", partition=0)
    p.send_offsets_to_transaction(ends, c.consumer_group_metadata(), 30)
    assert p.flush(30) == 0
    p.abort_transaction(30)
    assert all(o < 0 for o in committed(cluster.bootstrap(), group, src, 4).values())
    # Committed: every partition's offset, each on its queue's set.
    p.begin_transaction()
    for x in got:
        p.produce(out, value=b"out-" + x.value(), partition=x.partition())
    p.send_offsets_to_transaction(ends, c.consumer_group_metadata(), 30)
    p.commit_transaction(30)
    c.close()
    assert committed(cluster.bootstrap(), group, src, 4) == {q: 2 for q in range(4)}
    m = masters(cluster)
    for part, (s, q) in src_where.items():
        code, ext, _ = remoting(
            cluster.nodes[m[s]].broker_port, 14, {"consumerGroup": group, "topic": src, "queueId": str(q)}
        )
        assert code == 0 and ext.get("offset") == "2", (part, s, q, code, ext)
    # The other sets took part (their markers and held offsets), both ways.
    parts = collections.Counter()
    for n in cluster.nodes.values():
        for k, v in n.metric_values().items():
            if k.startswith("rokka_kafka_transaction_parts_total"):
                parts[k.split('"')[1]] += v
    assert parts["commit"] >= 3 and parts["abort"] >= 3, parts


def coordinator_set(key):
    """The set coordinating a group or transactional id: crc32 of the name
    over the sets in name order (FindCoordinator's placement)."""
    import zlib

    return ("set-a", "set-b")[zlib.crc32(key.encode()) % 2]


def find_coordinator(node, key, key_type):
    """The node id a raw FindCoordinator v1 to `node` names for `key`
    (key_type 0 group, 1 transaction), retrying while none is elected."""
    import socket
    import struct

    def string(v):
        b = v.encode()
        return struct.pack(">h", len(b)) + b

    body = struct.pack(">hhi", 10, 1, 7) + string("broker-sets-test") + string(key) + struct.pack(">b", key_type)
    deadline = time.time() + 20
    while True:
        with socket.create_connection(("127.0.0.1", node.kafka_port), timeout=5) as s:
            s.sendall(struct.pack(">i", len(body)) + body)
            n = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
            data = s.recv(n, socket.MSG_WAITALL)
        # correlation id, throttle, error code, error message, node id
        err = struct.unpack(">h", data[8:10])[0]
        mlen = struct.unpack(">h", data[10:12])[0]
        at = 12 + max(mlen, 0)
        if err == 0:
            return struct.unpack(">i", data[at : at + 4])[0]
        assert time.time() < deadline, f"FindCoordinator {key}: error {err}"
        time.sleep(0.2)


def set_in_sync(cluster, name, timeout=60):
    """The master of set `name` once its replica is back in sync."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for i, n in cluster.nodes.items():
            if SETS[i] != name or not n.proc:
                continue
            try:
                v = n.metric_values()
            except OSError:
                continue
            if v.get("rokka_cluster_role") == 1.0 and v.get("rokka_cluster_sync_state_set_size") == 2.0:
                return i
        time.sleep(0.2)
    raise AssertionError(f"{name}: no master with its replica in sync within {timeout} s")


def remote_txn_errors(cluster, node):
    v = cluster.nodes[node].metric_values()
    return sum(n for k, n in v.items() if k.startswith("rokka_cluster_remote_txn_errors_total"))


def test_a_transaction_across_sets_commits_through_a_master_kill(cluster):
    """A transaction over both sets' partitions, written and flushed, then
    a master killed with SIGKILL before the commit — first the other
    set's (a participant: its replica takes over holding the open
    transaction, whose part travels with the set's transaction state, and
    writes the markers the coordinator sends it), then the coordinator
    set's (its replica takes over the transaction and its other set's
    partitions and ends it on both sets). Each commit_transaction, called
    right after the kill, succeeds once the set has failed over, and
    read_committed readers get every record once."""
    topic = "txn-kill"
    a = create_topic(cluster, topic, 4, via=2)
    leaders(a, topic, 4)
    committed_values = []
    for rnd, victim_is in enumerate(("participant", "coordinator")):
        for s in ("set-a", "set-b"):
            set_in_sync(cluster, s)
        m = masters(cluster)
        tid = f"kill-txn-{rnd}"
        coord = coordinator_set(tid)
        victim = m[coord] if victim_is == "coordinator" else m["set-b" if coord == "set-a" else "set-a"]
        p = Producer({"bootstrap.servers": cluster.bootstrap(), "transactional.id": tid})
        p.init_transactions(30)
        p.begin_transaction()
        values = [f"{tid}-{i}" for i in range(20)]
        for i, v in enumerate(values):
            p.produce(topic, value=v.encode(), partition=i % 4)
        assert p.flush(30) == 0
        coordinator = m[coord]
        errors_before = remote_txn_errors(cluster, coordinator)
        cluster.nodes[victim].kill()
        # Committed at once: the killed set has no master for a few seconds.
        started = time.time()
        p.commit_transaction(60)
        took = time.time() - started
        committed_values += values
        survivor = next(i for i in cluster.nodes if SETS[i] == SETS[victim] and i != victim)
        assert cluster.role(survivor) == "master", f"{SETS[victim]} failed over"
        if victim_is == "participant":
            # The coordinator reached the participant only after its set
            # failed over: its first tries failed and were repeated.
            assert remote_txn_errors(cluster, coordinator) > errors_before, took
        print(f"\ncross-set transaction: {victim_is} master killed, commit_transaction took {took:.1f} s")
        cluster.nodes[victim].start()
        seen = read_all(cluster.bootstrap(), topic, 4, "read_committed", want=len(committed_values), seconds=30)
        assert sorted(seen) == sorted(committed_values), (victim_is, len(seen), sorted(set(committed_values) - set(seen))[:5])
    # Nothing more arrives (no record twice).
    seen = read_all(cluster.bootstrap(), topic, 4, "read_committed", seconds=3)
    assert sorted(seen) == sorted(committed_values), len(seen)
    # The module's next tests find both sets whole again.
    for s in ("set-a", "set-b"):
        set_in_sync(cluster, s)


def group_coordinated_off(admin, set_of, topic_set, prefix):
    """A group name `<prefix>-<i>` whose coordinator is on another set than
    `topic_set`."""
    for i in range(64):
        g = f"{prefix}-{i}"
        d = admin.describe_consumer_groups([g])[g].result(15)
        if set_of.get(d.coordinator.id) not in (None, topic_set):
            return g
    raise AssertionError("no group coordinated by the other set")


def test_a_groups_offsets_listed_whole_from_its_coordinator(cluster):
    """An OffsetFetch for all of a group's topics (the admin API's
    list_consumer_group_offsets without partitions) lists what the group
    committed on every set, a topic placed only on a set other than the
    coordinator's included; that set answers RocketMQ's GET_CONSUME_STATS
    with the offset and the queue's end."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    m = masters(cluster)
    set_of = {n: s for s, n in m.items()}
    topic = "listed-elsewhere"
    a = create_topic(cluster, topic, 1, via=1)
    topic_set = set_of[leaders(a, topic, 1)[0]]
    group = group_coordinated_off(a, set_of, topic_set, "lister")
    p = Producer({"bootstrap.servers": cluster.bootstrap()})
    for i in range(9):
        p.produce(topic, value=f"l-{i}".encode(), partition=0)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
    c.close()
    listed = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(15)
    got = {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions}
    assert got == {(topic, 0): 7}, got
    code, _, body = remoting(cluster.nodes[m[topic_set]].broker_port, 208, {"consumerGroup": group})
    assert code == 0, (code, body)
    assert re.search(
        r'\{"brokerName":"%s","queueId":0,"topic":"%s"\}:\{"brokerOffset":9,"consumerOffset":7,' % (topic_set, topic), body
    ), body


def test_a_group_deleted_from_its_coordinator_loses_its_offsets_on_every_set(cluster):
    """Kafka DeleteGroups at the group's coordinator deletes what the group
    committed on the other set's master too (Kafka deletes a group's
    offsets together): listed again afterwards, the group has none, and a
    group with offsets on the other set only is found (not
    GROUP_ID_NOT_FOUND)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    m = masters(cluster)
    set_of = {n: s for s, n in m.items()}
    topic = "deleted-elsewhere"
    a = create_topic(cluster, topic, 1, via=1)
    topic_set = set_of[leaders(a, topic, 1)[0]]
    group = group_coordinated_off(a, set_of, topic_set, "deleter")
    c = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    c.close()
    listed = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(15)
    assert {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions} == {(topic, 0): 3}
    a.delete_consumer_groups([group])[group].result(15)
    listed = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(15)
    got = {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions}
    assert got == {}, f"offsets left on the other set after DeleteGroups: {got}"


def send_rocketmq(port, topic, queue, body, props):
    """A raw SEND_MESSAGE (code 10) to a broker listener: the answer's code."""
    import socket
    import struct

    p = "".join(f"{k}\x01{v}\x02" for k, v in props.items())
    ext = {
        "producerGroup": "pg-sets", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": str(queue), "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
        "properties": p, "reconsumeTimes": "0", "unitMode": "false",
    }
    header = json.dumps({"code": 10, "language": "JAVA", "version": 475, "opaque": 7, "flag": 0, "extFields": ext}).encode()
    frame = struct.pack(">I", 4 + len(header) + len(body)) + struct.pack(">I", len(header)) + header + body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(frame)
        n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
        data = s.recv(n, socket.MSG_WAITALL)
    hlen = struct.unpack(">I", data[:4])[0] & 0xFFFFFF
    h = json.loads(data[4 : 4 + hlen])
    return h["code"], h.get("remark")


def test_delayed_and_timer_messages_go_through_every_set(cluster):
    """The broker's own topics (delay levels, the timer wheel) are each
    set's own, as every Apache broker's: a DELAY or TIMER_DELAY_MS send
    through either set's master is stored and delivered to its queue there
    (with the schedule topic's 18 queues spread over the sets, every delayed
    send failed, and the timer topic's one queue was on one set only)."""
    m = masters(cluster)
    topic = "delayed-sets"
    a = create_topic(cluster, topic, 2, via=1)
    lead = leaders(a, topic, 2)
    set_of = {n: s for s, n in m.items()}
    for s, node in m.items():
        port = cluster.nodes[node].broker_port
        for props in ({"DELAY": "1"}, {"TIMER_DELAY_MS": "1000"}):
            code, remark = send_rocketmq(port, topic, 0, b"later", props)
            assert code == 0, (s, props, code, remark)
        # Both reach this set's queue 0 once due.
        deadline = time.time() + 20
        while True:
            code, ext, _ = remoting(port, 30, {"topic": topic, "queueId": "0"})
            if code == 0 and ext.get("offset") == "2":
                break
            assert time.time() < deadline, (s, code, ext)
            time.sleep(0.3)
    assert set(set_of[n] for n in lead.values()) == set(m), "the topic is on both sets"


def test_a_draining_set_takes_no_new_placements(cluster):
    """`rokka cluster drain <set>`: new topics and new partitions go to the
    other set; what was placed stays; `undrain` lets it take them again."""
    from rokka_fixture import rokka_bin
    from confluent_kafka.admin import NewPartitions

    m = masters(cluster)
    cfg = cluster.nodes[1].config

    def rokka_cluster(*args):
        p = subprocess.run([rokka_bin(), "--config", cfg, "cluster", *args], capture_output=True, timeout=30, text=True)
        return p.returncode, p.stdout + p.stderr

    a = create_topic(cluster, "before-drain", 4, via=1)
    before = leaders(a, "before-drain", 4)
    assert sorted(set(before.values())) == sorted(m.values())
    assert rokka_cluster("drain", "set-b") == (0, "broker set set-b: draining\n")
    code, out = rokka_cluster("drain", "no-such-set")
    assert code == 1 and "no broker set" in out, out
    deadline = time.time() + 10
    while time.time() < deadline and any(
        n.metric_values().get('rokka_cluster_set_draining{set="set-b"}') != 1.0 for n in cluster.nodes.values()
    ):
        time.sleep(0.2)
    # Every node places on set-a only now.
    for via in (2, 4):
        name = f"drained-{via}"
        a = create_topic(cluster, name, 4, via=via)
        assert set(leaders(a, name, 4).values()) == {m["set-a"]}, name
    for f in a.create_partitions([NewPartitions("before-drain", 6)]).values():
        f.result(15)
    grown = leaders(a, "before-drain", 6)
    assert {p: grown[p] for p in before} == before, "placed partitions stay"
    assert grown[4] == grown[5] == m["set-a"], grown
    assert rokka_cluster("undrain", "set-b") == (0, "broker set set-b: taking placements\n")
    deadline = time.time() + 10
    while time.time() < deadline and any(
        n.metric_values().get('rokka_cluster_set_draining{set="set-b"}') != 0.0 for n in cluster.nodes.values()
    ):
        time.sleep(0.2)
    a = create_topic(cluster, "after-drain", 4, via=3)
    assert sorted(set(leaders(a, "after-drain", 4).values())) == sorted(m.values())
    # Operators see the placements per set.
    counts = cluster.nodes[1].metric_values()
    total = sum(v for k, v in counts.items() if k.startswith("rokka_cluster_set_partitions{"))
    assert counts.get('rokka_cluster_set_master{set="set-b"}') == float(m["set-b"]), counts
    assert total >= 4 + 6 + 8 + 4, counts


class Member:
    """A harness `cross-member` of a RocketMQ group (rocketmq-client-rust
    push consumer, offsets persisted every second) for `secs` seconds. It
    is given every node's name server, node `via`'s first, as a deployment
    lists them all (a client whose only name server is on a killed node
    never learns the new master)."""

    def __init__(self, cluster, name, topic, group, secs, via):
        import os

        ids = sorted(cluster.nodes)
        ids = ids[ids.index(via) :] + ids[: ids.index(via)]
        namesrv = ";".join(f"127.0.0.1:{cluster.nodes[i].namesrv_port}" for i in ids)
        self.path = os.path.join(cluster.dir, f"harness-{name}.log")
        self._out = open(self.path, "w")
        self.proc = subprocess.Popen(
            [HARNESS, namesrv, "cross-member", topic, group, str(secs)],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def finish(self, timeout):
        self.proc.wait(timeout=timeout)
        self._out.close()
        out = open(self.path, errors="replace").read()
        assert self.proc.returncode == 0, f"{self.path}: {out[-2000:]}"
        return [bytes.fromhex(l.split()[2]).decode() for l in out.splitlines() if l.startswith("compat: got ")]


def test_groups_of_both_protocols_through_a_set_master_kill(cluster):
    """A 12-partition topic over both sets, written by Kafka producers (one
    per set's partitions) and a RocketMQ producer, read by a Kafka group of
    three, a RocketMQ group of three and a mixed group (one Kafka, two
    RocketMQ members) while set-b's master is killed with SIGKILL: set-a's
    partitions keep taking writes without a pause, set-b fails over to its
    replica, and each group gets every acknowledged message byte for byte
    (at least once; the Kafka group's second reads bounded, all reported)."""
    import collections
    import os
    import threading

    m = masters(cluster)
    started = time.time()
    topic = "through-kill"
    a = create_topic(cluster, topic, 12, via=1)
    lead = leaders(a, topic, 12)
    on = {s: [p for p in lead if lead[p] == i] for s, i in m.items()}
    assert len(on["set-a"]) == len(on["set-b"]) == 6, lead
    acked = {}  # value -> (partition or None for RocketMQ's, time)
    lock = threading.Lock()
    stop = threading.Event()
    done_reading = threading.Event()

    def produce(parts):
        p = Producer(
            {"bootstrap.servers": cluster.bootstrap(), "acks": "all", "enable.idempotence": True, "linger.ms": 5}
        )

        def done(err, msg):
            if err is None:
                with lock:
                    acked[msg.value().decode()] = (msg.partition(), time.time())

        i = 0
        while not stop.is_set():
            part = parts[i % len(parts)]
            try:
                p.produce(topic, value=f"live-{part}-{i // len(parts)}".encode(), partition=part, on_delivery=done)
                i += 1
            except BufferError:
                pass
            # About 100 messages a second per producer: the suite shares
            # two cores with four nodes and nine clients.
            p.poll(0.01)
            time.sleep(0.01)
        p.flush(60)

    groups = {
        g: {"got": {}, "seen": {}, "order": collections.defaultdict(list), "dups": [], "committed": set(), "lost": []}
        for g in ("kill-kafka", "kill-mixed")
    }
    errors = []
    commit_errors = collections.Counter()

    def kafka_member(group):
        g = groups[group]
        c = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap(),
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )
        # Every delivery counts; the member commits after each batch (a
        # failed commit is read again by whoever owns the partition next:
        # at-least-once, as Kafka's classic groups are across a coordinator
        # move).
        # Read since this member's last successful commit of the partition.
        pending = collections.defaultdict(list)
        c.subscribe([topic])
        try:
            while not (stop.is_set() and done_reading.is_set()):
                msgs = [x for x in c.consume(100, 0.3) if not x.error()]
                if not msgs:
                    continue
                with lock:
                    for x in msgs:
                        v = x.value().decode()
                        at = f"{x.partition()}:{x.offset()} by {id(c)} at {time.time() - started:.2f} s"
                        if v in g["got"]:
                            g["dups"].append(f"{v}@{at} (before: {g['seen'][v]})")
                            if v in g["committed"]:
                                g["lost"].append(f"{v}@{at} (committed: {g['seen'][v]})")
                        g["got"][v] = x.partition()
                        g["seen"][v] = at
                        g["order"][x.partition()].append(v)
                        pending[x.partition()].append((x.offset(), v))
                try:
                    for tp in c.commit(asynchronous=False) or []:
                        if tp.error is not None:
                            commit_errors[f"{tp.partition}:{tp.error.name()}"] += 1
                        else:
                            # What the commit covers: below the offset it
                            # stored (librdkafka's stored offsets, which
                            # can trail what consume() returned).
                            with lock:
                                done = [v for o, v in pending[tp.partition] if o < tp.offset]
                                g["committed"].update(done)
                                pending[tp.partition] = [(o, v) for o, v in pending[tp.partition] if o >= tp.offset]
                except Exception as e:  # noqa: BLE001
                    commit_errors[repr(e)[:80]] += 1
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        finally:
            c.close()

    rmq_stop = os.path.join(cluster.dir, "through-kill.stop")
    rmq_out = open(os.path.join(cluster.dir, "through-kill-producer.log"), "w")
    rmq_producer = subprocess.Popen(
        [HARNESS, f"127.0.0.1:{cluster.nodes[2].namesrv_port}", "dur-send", topic, "rmq", "100000", "60", "30", rmq_stop],
        stdout=rmq_out,
        stderr=subprocess.STDOUT,
        text=True,
    )
    members = [Member(cluster, f"kill-rmq-{i}", topic, "kill-rocketmq", 55, via=1 + i % 4) for i in range(3)]
    mixed = [Member(cluster, f"kill-mixed-{i}", topic, "kill-mixed", 55, via=2 + i) for i in range(2)]
    producers = [threading.Thread(target=produce, args=(on[s],)) for s in ("set-a", "set-b")]
    readers = [threading.Thread(target=kafka_member, args=("kill-kafka",)) for _ in range(3)]
    readers.append(threading.Thread(target=kafka_member, args=("kill-mixed",)))
    for t in producers + readers:
        t.start()
    # rocketmq-client-rust first sends its offsets 10 s after it starts: a
    # kill before that sends its group back to the first offset (the
    # client's behaviour, as Apache RocketMQ's).
    time.sleep(13)
    victim = m["set-b"]
    killed_at = time.time()
    cluster.nodes[victim].kill()
    survivor = next(i for i in cluster.nodes if SETS[i] == "set-b" and i != victim)
    deadline = time.time() + 30
    while time.time() < deadline and cluster.role(survivor) != "master":
        time.sleep(0.1)
    assert cluster.role(survivor) == "master", "set-b failed over"
    failed_over = time.time() - killed_at
    time.sleep(6)
    stop.set()
    open(rmq_stop, "w").close()
    for t in producers:
        t.join(90)
    rmq_producer.wait(60)
    rmq_out.close()
    with lock:
        for line in open(rmq_out.name):
            if line.startswith("compat: acked "):
                acked[line.split()[2]] = (None, time.time())
        want = dict(acked)
    deadline = time.time() + 60
    while time.time() < deadline:
        with lock:
            if set(want) <= set(groups["kill-kafka"]["got"]):
                break
        time.sleep(0.5)
    done_reading.set()
    for t in readers:
        t.join(30)
    rmq = [b for mem in members for b in mem.finish(90)]
    mixed_got = [b for mem in mixed for b in mem.finish(90)] + list(groups["kill-mixed"]["got"])
    cluster.nodes[victim].start()
    # set-a never paused: its acknowledgements around the kill have no gap
    # longer than a second.
    a_times = sorted(t for v, (p, t) in want.items() if p in on["set-a"] and killed_at - 2 < t < killed_at + 8)
    gaps = [y - x for x, y in zip(a_times, a_times[1:])]
    kafka = groups["kill-kafka"]
    rmq_sent = sum(1 for v in want if v.startswith("rmq-"))
    print(
        f"\nbroker sets: set-b failed over in {failed_over:.1f} s; {len(want)} acknowledged ({rmq_sent} by RocketMQ); "
        f"set-a's longest gap around the kill {max(gaps, default=0):.2f} s; "
        f"kafka group {len(kafka['got'])} (+{len(kafka['dups'])} twice, {len(kafka['lost'])} of them committed before), "
        f"rocketmq group {len(rmq)} ({len(rmq) - len(set(rmq))} twice), "
        f"mixed group {len(mixed_got)} ({len(mixed_got) - len(set(mixed_got))} twice)"
    )
    with open(os.path.join(cluster.dir, "through-kill.json"), "w") as f:
        json.dump(
            {
                "leaders": lead,
                "victim": victim,
                "killed_at": killed_at - started,
                "kafka_twice": kafka["dups"][:50],
                "kafka_committed_then_twice": kafka["lost"][:50],
                "commit_errors": commit_errors,
                "kafka_missing": sorted(set(want) - set(kafka["got"]))[:50],
                "waiting_left": 0,
                "rocketmq_twice": sorted(v for v, n in collections.Counter(rmq).items() if n > 1)[:50],
                "mixed_twice": sorted(v for v, n in collections.Counter(mixed_got).items() if n > 1)[:50],
            },
            f,
        )
    assert len(a_times) > 50 and max(gaps) < 1.0, (len(a_times), max(gaps, default=None))
    assert len(want) > 1000, len(want)
    assert rmq_sent > 50, "the RocketMQ producer was acknowledged"
    assert not errors, errors
    # The Kafka group: every acknowledged message from its partition, none
    # twice. A commit answered before the kill survives set-b's failover
    # (offsets reach the in-sync replica before the answer), and so does
    # the group (members, generation, assignment: the replica holds them
    # and takes over as coordinator without a rebalance), so no member
    # starts a partition again from an older commit.
    missing = sorted(set(want) - set(kafka["got"]))
    # What the group did, in the failure message (CI keeps only that).
    by_partition = collections.Counter(kafka["got"].values())
    assert not missing, (
        len(missing),
        missing[:10],
        f"got {len(kafka['got'])} by partition {dict(by_partition)}",
        dict(commit_errors),
        f"victim {victim} of set-b failed over in {failed_over:.1f} s; leaders {lead}",
    )
    assert not kafka["lost"], (len(kafka["lost"]), kafka["lost"][:10])
    assert not kafka["dups"], (len(kafka["dups"]), kafka["dups"][:10], dict(commit_errors))
    assert all(kafka["got"][v] == p for v, (p, _) in want.items() if p is not None)
    # In per-partition order: a Kafka producer's message never comes before
    # one written after it on its partition, except when a rewind reads it
    # again.
    for p, values in kafka["order"].items():
        before, last = set(), -1
        for v in (v for v in values if v.startswith("live-")):
            i = int(v.rsplit("-", 1)[1])
            assert i > last or v in before, (p, v, last)
            before.add(v)
            last = i
    # The RocketMQ group and the mixed group: every acknowledged message,
    # at least once. Their RocketMQ members persist offsets asynchronously
    # (rocketmq-client-rust, as Apache RocketMQ's clients): what one had
    # consumed from the killed master but not yet persisted comes again.
    for name, bodies in (("rocketmq", rmq), ("mixed", mixed_got)):
        assert not set(want) - set(bodies), (name, sorted(set(want) - set(bodies))[:10])
        assert set(bodies) <= set(want) | {b for b in bodies if b.startswith("rmq-")}, name
    # Their duplicates are reported, not bounded yet: in some runs a member
    # read a failed-over queue again from seconds back (issue 13's note).


def test_name_servers_answer_while_etcd_is_paused(cluster):
    """etcd paused (SIGSTOP): a name server asked for a topic it does not
    know looks in etcd for at most `rocketmq.namesrv_route_lookup_timeout_ms`
    (2 s) and then answers from its registrations (TOPIC_NOT_EXIST) rather
    than holding the client; a topic it knows is routed at once. Once etcd
    is back, both sets have masters and a new topic is routed everywhere."""
    import signal

    masters(cluster, timeout=60)
    create_topic(cluster, "before-pause", 4, via=1)
    node = cluster.nodes[2]
    # Until the node's own table has taken the topic from etcd, its name
    # server reads etcd for it (counted as found): wait for a route served
    # from the table.
    found = 'rokka_rocketmq_namesrv_route_lookups_total{result="found"}'
    deadline = time.time() + 20
    while True:
        n = node.metric_values().get(found, 0)
        assert sum(queue_counts(node, "before-pause").values()) == 4
        if node.metric_values().get(found, 0) == n:
            break
        assert time.time() < deadline, "the topic never reached node 2's table"
        time.sleep(0.2)
    # Counted as a timeout, or as an error when the etcd client gives up
    # first.
    failed = ('rokka_rocketmq_namesrv_route_lookups_total{result="timeout"}',
              'rokka_rocketmq_namesrv_route_lookups_total{result="error"}')
    before = sum(node.metric_values().get(k, 0) for k in failed)
    cluster.etcd.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.time()
        code, _, _ = remoting(node.namesrv_port, 105, {"topic": "never-created-while-paused"})
        took = time.time() - t0
        t1 = time.time()
        known = queue_counts(node, "before-pause")
        took_known = time.time() - t1
    finally:
        cluster.etcd.proc.send_signal(signal.SIGCONT)
    assert code == 17, code
    assert 1.5 <= took < 4, took
    assert sum(known.values()) == 4 and took_known < 1, (known, took_known)
    lookups = {k: v for k, v in node.metric_values().items() if "namesrv_route_lookups" in k}
    assert sum(lookups.get(k, 0) for k in failed) == before + 1, lookups
    # Leases that ran out during the pause expire once etcd runs again, and
    # the masters they held are elected anew: past the TTL (2 s) before
    # asking who the masters are.
    time.sleep(3)
    masters(cluster, timeout=60)
    create_topic(cluster, "after-pause", 4, via=3)
    # Every name server routes all four queues once its node's view has
    # both sets' masters again (elected anew after the pause: a route
    # names a set's queues once its master is known, as RocketMQ's name
    # server does once the broker registers).
    for i, n in cluster.nodes.items():
        deadline = time.time() + 20
        while sum(queue_counts(n, "after-pause").values()) != 4 and time.time() < deadline:
            time.sleep(0.2)
        assert sum(queue_counts(n, "after-pause").values()) == 4, (i, queue_counts(n, "after-pause"))


def test_a_deleted_topic_goes_from_every_set_and_comes_back_empty(cluster):
    """DeleteTopics at one node: every node — the other set's master, both
    replicas — drops the topic's stored queues and its committed offsets
    (a tombstone of the topic's incarnation in etcd), so the topic made
    again under the name starts empty on every set, as a Kafka topic made
    again does. Before, the other set kept its queues and the new topic
    showed the old records (and deleting a cluster's last topic brought it
    back)."""
    import os

    masters(cluster)
    topic, group = "deleted-and-back", "deleted-and-back-g"
    a = create_topic(cluster, topic, 4, via=1)
    leaders(a, topic, 4)
    p = Producer({"bootstrap.servers": cluster.nodes[1].bootstrap, "acks": "all"})
    for i in range(40):
        p.produce(topic, f"old-{i}".encode(), partition=i % 4)
    assert p.flush(20) == 0
    c = Consumer({"bootstrap.servers": cluster.nodes[1].bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, q, 10) for q in range(4)], asynchronous=False)
    c.close()
    queue_dirs = [os.path.join(n.workdir, "data", "consumequeue", topic) for n in cluster.nodes.values()]
    assert all(os.path.isdir(d) for d in queue_dirs), "every node holds queues of the topic (masters and replicas)"
    for f in a.delete_topics([topic]).values():
        f.result(15)
    deadline = time.time() + 20
    while any(os.path.exists(d) for d in queue_dirs) and time.time() < deadline:
        time.sleep(0.2)
    assert not [d for d in queue_dirs if os.path.exists(d)], "queues left after the deletion"
    # Made again at the other set's master: empty everywhere, no offsets.
    a = create_topic(cluster, topic, 4, via=3)
    leaders(a, topic, 4)
    p = Producer({"bootstrap.servers": cluster.nodes[3].bootstrap, "acks": "all"})
    for q in range(4):
        p.produce(topic, f"new-{q}".encode(), partition=q)
    assert p.flush(20) == 0
    assert sorted(read_topic(cluster.nodes[1].bootstrap, topic, 4)) == [f"new-{q}" for q in range(4)]
    c = Consumer({"bootstrap.servers": cluster.nodes[1].bootstrap, "group.id": group, "enable.auto.commit": False})
    got = c.committed([TopicPartition(topic, q) for q in range(4)], timeout=15)
    c.close()
    assert [t.offset for t in got] == [-1001] * 4, got
