"""Clients that invent names: every map keyed by a name a client chooses
(Kafka groups and members, committed offsets, RocketMQ clients and consumer
groups) has a cap. A flood of made-up names stays within the caps, is
counted as refused, and once it stops a real librdkafka consumer group
forms and commits, and a real RocketMQ client sends and consumes."""
import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import Rokka, results_dir, running  # noqa: E402
from test_hostile import HARNESS, kafka_frame, recv_exact, rmq_frame  # noqa: E402

MAX_GROUPS = 200
MAX_OFFSETS = 300
MAX_RMQ_CLIENTS = 50
MAX_RMQ_GROUPS = 60


@pytest.fixture(scope="module")
def rokka():
    with running(
        "hostile",
        "names",
        store_extra=f"max_committed_offsets = {MAX_OFFSETS}",
        group_extra=f"max_groups = {MAX_GROUPS}\nmax_group_size = 5\ninitial_rebalance_delay_ms = 0",
        rocketmq_extra=f"max_clients = {MAX_RMQ_CLIENTS}\nmax_consumer_groups = {MAX_RMQ_GROUPS}\n"
        "max_groups_per_client = 5",
    ) as r:
        yield r


def kstr(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def call(sock, frame):
    sock.sendall(frame)
    n = struct.unpack(">i", recv_exact(sock, 4))[0]
    return recv_exact(sock, n)


def join_v0(group, member=""):
    body = kstr(group) + struct.pack(">i", 6000) + kstr(member) + kstr("consumer")
    body += struct.pack(">i", 1) + kstr("range") + struct.pack(">i", 0)
    return kafka_frame(11, 0, body)


def commit_v2(group, topic, partition, offset):
    body = kstr(group) + struct.pack(">i", -1) + kstr("") + struct.pack(">q", -1)
    body += struct.pack(">i", 1) + kstr(topic) + struct.pack(">i", 1)
    body += struct.pack(">iq", partition, offset) + kstr("")
    return kafka_frame(8, 2, body)


def commit_error(resp, topic):
    # corr(4) topics(4) name(2+n) partitions(4) index(4) error(2)
    at = 4 + 4 + 2 + len(topic) + 4 + 4
    return struct.unpack(">h", resp[at : at + 2])[0]


def metric(rokka, name):
    return sum(v for k, v in rokka.metric_values().items() if k == name or k.startswith(name + "{"))


def rmq_call(sock, code, opaque, body):
    sock.sendall(rmq_frame(code, opaque, body=body))
    n = struct.unpack(">i", recv_exact(sock, 4))[0]
    frame = recv_exact(sock, n)
    hlen = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
    return json.loads(frame[4 : 4 + hlen])


def test_invented_names_stay_within_their_caps(rokka):
    kafka = ("127.0.0.1", rokka.kafka_port)
    topic = "names-real"
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all"})
    for i in range(100):
        p.produce(topic, value=f"v{i}".encode(), partition=0)
    assert p.flush(30) == 0

    # 1. Kafka groups: 3x the cap of made-up group names.
    codes = {}
    with socket.create_connection(kafka, timeout=10) as s:
        for i in range(3 * MAX_GROUPS):
            resp = call(s, join_v0(f"flood-{i}"))
            err = struct.unpack(">h", resp[4:6])[0]
            codes[err] = codes.get(err, 0) + 1
    assert codes.get(15, 0) >= MAX_GROUPS, f"JoinGroup answers by error: {codes}"
    # 2. Members of one group: beyond max_group_size, GROUP_MAX_SIZE_REACHED.
    # (A v0 join parks until the rebalance completes, so each gets its own connection.)
    # Covered in the coordinator's unit tests; here only the group cap.

    # 3. Committed offsets: 2x the cap of (group, partition) entries.
    refused = 0
    with socket.create_connection(kafka, timeout=10) as s:
        for i in range(2 * MAX_OFFSETS):
            err = commit_error(call(s, commit_v2(f"commit-{i}", topic, 0, 1)), topic)
            assert err in (0, 28), f"commit {i}: error {err}"
            refused += err == 28
    assert refused >= MAX_OFFSETS - 1, f"only {refused} commits refused past the cap"
    assert metric(rokka, "rokka_offset_commits_refused_total") == refused
    assert metric(rokka, "rokka_committed_offsets") <= MAX_OFFSETS

    # 4. RocketMQ: heartbeats inventing clients and groups.
    rmq_refused = 0
    with socket.create_connection(("127.0.0.1", rokka.broker_port), timeout=10) as s:
        for i in range(2 * MAX_RMQ_CLIENTS):
            groups = [
                {"groupName": f"rg-{i}-{j}", "messageModel": "CLUSTERING", "subscriptionDataSet": []} for j in range(3)
            ]
            body = json.dumps({"clientID": f"rc-{i}", "producerDataSet": [], "consumerDataSet": groups}).encode()
            r = rmq_call(s, 34, i + 1, body)
            rmq_refused += r["code"] != 0
        assert rmq_refused > MAX_RMQ_CLIENTS, f"{rmq_refused} heartbeats refused"
    # The flood's connection is closed: its clients and their groups go.

    # The flood is over. Groups without offsets are forgotten within ~10 s
    # once their members' sessions (6 s) lapse, so a real group forms: its
    # consumer retries COORDINATOR_NOT_AVAILABLE meanwhile, as Kafka clients do.
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": "names-real-group",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    got = []
    deadline = time.time() + 90
    while len(got) < 100 and time.time() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        got.append(m.value())
    assert len(got) == 100, f"the real group read {len(got)} of 100"
    # Its commit lands only if a slot is free: the flood's offsets hold the
    # table (they are kept for offsets_retention_ms, as Kafka keeps them).
    c.close()
    m = rokka.metric_values()
    groups_now = sum(v for k, v in m.items() if k == "rokka_groups")
    assert groups_now <= MAX_GROUPS, f"{groups_now} groups held (cap {MAX_GROUPS})"
    refusals = {k: v for k, v in m.items() if k.startswith("rokka_group_joins_refused_total")}
    assert sum(refusals.values()) >= MAX_GROUPS, refusals

    # A real RocketMQ client still works (its client and group fit again).
    r = subprocess.run(
        [HARNESS, f"127.0.0.1:{rokka.namesrv_port}", "send-consume"], capture_output=True, text=True, timeout=170
    )
    assert r.returncode == 0, f"RocketMQ client failed after the flood: {r.stdout[-1500:]} {r.stderr[-1500:]}"
    with open(rokka.log_path, "rb") as f:
        assert b"panicked" not in f.read()


def test_a_heartbeat_cannot_make_the_broker_keep_more_than_a_client_sends(rokka):
    """One heartbeat's names are bounded as RocketMQ's clients bound them
    (ids, groups, topics of at most 255 bytes; at most 1000 groups): a
    megabyte client id is refused whole, and a client naming new groups
    heartbeat after heartbeat stays within rocketmq.max_groups_per_client."""
    before = metric(rokka, "rokka_rocketmq_heartbeats_refused_total")
    with socket.create_connection(("127.0.0.1", rokka.broker_port), timeout=10) as s:
        for body in (
            {"clientID": "x" * (1 << 20), "producerDataSet": [], "consumerDataSet": []},
            {"clientID": "c-long-group", "producerDataSet": [],
             "consumerDataSet": [{"groupName": "g" * 300, "subscriptionDataSet": []}]},
            {"clientID": "c-many", "producerDataSet": [],
             "consumerDataSet": [{"groupName": f"m{j}", "subscriptionDataSet": []} for j in range(1001)]},
            {"clientID": "c-long-topic", "producerDataSet": [], "consumerDataSet": [
                {"groupName": "ok", "subscriptionDataSet": [{"topic": "t" * 600, "subString": "*"}]}]},
        ):
            r = rmq_call(s, 34, 7, json.dumps(body).encode())
            assert r["code"] == 1, (r, str(body)[:80])
        # Groups one heartbeat at a time: past the per-client cap (5 here),
        # each new one is refused and the client stays in five.
        answers = []
        for j in range(8):
            body = {"clientID": "c-roamer", "producerDataSet": [],
                    "consumerDataSet": [{"groupName": f"roam-{j}", "messageModel": "CLUSTERING",
                                         "subscriptionDataSet": []}]}
            s.sendall(rmq_frame(34, 100 + j, body=json.dumps(body).encode()))
            while True:  # past the broker's own requests (NOTIFY_CONSUMER_IDS_CHANGED)
                n = struct.unpack(">i", recv_exact(s, 4))[0]
                frame = recv_exact(s, n)
                hlen = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
                h = json.loads(frame[4 : 4 + hlen])
                if h.get("flag", 0) & 1 and h.get("opaque") == 100 + j:
                    answers.append(h["code"])
                    break
        assert answers[:5] == [0] * 5 and all(a != 0 for a in answers[5:]), answers
    assert metric(rokka, "rokka_rocketmq_heartbeats_refused_total") >= before + 7


def test_a_group_id_longer_than_max_id_bytes_is_not_kept(rokka):
    """kafka.max_id_bytes (4096): a JoinGroup or OffsetCommit naming a
    longer group id is INVALID_GROUP_ID (24) — a 100 MB commit once copied
    its group id into every partition's key — and nothing is kept; 4096
    bytes is still a group."""
    kafka = ("127.0.0.1", rokka.kafka_port)
    long_id = "L" * 4097
    before = metric(rokka, "rokka_kafka_ids_refused_total")
    offsets_before = metric(rokka, "rokka_committed_offsets")
    with socket.create_connection(kafka, timeout=10) as s:
        resp = call(s, join_v0(long_id))
        assert struct.unpack(">h", resp[4:6])[0] == 24
        assert commit_error(call(s, commit_v2(long_id, "names-real", 0, 1)), "names-real") == 24
        ok = commit_error(call(s, commit_v2("K" * 4096, "names-real", 0, 1)), "names-real")
        assert ok in (0, 28), ok
    assert metric(rokka, "rokka_kafka_ids_refused_total") == before + 2
    assert metric(rokka, "rokka_committed_offsets") <= offsets_before + 1
    # A member's id is kept with it too: a JoinGroup naming a longer one is
    # INVALID_REQUEST (42).
    with socket.create_connection(kafka, timeout=10) as s:
        resp = call(s, join_v0("names-member-group", member="M" * 4097))
        assert struct.unpack(">h", resp[4:6])[0] == 42
    assert metric(rokka, "rokka_kafka_ids_refused_total") == before + 3


def test_a_member_id_from_a_long_client_id_is_cut_and_rejoins(rokka):
    """The broker makes a member's id from its client id (Kafka's
    `clientId-uuid`); a client id of thousands of bytes is cut to 255 there,
    so the member's next JoinGroup naming that id is not refused as too
    long — librdkafka with such a client.id forms its group."""
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": "names-long-client",
            "client.id": "c" * 5000,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        assigned = []
        c.subscribe(["names-real"], on_assign=lambda _c, parts: assigned.extend(parts))
        end = time.time() + 30
        while not assigned and time.time() < end:
            c.poll(0.5)
        assert assigned, "the consumer with a 5000-byte client id got no assignment"
    finally:
        c.close()
