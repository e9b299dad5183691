"""RocketMQ 5 Python client (rocketmq-python-client) against rokka's gRPC
listener: send (sync, then async with futures) and receive+ack of 1 KiB
messages, with rokka's CPU time per message for each stage (from
/proc/<pid>/stat). Bounded: every stage has a count and a deadline.
Usage: python bench.py <grpc port> <rokka pid> <messages>"""
import logging
import os
import sys
import time
import uuid

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

logging.getLogger("rocketmq").setLevel(logging.WARNING)
port, pid, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tick = os.sysconf("SC_CLK_TCK")


def cpu():
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / tick


def stage(label, count, fn):
    c0, t0 = cpu(), time.time()
    done = fn()
    dt, dc = time.time() - t0, cpu() - c0
    print(f"{label}: {done} msgs in {dt:.2f} s = {done / dt:,.0f} msg/s; rokka CPU {dc:.2f} s = {dc / max(done, 1) * 1e6:.0f} µs/msg")
    assert done == count, f"{label}: {done} of {count}"


cfg = ClientConfiguration(f"127.0.0.1:{port}", Credentials())
topic = f"bench5-{uuid.uuid4().hex[:6]}"
body = os.urandom(1024)
p = Producer(cfg, (topic,))
p.startup()


def msg():
    m = Message()
    m.topic = topic
    m.body = body
    m.tag = "bench"
    return m


def sync_send():
    for _ in range(n):
        p.send(msg())
    return n


def async_send():
    futs = []
    done = 0
    for _ in range(n):
        futs.append(p.send_async(msg()))
        if len(futs) >= 256:
            for f in futs:
                f.result(timeout=30)
                done += 1
            futs = []
    for f in futs:
        f.result(timeout=30)
        done += 1
    return done


stage("send (sync, one at a time)", n, sync_send)
stage("send (async, 256 in flight)", n, async_send)
p.shutdown()
c = SimpleConsumer(cfg, f"bench5-g-{uuid.uuid4().hex[:6]}", {topic: FilterExpression("*")}, await_duration=2)
c.startup()


def receive_ack():
    got = 0
    deadline = time.time() + 600
    while got < 2 * n and time.time() < deadline:
        for m in c.receive(32, 60):
            c.ack(m)
            got += 1
    return got


stage("receive (32 per call) + ack each", 2 * n, receive_ack)
c.shutdown()
