"""Helpers shared by test_durability.py, test_retention.py and test_refusals.py:
the RocketMQ harness run in the background with its whole output kept,
whole-topic reads with confluent-kafka, and metric look-ups."""
import collections
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import HARNESS

_seq = itertools.count()


class Harness:
    """One harness process (rocketmq-client-rust), its stdout and stderr in a
    file kept next to rokka.log."""

    def __init__(self, rokka, name, *args, namesrv_port=None, env=None):
        self.args = [str(a) for a in args]
        self.path = os.path.join(rokka.workdir, f"harness-{next(_seq)}-{name}.log")
        self._out = open(self.path, "w")
        self.proc = subprocess.Popen(
            [HARNESS, f"127.0.0.1:{namesrv_port or rokka.namesrv_port}", *self.args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            # Broadcasting consumers keep offsets under this directory; none here do, but keep it out of $HOME.
            env={
                **os.environ,
                "rocketmq.client.localOffsetStoreDir": os.path.join(rokka.workdir, "client-offsets"),
                **(env or {}),
            },
        )

    def text(self):
        with open(self.path, errors="replace") as f:
            return f.read()

    def lines(self, prefix=""):
        """The `compat: ` lines (without that prefix) that start with `prefix`."""
        out = []
        for line in self.text().splitlines():
            if line.startswith("compat: ") and line[8:].startswith(prefix):
                out.append(line[8:])
        return out

    def wait(self, timeout):
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"harness {self.args} still running after {timeout} s; output: {self.path}")
        self._out.close()
        return code

    def kill(self):
        """SIGKILL (this process only)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._out.close()

    def running(self):
        return self.proc.poll() is None


def run_harness(rokka, name, *args, timeout=150, env=None):
    """Runs a scenario to its end; asserts it exited 0. Returns the Harness."""
    h = Harness(rokka, name, *args, env=env)
    code = h.wait(timeout)
    assert code == 0, f"harness {args} exited {code}: {h.lines()[-5:]} (output: {h.path})"
    return h


def wait_for(what, cond, timeout, every=0.2):
    """Polls `cond` until it returns something truthy or `timeout` passes; returns its last value."""
    deadline = time.time() + timeout
    while True:
        v = cond()
        if v or time.time() >= deadline:
            return v
        time.sleep(every)


def create_topics(rokka, topics):
    """{name: partitions} through the Kafka admin API."""
    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    fs = a.create_topics([NewTopic(t, n, 1) for t, n in topics.items()], operation_timeout=10)
    for f in fs.values():
        f.result(15)


def partitions(rokka, topic, timeout=10):
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"meta-{uuid.uuid4()}"})
    try:
        md = c.list_topics(topic, timeout=timeout)
        t = md.topics[topic]
        assert t.error is None, t.error
        return sorted(t.partitions)
    finally:
        c.close()


def watermarks(rokka, topic):
    """{partition: (low, high)}."""
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": f"marks-{uuid.uuid4()}"})
    try:
        md = c.list_topics(topic, timeout=10)
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in sorted(md.topics[topic].partitions)
        }
    finally:
        c.close()


def read_topic(rokka, topic, timeout=30):
    """Every record of `topic` from each partition's log start to its end:
    [(partition, offset, value)], with confluent-kafka (no group, no commit)."""
    marks = watermarks(rokka, topic)
    c = Consumer(
        {
            "bootstrap.servers": rokka.bootstrap,
            "group.id": f"reader-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    todo = {p for p, (lo, hi) in marks.items() if hi > lo}
    c.assign([TopicPartition(topic, p, marks[p][0]) for p in todo])
    out = []
    deadline = time.time() + timeout
    try:
        while todo and time.time() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    if m.offset() >= marks[m.partition()][1]:
                        todo.discard(m.partition())
                    continue
                raise AssertionError(f"reading {topic}: {m.error()}")
            out.append((m.partition(), m.offset(), m.value()))
            if m.offset() + 1 >= marks[m.partition()][1]:
                todo.discard(m.partition())
    finally:
        c.close()
    assert not todo, f"{topic}: partitions {sorted(todo)} not read to their end {marks} within {timeout} s"
    return out


def committed(rokka, group, topic, parts):
    """{partition: committed offset or None} of `group` (OffsetFetch; joins nothing)."""
    c = Consumer({"bootstrap.servers": rokka.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in got}
    finally:
        c.close()


def values(records):
    """Counter of record values (as str)."""
    return collections.Counter(v.decode(errors="replace") if v is not None else None for _, _, v in records)


def metric(rokka, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for k, v in rokka.metric_values().items():
        base, _, rest = k.partition("{")
        if base != name:
            continue
        if all(f'{lk}="{lv}"' in rest for lk, lv in labels.items()):
            total += v
    return total


def log_since(rokka, mark):
    """rokka.log from byte `mark` on, without colour codes."""
    with open(rokka.log_path, "rb") as f:
        f.seek(mark)
        return re.sub(r"\x1b\[[0-9;]*m", "", f.read().decode(errors="replace"))


def log_size(rokka):
    rokka.log.flush()
    return os.path.getsize(rokka.log_path)


def _read_exactly(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


class RemotingTap:
    """A TCP relay in front of one rokka RocketMQ port that decodes the
    remoting frames passing through (JSON or ROCKETMQ headers) and records
    every exchange as (request code, request header fields, response code,
    response remark): what
    rokka answered, which the client library does not always show.

    Listens on a port it binds itself (`.port`); forwards each connection to
    127.0.0.1:`.target`, set once rokka reported its ports."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.target = None
        self.exchanges = []
        self._requests = {}
        self._lock = threading.Lock()
        self._conns = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        n = 0
        while not self._closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            n += 1
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                u.settimeout(None)
            except (OSError, TypeError):
                c.close()
                continue
            with self._lock:
                self._conns += [c, u]
            threading.Thread(target=self._pump, args=(n, c, u, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(n, u, c, "down"), daemon=True).start()

    def _pump(self, conn, src, dst, direction):
        try:
            while True:
                head = _read_exactly(src, 4)
                if head is None:
                    break
                frame = _read_exactly(src, int.from_bytes(head, "big"))
                if frame is None:
                    break
                # Recorded before it is passed on: an answer can come back
                # (and be recorded by the other pump) before sendall returns.
                self._record(conn, direction, frame)
                dst.sendall(head + frame)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _record(self, conn, direction, frame):
        mark = int.from_bytes(frame[:4], "big")
        header = frame[4 : 4 + (mark & 0xFFFFFF)]
        try:
            if mark >> 24 == 0:
                h = json.loads(header)
                code, opaque, flag, remark = h.get("code"), h.get("opaque"), h.get("flag", 0), h.get("remark")
                ext = h.get("extFields") or {}
            else:  # ROCKETMQ: code(2) language(1) version(2) opaque(4) flag(4) remark length(4) remark ...
                code = int.from_bytes(header[0:2], "big", signed=True)
                opaque = int.from_bytes(header[5:9], "big", signed=True)
                flag = int.from_bytes(header[9:13], "big", signed=True)
                n = int.from_bytes(header[13:17], "big", signed=True)
                remark = header[17 : 17 + n].decode(errors="replace") if n > 0 else None
                ext = {}  # (not decoded)
        except ValueError:
            return
        with self._lock:
            if flag & 1:  # a response to a request that went the other way
                other = "down" if direction == "up" else "up"
                req, req_ext = self._requests.pop((conn, other, opaque), (None, {}))
                self.exchanges.append((req, req_ext, code, remark))
            else:
                self._requests[(conn, direction, opaque)] = (code, ext)

    def mark(self):
        with self._lock:
            return len(self.exchanges)

    def answers(self, request_code, since=0, **ext):
        """[(response code, remark)] to the requests of `request_code` (whose
        header fields include `ext`) recorded after exchange number `since`."""
        with self._lock:
            return [
                (c, r)
                for q, qext, c, r in self.exchanges[since:]
                if q == request_code and all(str(qext.get(k)) == str(v) for k, v in ext.items())
            ]

    def close(self):
        self._closed = True
        self.sock.close()
        with self._lock:
            for c in self._conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
