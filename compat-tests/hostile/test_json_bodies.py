"""RocketMQ JSON bodies made of many tiny objects: a HEART_BEAT (no
permission needed), a LOCK_BATCH_MQ and a name server REGISTER_BROKER,
each ~8 MiB of `{}`-sized entries, four of each at once. Read into a
generic JSON value they cost ~100 times their size (a 16 MiB heartbeat took
1.5 GiB); read typed, with their lists bounded while read, rokka's memory
grows by a few times what was sent at most, each gets an error answer, and a
real client works after."""
import json
import os
import socket
import struct
import sys
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import harness, running  # noqa: E402
from test_hostile import recv_exact, rss_kib, rmq_frame  # noqa: E402

BODY = 8 << 20
COPIES = 4
HEART_BEAT, LOCK_BATCH_MQ, REGISTER_BROKER = 34, 41, 103


@pytest.fixture(scope="module")
def rokka():
    with running("hostile", "json_bodies") as r:
        yield r


def tiny_list(n_bytes, item=b"{}"):
    n = n_bytes // (len(item) + 1)
    return b"[" + b",".join([item] * n) + b"]"


def bodies():
    many = tiny_list(BODY)
    subs = b'[{"groupName":"g","subscriptionDataSet":' + many + b"}]"
    return [
        (HEART_BEAT, {}, b'{"clientID":"x@1","consumerDataSet":' + many + b"}", "broker"),
        (HEART_BEAT, {}, b'{"clientID":"x@2","consumerDataSet":' + subs + b"}", "broker"),
        (LOCK_BATCH_MQ, {}, b'{"consumerGroup":"g","clientId":"x@3","mqSet":' + many + b"}", "broker"),
        (
            REGISTER_BROKER,
            {"brokerName": "evil", "brokerAddr": "127.0.0.1:1", "clusterName": "c", "brokerId": "0"},
            b'{"topicConfigSerializeWrapper":{"topicConfigTable":{'
            + b",".join(b'"t%d":{}' % i for i in range(BODY // 10))
            + b"}}}",
            "namesrv",
        ),
    ]


def send_and_read(port, frame):
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(frame)
        n = struct.unpack(">i", recv_exact(s, 4))[0]
        answer = recv_exact(s, n)
    hlen = struct.unpack(">i", answer[:4])[0] & 0xFFFFFF
    return json.loads(answer[4 : 4 + hlen])


def test_bodies_of_tiny_objects_cost_about_their_size(rokka):
    before = rss_kib(rokka.proc.pid)
    peak = [before]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib(rokka.proc.pid))
            stop.wait(0.02)

    w = threading.Thread(target=watch)
    w.start()
    answers = []
    try:
        for code, ext, body, where in bodies():
            port = rokka.broker_port if where == "broker" else rokka.namesrv_port
            frame = rmq_frame(code, 1, ext, body)
            threads = [
                threading.Thread(target=lambda: answers.append((code, send_and_read(port, frame)["code"])))
                for _ in range(COPIES)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
    finally:
        stop.set()
        w.join()
    grew_mib = (peak[0] - before) / 1024
    sent_mib = COPIES * BODY / (1 << 20)
    # Each frame is held while it is read and parsed (32 MiB of them at
    # once per kind); typed, what the parse builds is bounded besides.
    assert grew_mib < 4 * sent_mib + 64, f"rokka grew {grew_mib:.0f} MiB for {sent_mib:.0f} MiB sent at once"
    assert len(answers) == 4 * COPIES
    assert all(c != 0 for _, c in answers), answers  # every one refused with an error code
    # A real client works after.
    assert "sent 5" in harness(rokka, "cross-produce", "after-json", "5")
