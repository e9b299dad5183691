"""The admin CLI (`rokka topic|group|cluster …`, docs/operations.md) against
a node populated by real clients: what it prints (--output json) is checked
against what confluent-kafka and the RocketMQ client see, and a reset is
checked by where the next consumer of each protocol starts."""
import json
import subprocess
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from kafka import KafkaConsumer

from conftest import harness, rocketmq_consume
from rokka_fixture import free_port, rokka_bin
from test_cross import RocketMQMember, create, kafka_produce, wait_for


def cli(rokka, *args, expect=0):
    """Runs `rokka <args> --output json`; (parsed stdout, stderr)."""
    p = subprocess.run(
        [rokka_bin(), *args, "--brokers", rokka.bootstrap, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == expect, f"rokka {' '.join(args)}: exit {p.returncode}, {p.stderr}{p.stdout}"
    out = json.loads(p.stdout) if p.stdout.strip() else {}
    return out, p.stderr


def test_topic_commands_agree_with_a_kafka_client(rokka):
    topic = "CliTopic"
    cli(rokka, "topic", "create", topic, "--partitions", "3", "--config", "retention.ms=7200000")
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    assert len(a.list_topics(topic, timeout=10).topics[topic].partitions) == 3
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for i in range(15):
        p.produce(topic, f"v{i}".encode(), partition=i % 3)
    assert p.flush(20) == 0
    parts = cli(rokka, "topic", "describe", topic)[0]["partitions"]
    assert [(x["partition"], x["earliest"], x["latest"], x["messages"], x["leader"]) for x in parts] == [
        (i, 0, 5, 5, 0) for i in range(3)
    ]
    # Configs: what was created with, then changed, then removed.
    res = ConfigResource(ResourceType.TOPIC, topic)

    def retention():
        return a.describe_configs([res])[res].result(10)["retention.ms"].value

    assert retention() == "7200000"
    configs = cli(rokka, "topic", "config", topic, "--set", "retention.ms=1000000")[0]["configs"]
    row = next(c for c in configs if c["name"] == "retention.ms")
    assert (row["value"], row["source"]) == ("1000000", "DYNAMIC_TOPIC_CONFIG")
    assert retention() == "1000000"
    configs = cli(rokka, "topic", "config", topic, "--delete", "retention.ms")[0]["configs"]
    row = next(c for c in configs if c["name"] == "retention.ms")
    assert row["source"] == "DEFAULT_CONFIG" and retention() == str(72 * 3600 * 1000)

    cli(rokka, "topic", "add-partitions", topic, "--total", "5")
    assert len(a.list_topics(topic, timeout=10).topics[topic].partitions) == 5
    listed = {t["topic"]: t for t in cli(rokka, "topic", "list")[0]["topics"]}
    assert listed[topic]["partitions"] == 5 and listed[topic]["replication_factor"] == 1

    status = cli(rokka, "cluster", "status")[0]
    assert status["cluster"][0]["cluster_id"] == "rokka-cluster"
    assert [(b["id"], b["port"]) for b in status["brokers"]] == [(0, rokka.kafka_port)]
    assert status["brokers"][0]["leaders"] >= 5

    # Refusals exit 1 with Kafka's error name; an unreachable node exits 2.
    _, err = cli(rokka, "topic", "create", topic, expect=1)
    assert "TOPIC_ALREADY_EXISTS" in err
    cli(rokka, "topic", "delete", topic)
    assert topic not in a.list_topics(timeout=10).topics
    _, err = cli(rokka, "topic", "describe", topic, expect=1)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in err
    p = subprocess.run(
        [rokka_bin(), "topic", "list", "--brokers", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 2 and "cannot reach" in p.stderr


def committed(rokka, group, topic, n):
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in c.committed([TopicPartition(topic, i) for i in range(n)], timeout=10)]
    finally:
        c.close()


def test_group_commands_over_both_protocols(rokka):
    topic, group = "CliGroup", "cli-group"
    create(rokka, topic)
    kafka_produce(rokka, topic, [dict(value=f"a-{i}".encode(), partition=i % 4) for i in range(40)], compression=None)
    # A RocketMQ group consumes and commits the 40; 8 more arrive.
    assert len(rocketmq_consume(rokka, topic, group, 40)) == 40
    time.sleep(0.01)
    mid = int(time.time() * 1000)
    time.sleep(0.01)
    kafka_produce(rokka, topic, [dict(value=f"b-{i}".encode(), partition=i % 4) for i in range(8)], compression=None)

    d = cli(rokka, "group", "describe", group)[0]
    rows = {x["partition"]: x for x in d["offsets"] if x["topic"] == topic}
    # The lag is the clients' own numbers: committed (as confluent-kafka reads
    # it) against the partition's end (its watermark).
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "cli-watermarks"})
    ends = [c.get_watermark_offsets(TopicPartition(topic, i), timeout=10)[1] for i in range(4)]
    c.close()
    assert committed(rokka, group, topic, 4) == [rows[i]["committed"] for i in range(4)] == [10] * 4
    assert ends == [rows[i]["end"] for i in range(4)] == [12] * 4
    assert [rows[i]["lag"] for i in range(4)] == [2] * 4 and d["group"][0]["lag"] == 8
    assert d["members"] == [] and d["group"][0]["state"] == "Empty"
    assert group in {g["group"] for g in cli(rokka, "group", "list")[0]["groups"]}

    # A live mixed group: one RocketMQ and one Kafka member, side by side.
    stop = threading.Event()

    def kafka_member():
        k = KafkaConsumer(topic, bootstrap_servers=rokka.bootstrap, group_id=group, client_id="cli-kafka-member")
        while not stop.is_set():
            k.poll(timeout_ms=200)
        k.close()

    rmq = RocketMQMember(rokka, "cli-member", topic, group, 12)
    t = threading.Thread(target=kafka_member)
    t.start()
    try:
        seen = [None]

        def both():
            seen[0] = cli(rokka, "group", "describe", group)[0]
            members = seen[0]["members"]
            owned = sorted(p for m in members for p in m["partitions"])
            return (
                len(members) == 2
                and sum("@" in m["member_id"] for m in members) == 1
                and "cli-kafka-member" in [m["client_id"] for m in members]
                and owned == [f"{topic}:{i}" for i in range(4)]
            )

        wait_for(both, lambda: f"a RocketMQ and a Kafka member sharing the queues; last {seen[0]}", timeout=40)
        owners = {x["owner"] for x in seen[0]["offsets"]}
        assert len(owners) == 2, seen[0]
        # No reset under live members.
        _, err = cli(rokka, "group", "reset-offsets", group, "--to-earliest", "--execute", expect=1)
        assert "member" in err and "cli-kafka-member" in err
    finally:
        stop.set()
        t.join(30)
        rmq.finish(60)
    wait_for(lambda: cli(rokka, "group", "describe", group)[0]["members"] == [], "the group to empty", timeout=30)

    # A dry run commits nothing.
    before = committed(rokka, group, topic, 4)
    plan = cli(rokka, "group", "reset-offsets", group, "--to-offset", "3")[0]
    assert [x["new"] for x in plan["plan"]] == [3] * 4 and "dry run" in plan["message"]
    assert committed(rokka, group, topic, 4) == before

    # By time: the next RocketMQ consumer starts at the first message after it.
    cli(rokka, "group", "reset-offsets", group, "--to-timestamp", str(mid), "--execute")
    assert committed(rokka, group, topic, 4) == [10] * 4
    got = rocketmq_consume(rokka, topic, group, 8)
    assert sorted(g.body for g in got) == sorted(f"b-{i}".encode() for i in range(8))

    # Two partitions to the start: the next Kafka consumer reads just those.
    cli(rokka, "group", "reset-offsets", group, "--topic", topic, "--partitions", "0,1", "--to-earliest", "--execute")
    assert committed(rokka, group, topic, 4) == [0, 0, 12, 12]
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.subscribe([topic])
    values = []
    deadline = time.time() + 30
    while len(values) < 24 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            values.append((m.partition(), m.value()))
    time.sleep(0.5)
    extra = c.poll(0.5)
    c.close()
    assert extra is None or extra.error(), f"more than the 24 of partitions 0 and 1: {extra.value()}"
    assert sorted(values) == sorted(
        [(i % 4, f"a-{i}".encode()) for i in range(40) if i % 4 < 2]
        + [(i % 4, f"b-{i}".encode()) for i in range(8) if i % 4 < 2]
    ), values

    # By shift, clamped to the partition's range.
    plan = cli(rokka, "group", "reset-offsets", group, "--shift-by", "-100", "--execute")[0]["plan"]
    assert {x["new"] for x in plan} == {0}

    cli(rokka, "group", "delete", group)
    assert group not in {g["group"] for g in cli(rokka, "group", "list")[0]["groups"]}


def test_a_forced_reset_moves_live_members_of_both_protocols(rokka):
    """`reset-offsets --force` on a live mixed group: the Kafka member
    (confluent-kafka) is removed and rejoins at the new offsets, the RocketMQ
    member (rocketmq-client-rust) is told through its broker
    (RESET_CONSUMER_CLIENT_OFFSET) and drops what it fetched; commits of the
    old positions do not undo the reset. Every message is delivered again
    and the group ends committed at the end once more."""
    from collections import Counter

    topic, group = "CliForce", "cli-force"
    create(rokka, topic)
    bodies = [f"f-{i}".encode() for i in range(40)]
    kafka_produce(rokka, topic, [dict(value=b, partition=i % 4) for i, b in enumerate(bodies)], compression=None)

    stop, kafka_got, errors = threading.Event(), [], []

    def kafka_member():
        try:
            c = Consumer(
                {
                    "bootstrap.servers": rokka.bootstrap,
                    "group.id": group,
                    "client.id": "force-kafka-member",
                    "auto.offset.reset": "earliest",
                    "auto.commit.interval.ms": 1000,
                }
            )
            c.subscribe([topic])
            while not stop.is_set():
                m = c.poll(0.2)
                if m is not None and not m.error():
                    kafka_got.append(m.value())
            c.close()
        except Exception as e:  # reported by the test thread
            errors.append(e)

    rmq = RocketMQMember(rokka, "force-member", topic, group, 75)
    t = threading.Thread(target=kafka_member)
    t.start()
    try:
        seen = [None]

        def settled():
            seen[0] = cli(rokka, "group", "describe", group)[0]
            members = seen[0]["members"]
            owned = sorted(p for m in members for p in m["partitions"])
            return (
                len(members) == 2
                and owned == [f"{topic}:{i}" for i in range(4)]
                and committed(rokka, group, topic, 4) == [10] * 4
            )

        wait_for(settled, lambda: f"both members sharing the queues, all 40 committed; last {seen[0]}", timeout=40)
        _, err = cli(rokka, "group", "reset-offsets", group, "--to-earliest", "--execute", expect=1)
        assert "--force" in err, err
        out, _ = cli(
            rokka,
            "group",
            "reset-offsets",
            group,
            "--to-earliest",
            "--execute",
            "--force",
            "--namesrv",
            f"127.0.0.1:{rokka.namesrv_port}",
        )
        assert [x["new"] for x in out["plan"]] == [0] * 4, out
        actions = {m["protocol"]: m["action"] for m in out["members"]}
        assert set(actions) == {"kafka", "rocketmq"}, out
        assert "1 Kafka member(s) removed" in out["message"] and "1 RocketMQ consumer" in out["message"], out
        # Both start over: the offsets come back to the end only by consuming
        # everything again (a stale commit would bring them back at once and
        # the count below would find the messages delivered once).
        reset_at = time.time()
        wait_for(
            lambda: committed(rokka, group, topic, 4) == [10] * 4,
            lambda: f"the group to consume the topic again; committed {committed(rokka, group, topic, 4)}",
            timeout=30,
        )
        print(f"consumed again {time.time() - reset_at:.1f} s after the reset")
    finally:
        stop.set()
        t.join(30)
        rmq_got = rmq.finish(120)
    assert not errors, errors
    counts = Counter(kafka_got) + Counter(rmq_got)
    assert set(counts) == set(bodies), set(counts) ^ set(bodies)
    once = sorted(b for b in bodies if counts[b] < 2)
    assert not once, f"delivered only once, not again after the reset: {once}; kafka {len(kafka_got)}, rocketmq {len(rmq_got)}"


def test_the_rocketmq_admin_client_resets_a_live_group_by_time(rokka):
    """mqadmin resetOffsetByTime through rocketmq-client-rust's admin
    (INVOKE_BROKER_TO_RESET_OFFSET to the topic's master): the broker moves
    the group to the first message stored at or after the time, answers the
    table the admin prints, and tells the live member, which consumes from
    there again."""
    from collections import Counter

    topic, group = "CliAdminReset", "cli-admin-reset"
    create(rokka, topic)
    kafka_produce(rokka, topic, [dict(value=f"old-{i}".encode(), partition=i % 4) for i in range(8)], compression=None)
    time.sleep(0.05)
    mid = int(time.time() * 1000)
    time.sleep(0.05)
    again = [f"new-{i}".encode() for i in range(8)]
    kafka_produce(rokka, topic, [dict(value=b, partition=i % 4) for i, b in enumerate(again)], compression=None)
    rmq = RocketMQMember(rokka, "admin-reset-member", topic, group, 45)
    try:
        wait_for(
            lambda: committed(rokka, group, topic, 4) == [4] * 4,
            lambda: f"the member to consume all 16; committed {committed(rokka, group, topic, 4)}",
            timeout=35,
        )
        lines = harness(rokka, "reset-offset", topic, group, mid, "true")
        assert sorted(l for l in lines if l.startswith("reset ")) == [f"reset {q} 2" for q in range(4)], lines
        # The member's commits of its old position do not undo it...
        time.sleep(1)
        assert committed(rokka, group, topic, 4) == [2] * 4
        # ...and it consumes the newer half again.
        wait_for(
            lambda: committed(rokka, group, topic, 4) == [4] * 4,
            lambda: f"the member to consume from the reset; committed {committed(rokka, group, topic, 4)}",
            timeout=30,
        )
    finally:
        got = rmq.finish(90)
    counts = Counter(got)
    assert all(counts[b] >= 2 for b in again), counts
    assert all(counts[f"old-{i}".encode()] == 1 for i in range(8)), counts


def test_the_rocketmq_admin_client_updates_inspects_and_deletes_a_topic(rokka):
    """mqadmin's updateTopic (8 read queues, 4 write queues, read-only),
    topicRoute, topicStatus, brokerStatus and deleteTopic through
    rocketmq-client-rust's admin: the broker keeps the TopicConfig it is
    sent and routes it, answers the status of its 8 queues, and deletes
    the topic from itself and the name server."""
    topic = "CliAdminTopic"
    broker = f"127.0.0.1:{rokka.broker_port}"
    lines = harness(rokka, "admin-topic", broker, topic, 8, 4, 4)
    assert "update topic: ok" in lines, lines
    assert "route read 8 write 4 perm 4" in lines, lines
    assert "topic status queues 8" in lines, lines
    assert "broker status active true" in lines, lines
    assert "delete topic: ok" in lines, lines
    assert "route after delete: none" in lines, lines
    listed = [t["topic"] for t in cli(rokka, "topic", "list")[0]["topics"]]
    assert topic not in listed, listed


def test_the_rocketmq_admin_client_updates_lists_and_deletes_subscription_groups(rokka):
    """mqadmin's updateSubGroup, the dashboard's consumer list and
    deleteSubGroup through rocketmq-client-rust's admin: a group is
    accepted, the broker's own transaction-check group refused; the list
    holds the group a Kafka consumer committed for and none of the broker's
    own groups (whose progress the broker keeps as offsets); deleting the
    group with its offsets takes it off the list."""
    topic, group = "CliSubGroups", "cli-subgroups"
    cli(rokka, "topic", "create", topic, "--partitions", "2")
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    p.produce(topic, value=b"v", partition=0)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    m = c.poll(30)
    assert m is not None and m.error() is None, m
    c.commit(message=m, asynchronous=False)
    c.close()
    broker = f"127.0.0.1:{rokka.broker_port}"
    lines = harness(rokka, "admin-groups", broker, group)
    assert "update group: ok" in lines, lines
    assert any(l.startswith("update system group: refused") for l in lines), lines
    listed = [l for l in lines if l.startswith("groups: ")]
    assert len(listed) == 1 and f"{group} listed, 0 of the broker's own" in listed[0], lines
    assert "delete group: ok" in lines, lines
    after = [l for l in lines if l.startswith("groups after delete: ")]
    assert len(after) == 1 and f"{group} not listed, 0 of the broker's own" in after[0], lines
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        c.close()
    assert tp.offset < 0, f"the group's offset survived its deletion: {tp}"


def test_a_subscription_group_turned_off_is_not_consumed_until_turned_on(rokka):
    """mqadmin updateSubGroup with consumeEnable=false through
    rocketmq-client-rust's admin: examineSubscriptionGroupConfig (code 352)
    reads the config back, a push consumer of the group gets none of the
    topic's messages while it is off, and all of them once it is on again;
    getBrokerConfig and queryTopicsByConsumer answer as Apache's.
    (Before: the update was refused as not supported and 352 unanswered.)"""
    topic, group = "CliSubGroupOff", "cli-subgroup-off"
    cli(rokka, "topic", "create", topic, "--partitions", "2")
    broker = f"127.0.0.1:{rokka.broker_port}"
    lines = harness(rokka, "subgroup-honoured", broker, topic, group)
    assert "examined: consumeEnable=false retryMaxTimes=3" in lines, lines
    assert "consumed while off: 0" in lines, lines
    assert "consumed once on: 20" in lines, lines
    # mqadmin getBrokerConfig and queryTopicsByConsumer (codes 26, 343):
    # Apache's property names, and the topics the group committed on.
    info = harness(rokka, "broker-info", broker, group)
    assert "config brokerRole=ASYNC_MASTER" in info and "config flushDiskType=ASYNC_FLUSH" in info, info
    assert f"config listenPort={rokka.broker_port}" in info, info
    assert "config messageDelayLevel=1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h" in info, info
    (topics,) = [l.split(": ", 1)[1] for l in info if l.startswith(f"topics of {group}: ")]
    assert topic in topics.split(","), info
    # A Kafka DeleteGroups deletes the group whole, its RocketMQ config
    # with its offsets (one set of groups): the admin finds none after.
    harness(rokka, "subgroup-set", broker, group, "false", 7)
    assert harness(rokka, "subgroup-get", broker, group)[0] == "config: consumeEnable=false retryMaxTimes=7"
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    for f in a.delete_consumer_groups([group], request_timeout=30).values():
        f.result(timeout=30)
    got = harness(rokka, "subgroup-get", broker, group)[0]
    assert got.startswith("config: none"), got


def test_subscription_groups_set_in_one_list_are_kept(rokka):
    """mqadmin updateSubGroupList through rocketmq-client-rust's admin
    (code 225): every group of the list is kept with its settings, read
    back with examineSubscriptionGroupConfig."""
    broker = f"127.0.0.1:{rokka.broker_port}"
    groups = ["cli-subgroup-list-a", "cli-subgroup-list-b"]
    assert harness(rokka, "subgroup-set-list", broker, 5, *groups)[0] == "set list: ok"
    for g in groups:
        got = harness(rokka, "subgroup-get", broker, g)[0]
        assert got == "config: consumeEnable=false retryMaxTimes=5", (g, got)


def test_a_kip848_group_is_described_with_its_members_and_lag(rokka):
    """`group describe` of a KIP-848 group (librdkafka, group.protocol =
    consumer): DescribeGroups says it is not a classic group, so the CLI
    asks ConsumerGroupDescribe — members, their partitions and the lag
    (it refused the group before)."""
    topic, group = "CliKip848", "cli-kip848"
    cli(rokka, "topic", "create", topic, "--partitions", "4")
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for i in range(8):
        p.produce(topic, value=b"v", partition=i % 4)
    assert p.flush(30) == 0
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        c.subscribe([topic])
        got = 0
        end = time.time() + 45
        while got < 4 and time.time() < end:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got += 1
                if got == 4:
                    c.commit(asynchronous=False)
        assert got == 4
        out = {}
        end = time.time() + 20
        while time.time() < end:
            out, _ = cli(rokka, "group", "describe", group)
            members = out.get("members", [])
            if members and sum(len(m["partitions"]) for m in members) == 4:
                break
            time.sleep(0.5)
        members = out["members"]
        assert len(members) == 1 and len(members[0]["partitions"]) == 4, out
        assert members[0]["protocol"] == "kafka"
        assert {r["partition"] for r in out["offsets"]} == {0, 1, 2, 3}, out
        assert sum(r["lag"] for r in out["offsets"]) == 8 - 4, out
    finally:
        c.close()


def rmq_cli(rokka, *args, expect=0):
    """Runs a RocketMQ-side admin command (`message`, `dlq`) in JSON."""
    p = subprocess.run(
        [rokka_bin(), *args, "--namesrv", f"127.0.0.1:{rokka.namesrv_port}", "--output", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == expect, f"rokka {' '.join(args)}: exit {p.returncode}, {p.stderr}{p.stdout}"
    return json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


def test_message_get_by_offset_key_id_and_time(rokka):
    topic = "CliMessages"
    before = int(time.time() * 1000) - 1
    harness(rokka, "cross-produce", topic, 12)
    # What a Kafka client reads at each (partition, offset).
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "cli-messages-check", "enable.auto.commit": False})
    parts = len(AdminClient({"bootstrap.servers": rokka.bootstrap}).list_topics(topic, timeout=10).topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in range(parts)])
    kafka = {}
    deadline = time.time() + 30
    while len(kafka) < 12 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            kafka[(m.partition(), m.offset())] = (m.value(), m.key(), dict(m.headers()))
    c.close()
    assert len(kafka) == 12
    rows = []
    for q in range(parts):
        rows += rmq_cli(rokka, "message", "get", "--topic", topic, "--queue", str(q), "--offset", "0", "--count", "100")[0]["messages"]
    assert len(rows) == 12
    for r in rows:
        value, key, headers = kafka[(r["queue"], r["offset"])]
        assert r["body"].encode() == value and r["keys"].encode() == key, (r, value, key)
        assert r["properties"]["p1"].encode() == headers["p1"] and r["tags"].encode() == headers["rocketmq.tags"]
    # By key, by either id, by time.
    by_key = rmq_cli(rokka, "message", "get", "--topic", topic, "--key", "key-5")[0]["messages"]
    assert [m["body"] for m in by_key] == ["rmq-5-é"]
    one = by_key[0]
    for args in (["--id", one["msg_id"], "--topic", topic], ["--id", one["offset_msg_id"]]):
        got = rmq_cli(rokka, "message", "get", *args)[0]["messages"]
        assert [(m["queue"], m["offset"], m["body"]) for m in got] == [(one["queue"], one["offset"], "rmq-5-é")], args
    assert len(rmq_cli(rokka, "message", "get", "--topic", topic, "--from", str(before))[0]["messages"]) == 12
    future = str(int(time.time() * 1000) + 3_600_000)
    assert rmq_cli(rokka, "message", "get", "--topic", topic, "--from", future)[0]["messages"] == []
    assert rmq_cli(rokka, "message", "get", "--topic", topic, "--key", "no-such-key")[0]["messages"] == []
    _, err = rmq_cli(rokka, "message", "get", "--id", "00" * 16, expect=1)
    assert "no message" in err
    # An offset id names an address: one that is no broker the name server
    # lists is not contacted (the request would carry a signature).
    import socket

    with socket.socket() as lure:
        lure.bind(("127.0.0.1", 0))
        lure.listen(1)
        lure.settimeout(0.5)
        port = lure.getsockname()[1]
        _, err = rmq_cli(rokka, "message", "get", "--id", f"7F000001{port:08X}{0:016X}", expect=1)
        assert "no broker the name server lists" in err, err
        with pytest.raises(socket.timeout):
            lure.accept()


