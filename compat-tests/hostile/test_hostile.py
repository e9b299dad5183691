"""Hostile clients over raw sockets against a live rokka while real clients
(confluent-kafka / librdkafka producer and consumer, and the RocketMQ client
through the harness) keep working: huge counts and random bodies behind every
Kafka API key and version rokka lists, lying batches with valid CRCs,
RocketMQ connections that pipeline and never read, thousands of idle
connections, slowloris frames, garbage on every port. The real clients must
see no error and lose or duplicate nothing; rokka must still answer and its
memory stay bounded; its log must hold no panic."""
import random
import socket
import struct
import subprocess
import threading
import time
import zlib

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from rokka_fixture import HARNESS


def kafka_frame(key, version, body, correlation=1, flexible=False):
    client = b"hostile"
    header = struct.pack(">hhih", key, version, correlation, len(client)) + client
    if flexible:
        header += b"\x00"  # empty tagged fields
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def api_versions(addr):
    """[(key, min, max)] from ApiVersions v0."""
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(kafka_frame(18, 0, b""))
        n = struct.unpack(">i", recv_exact(s, 4))[0]
        b = recv_exact(s, n)
    _corr, err, count = struct.unpack(">ihi", b[:10])
    assert err == 0
    out = []
    for i in range(count):
        out.append(struct.unpack(">hhh", b[10 + 6 * i : 16 + 6 * i]))
    return out


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise ConnectionError("closed")
        b += chunk
    return b


def poke(addr, data, wait=5.0):
    """Sends `data` and waits for an answer or a close; never hangs."""
    with socket.create_connection(addr, timeout=wait) as s:
        try:
            s.sendall(data)
            s.recv(65536)
        except (socket.timeout, ConnectionError, OSError):
            pass


def crc32c(data):
    # Castagnoli, bitwise (small inputs only).
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def uvarint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def varint(n):
    """Kafka's signed (zigzag) varint."""
    return uvarint((n << 1) ^ (n >> 63))


def lying_batch(records=1, claim=None, last_delta=None):
    recs = b""
    for i in range(records):
        r = b"\x00" + varint(0) + varint(i) + varint(-1) + varint(1) + b"x" + varint(0)
        recs += varint(len(r)) + r
    claim = records if claim is None else claim
    last_delta = records - 1 if last_delta is None else last_delta
    after_crc = struct.pack(">hiqqqhii", 0, last_delta, 0, 0, -1, -1, -1, claim) + recs
    crc = crc32c(after_crc)
    rest = struct.pack(">i", 0) + bytes([2]) + struct.pack(">I", crc) + after_crc
    return struct.pack(">q", 0) + struct.pack(">i", len(rest)) + rest


def produce_v3(topic, batch):
    t = topic.encode()
    body = struct.pack(">h", -1)  # transactional id: null
    body += struct.pack(">hi", -1, 5000)  # acks, timeout
    body += struct.pack(">i", 1) + struct.pack(">h", len(t)) + t
    body += struct.pack(">i", 1) + struct.pack(">i", 0) + struct.pack(">i", len(batch)) + batch
    return kafka_frame(0, 3, body)


