"""ali-ons (npm), a RocketMQ remoting client written in JavaScript — its own
encoder and decoder of the remoting frames and of stored messages, its own
rebalance and retry — against rokka, crossing with Kafka clients: its sends
(tags, keys, user properties, a timed delivery) reach a Kafka consumer; a
Kafka producer's records reach its push consumer through a tag filter; a
message it answers ACTION_RETRY comes back once, through its group's retry
topic."""
import json
import os
import subprocess
import time
import uuid

from confluent_kafka import Consumer, Producer

from test_cross import create

JS = os.path.join(os.path.dirname(__file__), "js", "alions.js")


def alions(rokka, *args, timeout=120, check=True):
    p = subprocess.run(
        ["node", JS, args[0], f"127.0.0.1:{rokka.namesrv_port}", *[str(a) for a in args[1:]]],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    assert not check or p.returncode == 0, f"ali-ons {args} failed: {lines[-3:]} {p.stderr[-2000:]}"
    return lines


def test_alions_sends_reach_a_kafka_consumer(rokka):
    topic = f"AliSend{uuid.uuid4().hex[:8]}"
    create(rokka, topic, 4)
    t0 = time.time()
    sent = [l for l in alions(rokka, "produce", topic, 8, "as") if "sent" in l]
    assert [l["status"] for l in sent] == ["SEND_OK"] * 8, sent
    assert len({l["msgId"] for l in sent}) == 8
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": f"ali-k-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([topic])
    got = {}
    end = time.time() + 45
    try:
        while len(got) < 8 and time.time() < end:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            got[m.value().decode()] = (m.key(), dict(m.headers() or []), time.time() - t0)
    finally:
        c.close()
    assert sorted(got) == sorted(f"as-{i}" for i in range(8)), got
    for i in range(8):
        key, headers, _ = got[f"as-{i}"]
        assert key == f"k-as-{i}".encode(), key
        assert headers.get("rocketmq.tags") == (b"TagA" if i % 2 else b"TagB"), headers
        assert headers.get("n") == str(i).encode(), headers
    # The last one was timed 3 s after its send: delivered no sooner.
    assert got["as-7"][2] >= 2.5, got["as-7"]


def test_kafka_records_reach_an_alions_push_consumer_and_a_retry_comes_back(rokka):
    topic = f"AliRecv{uuid.uuid4().hex[:8]}"
    create(rokka, topic, 4)
    p = Producer({"bootstrap.servers": rokka.bootstrap})
    for i in range(12):
        tag = b"TagA" if i % 3 == 0 else b"TagB"
        p.produce(topic, value=f"kr-{i}".encode(), key=f"kk-{i}".encode(), partition=i % 4, headers=[("rocketmq.tags", tag)])
    assert p.flush(30) == 0
    group = f"CG_ALI_{uuid.uuid4().hex[:6]}"
    lines = alions(rokka, "consume", topic, group, "TagA", 4, "kr-3")
    got = {l["body"]: l for l in lines if "body" in l}
    # Only TagA (i % 3 == 0): 0, 3, 6, 9.
    assert sorted(got) == ["kr-0", "kr-3", "kr-6", "kr-9"], lines
    assert all(l["tags"] == "TagA" for l in got.values())
    assert got["kr-6"]["keys"] == "kk-6", got["kr-6"]
    done = [l for l in lines if "done" in l][-1]
    assert done["retried"] is True and done["twice"] == [], done
    # kr-3 came back from the group's retry topic, counted as reconsumed.
    assert got["kr-3"]["reconsumeTimes"] >= 1, got["kr-3"]