def test_dlq_list_show_and_resend(rokka):
    # The harness's consumer fails every message of CompatRetry until each
    # is dead-lettered to %DLQ%compat-cg-retry.
    harness(rokka, "retry-dlq")
    group = "compat-cg-retry"
    listed = rmq_cli(rokka, "dlq", "list", group)[0]
    assert sum(q["messages"] for q in listed["queues"]) == 5 and "5 dead letter(s)" in listed["message"]
    assert len(listed["messages"]) == 5
    assert {m["original_topic"] for m in listed["messages"]} == {"CompatRetry"}
    assert all(m["reconsume_times"] >= 1 for m in listed["messages"])
    first = listed["messages"][0]
    shown = rmq_cli(rokka, "dlq", "show", group, "--offset", str(first["offset"]))[0]["messages"]
    assert shown[0]["properties"]["RETRY_TOPIC"] == "CompatRetry" and shown[0]["msg_id"] == first["msg_id"]
    bodies = []
    for m in listed["messages"]:
        bodies.append(rmq_cli(rokka, "dlq", "show", group, "--offset", str(m["offset"]))[0]["messages"][0]["body"])
    # Every dead letter back to its topic, one result each.
    out = rmq_cli(rokka, "dlq", "resend", group, "--all")[0]
    assert [r["result"] for r in out["results"]] == ["resent"] * 5, out
    assert out["message"] == "5 dead letter(s): 5 resent, 0 failed"
    # The group's own consumer gets each once (it stands past the originals).
    got = rocketmq_consume(rokka, "CompatRetry", group, 5)
    assert sorted(d.body for d in got) == sorted(b.encode() for b in bodies)
    # A dead letter whose RETRY_TOPIC a client set (a send to %DLQ%<group>)
    # naming a topic the group does not consume is not resent with the
    # operator's rights.
    import socket
    import struct

    kafka_produce(rokka, "cli-victim", [{"value": b"v"}])
    ext = {"producerGroup": "pg", "topic": f"%DLQ%{group}", "defaultTopic": "TBW102", "defaultTopicQueueNums": "1",
           "queueId": "0", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
           "properties": "RETRY_TOPIC\x01cli-victim\x02UNIQ_KEY\x01C0FFEE03\x02"}
    header = json.dumps({"code": 10, "language": "JAVA", "version": 453, "opaque": 1, "flag": 0,
                         "extFields": ext}).encode()
    with socket.create_connection(("127.0.0.1", rokka.broker_port), timeout=10) as sock:
        sock.sendall(struct.pack(">ii", 4 + len(header) + 7, len(header)) + header + b"planted")
        n = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(n, socket.MSG_WAITALL)
        hlen = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
        sent = json.loads(frame[4:4 + hlen])
    assert sent["code"] == 0, sent
    planted = int(sent["extFields"]["queueOffset"])
    out, _ = rmq_cli(rokka, "dlq", "resend", group, "--offset", str(planted), expect=1)
    assert out["results"][0]["result"] == "failed" and "neither subscribes" in out["results"][0]["detail"], out
    # A resend that cannot be delivered says so, per message, and exits 1.
    cli(rokka, "topic", "delete", "CompatRetry")
    out, _ = rmq_cli(rokka, "dlq", "resend", group, "--offset", f"{first['offset']},99", expect=1)
    assert [r["result"] for r in out["results"]] == ["failed", "failed"], out
    assert "CompatRetry" in out["results"][0]["detail"] and "no message" in out["results"][1]["detail"]
    assert out["message"] == "2 dead letter(s): 0 resent, 2 failed"
    # Nothing dead-lettered: an empty answer, not an error.
    assert "no dead letters" in rmq_cli(rokka, "dlq", "list", "cli-nobody")[0]["message"]
    # The retries went through the delay levels; their delivery progress
    # is the broker's own, not a group to list.
    listed = {g["group"] for g in cli(rokka, "group", "list")[0]["groups"]}
    assert group in listed and "%SCHEDULE%" not in listed, listed