def rmq_frame(code, opaque, ext=None, body=b""):
    import json

    header = json.dumps(
        {"code": code, "language": "JAVA", "version": 453, "opaque": opaque, "flag": 0, "extFields": ext or {}}
    ).encode()
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_hostile_clients_do_not_disturb_real_ones(rokka):
    import resource

    # This process holds thousands of sockets: take the hard limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 8192:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))
    kafka = ("127.0.0.1", rokka.kafka_port)
    broker = ("127.0.0.1", rokka.broker_port)
    namesrv = ("127.0.0.1", rokka.namesrv_port)
    topic = "hostile-real"
    admin = AdminClient({"bootstrap.servers": rokka.bootstrap})
    for f in admin.create_topics([NewTopic(topic, 4, 1)]).values():
        f.result(15)

    # The real clients: acks=all producer and a consumer, for the whole storm.
    total = 20_000
    errors, acked = [], []
    stop = threading.Event()

    def produce():
        p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})

        def cb(err, msg):
            if err is not None:
                errors.append(str(err))
            else:
                acked.append(msg.value())

        for i in range(total):
            while True:
                try:
                    p.produce(topic, value=f"v{i}".encode(), partition=i % 4, on_delivery=cb)
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 500 == 0:
                p.poll(0)
                time.sleep(0.02)  # spread the load over the storm
        if p.flush(60) != 0:
            errors.append("flush left messages undelivered")

    got = []

    def consume():
        c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": "hostile-real", "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.assign([TopicPartition(topic, p, 0) for p in range(4)])
        deadline = time.time() + 150
        while len(got) < total and time.time() < deadline and not stop.is_set():
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                errors.append(f"consume: {m.error()}")
                continue
            got.append(m.value())
        c.close()

    tp = threading.Thread(target=produce)
    tc = threading.Thread(target=consume)
    tp.start()
    tc.start()

    rng = random.Random(0x51)
    # 1. Every Kafka API key and version rokka lists: lying counts, random bodies.
    for key, vmin, vmax in api_versions(kafka):
        for v in range(vmin, vmax + 1):
            for flexible in (False, True):
                poke(kafka, kafka_frame(key, v, b"\x7f\xff\xff\xff" * 6, flexible=flexible), wait=2)
                body = bytes(rng.choice([0xFF, 0x7F, rng.randrange(256)]) for _ in range(rng.randrange(64)))
                poke(kafka, kafka_frame(key, v, body, flexible=flexible), wait=2)
    # Unknown keys and versions.
    poke(kafka, kafka_frame(999, 0, b""), wait=2)
    poke(kafka, kafka_frame(3, 999, b""), wait=2)
    # 2. Lying batches with valid CRCs: refused, never stored.
    for batch in (lying_batch(1, claim=0x7FFFFFF0), lying_batch(3, claim=2, last_delta=1), lying_batch(2, claim=5, last_delta=4)):
        with socket.create_connection(kafka, timeout=10) as s:
            s.sendall(produce_v3(topic, batch))
            n = struct.unpack(">i", recv_exact(s, 4))[0]
            resp = recv_exact(s, n)
            # corr(4) topics(4) name(2+n) parts(4) index(4) error(2)
            at = 4 + 4 + 2 + len(topic) + 4 + 4
            # INVALID_RECORD (87): whole and CRC right, records lying — as
            # Kafka's InvalidRecordException, which clients do not retry.
            assert struct.unpack(">h", resp[at : at + 2])[0] == 87, "INVALID_RECORD"
    # 3. RocketMQ connections that pipeline and never read.
    hogs = []
    for _ in range(3):
        s = socket.create_connection(broker, timeout=5)
        s.setblocking(False)
        hogs.append(s)
    frame = rmq_frame(21, 7)  # GET_ALL_TOPIC_CONFIG
    chunk = frame * 2000
    t_end = time.time() + 8
    while time.time() < t_end:
        for s in hogs:
            try:
                s.send(chunk)
            except (BlockingIOError, OSError):
                pass
        time.sleep(0.01)
    # 4. Thousands of idle connections over the three ports.
    idle = []
    for i in range(3000):
        addr = (kafka, broker, namesrv)[i % 3]
        try:
            idle.append(socket.create_connection(addr, timeout=5))
        except OSError:
            break
    assert len(idle) == 3000, f"only {len(idle)} idle connections accepted"
    # 5. Slowloris: frames a byte at a time on every port.
    slow = [socket.create_connection(a, timeout=5) for a in (kafka, broker, namesrv) for _ in range(20)]
    payloads = [kafka_frame(18, 0, b""), frame, frame]
    for k in range(30):
        for i, s in enumerate(slow):
            p = payloads[(i // 20)]
            try:
                s.send(p[k % len(p) : k % len(p) + 1])
            except OSError:
                pass
        time.sleep(0.05)
    # 6. Garbage on every port.
    for addr in (kafka, broker, namesrv):
        for _ in range(20):
            poke(addr, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))), wait=1)
        poke(addr, b"\xff\xff\xff\xff" + b"\x00" * 16, wait=1)
        poke(addr, b"\x00\x00\x00\x10" + b"\x00\x00\x00\x0c" + b"{" * 12, wait=1)

    # The RocketMQ client works meanwhile, against the same broker.
    p = subprocess.run(
        [HARNESS, f"127.0.0.1:{rokka.namesrv_port}", "send-consume"], capture_output=True, text=True, timeout=170
    )
    assert p.returncode == 0, f"RocketMQ client failed during the storm: {p.stdout[-1500:]} {p.stderr[-1500:]}"

    rss_storm = rss_kib(rokka.proc.pid)
    tp.join(180)
    tc.join(180)
    stop.set()
    for s in hogs + idle + slow:
        s.close()

    assert not errors, f"real-client errors: {errors[:5]}"
    assert len(acked) == total, f"{len(acked)} of {total} acknowledged"
    assert sorted(got) == sorted(acked), f"consumed {len(got)}, distinct {len(set(got))}, acknowledged {len(acked)}"
    assert len(set(got)) == total, "duplicates consumed"
    # Bounded memory: 3,000 connections and pipelining hogs must not grow the broker past this.
    assert rss_storm < 1024 * 1024, f"rokka RSS {rss_storm} KiB during the storm"
    # Still answering, and nothing panicked.
    assert api_versions(kafka)
    with open(rokka.log_path, "rb") as f:
        log = f.read().decode(errors="replace")
    assert "panicked" not in log, "a panic in rokka's log"
    m = rokka.metric_values()
    closed = sum(v for k, v in m.items() if k.startswith("rokka_connections_idle_closed_total"))
    refused = sum(v for k, v in m.items() if k.startswith("rokka_kafka_batches_refused_total"))
    assert refused >= 3, "the lying batches were counted as refused"
    print(f"storm: RSS {rss_storm} KiB; idle/dribbling connections closed so far {closed}")
