"""Request bytes on the gRPC listener (docs/rocketmq5.md, Budgets): raw
HTTP/2 clients (the `h2` package) open SendMessage calls, each declaring a
7 MiB message and sending 3 MiB of it, then stop. HTTP/2 flow control does
not hold them back (the decoder buffers a message until whole and hands
the window back as it buffers); `grpc.max_inflight_request_bytes` does: the
calls whose bytes find no room end RESOURCE_EXHAUSTED, those that stop
halfway end DEADLINE_EXCEEDED after `grpc.request_read_timeout_ms`, and
their bytes are let go. A real client sends and receives throughout.
"""
import os
import socket
import sys
import threading
import time
import uuid

import h2.config
import h2.connection
import h2.events
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402

BUDGET = 16 << 20
READ_TIMEOUT_MS = 4000
DECLARED = 7 << 20
SENT = 3 << 20
CALLS = 8


@pytest.fixture(scope="module")
def rokka(request):
    with running(
        "rocketmq5",
        request.module.__name__,
        grpc_extra=f"max_inflight_request_bytes = {BUDGET}\nrequest_read_timeout_ms = {READ_TIMEOUT_MS}\n",
    ) as r:
        yield r


def metric(rokka, name, **labels):
    total = 0.0
    for k, v in rokka.metric_values().items():
        base, _, rest = k.partition("{")
        if base == name and all(f'{lk}="{lv}"' in rest for lk, lv in labels.items()):
            total += v
    return total


class HalfSender:
    """One HTTP/2 connection whose streams each send part of a big SendMessage and stop."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.left = {}  # stream id -> bytes still to send
        self.status = {}  # stream id -> grpc-status (or "reset")
        self.lock = threading.Lock()

    def open(self, n):
        prefix = b"\x00" + DECLARED.to_bytes(4, "big")
        for _ in range(n):
            sid = self.conn.get_next_available_stream_id()
            self.conn.send_headers(
                sid,
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/apache.rocketmq.v2.MessagingService/SendMessage"),
                    (":authority", "rokka"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ],
            )
            # A protobuf field (1, length-delimited) that never completes.
            self.left[sid] = prefix + b"\x0a" + b"\xff" * (SENT - 6)
        self.pump()

    def pump(self, seconds=0.0):
        """Sends what the windows allow and reads answers, for `seconds` (once at least)."""
        end = time.time() + seconds
        while True:
            for sid, data in list(self.left.items()):
                if sid in self.status or not data:
                    continue
                room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
                while data and room > 0:
                    chunk, data = data[:room], data[room:]
                    self.conn.send_data(sid, chunk)
                    room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
                self.left[sid] = data
            self.sock.sendall(self.conn.data_to_send())
            self.sock.settimeout(0.2)
            try:
                got = self.sock.recv(1 << 16)
            except socket.timeout:
                got = None
            if got == b"":
                break
            if got:
                for ev in self.conn.receive_data(got):
                    if isinstance(ev, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
                        for k, v in ev.headers:
                            if k == "grpc-status":
                                self.status[ev.stream_id] = int(v)
                    elif isinstance(ev, h2.events.StreamReset):
                        self.status.setdefault(ev.stream_id, "reset")
                self.sock.sendall(self.conn.data_to_send())
            if time.time() >= end:
                break

    def close(self):
        self.sock.close()


def test_half_sent_calls_are_bounded_refused_and_timed_out(rokka):
    from test_grpc import Clients, message
    from conftest import receive_all

    senders = [HalfSender(rokka.grpc_port) for _ in range(2)]
    try:
        for s in senders:
            s.open(CALLS // 2)
        # Send for a while: 8 calls × 3 MiB is 24 MiB, over the 16 MiB budget.
        deadline = time.time() + 3
        peak = 0.0
        while time.time() < deadline:
            for s in senders:
                s.pump(0.2)
            peak = max(peak, metric(rokka, "rokka_inflight_request_bytes", listener="grpc"))
        # (The gauge is what the budget reserved: over it only if the
        # budget did not hold; with no budget it reached 24 MiB here.)
        assert peak <= BUDGET, f"{peak} request bytes held over a {BUDGET} budget"
        refused = metric(rokka, "rokka_inflight_request_bytes_refused_total", listener="grpc")
        assert refused >= 1, "no call was refused"
        statuses = [st for s in senders for st in s.status.values()]
        assert 8 in statuses, f"no RESOURCE_EXHAUSTED answer: {statuses}"  # grpc-status 8
        # A real client works beside them (its small calls fit in what is left).
        topic = f"g5-budget-{uuid.uuid4().hex[:8]}"
        c = Clients(rokka)
        try:
            c.producer(topic).send(message(topic, b"beside"))
            got = receive_all(c.consumer(f"g5-budget-g-{uuid.uuid4().hex[:6]}", topic), 1)
            assert [m.body for m in got] == [b"beside"]
        finally:
            c.close()
        # The calls that stopped halfway end at the read deadline, and let go.
        deadline = time.time() + READ_TIMEOUT_MS / 1000 + 10
        while time.time() < deadline and len([1 for s in senders for _ in s.status]) < CALLS:
            for s in senders:
                s.pump(0.2)
        statuses = [st for s in senders for st in s.status.values()]
        assert len(statuses) == CALLS, f"calls left hanging: {statuses}"
        assert 4 in statuses, f"no DEADLINE_EXCEEDED answer: {statuses}"  # grpc-status 4
        assert sorted(set(statuses)) == [4, 8], f"every call refused or timed out: {statuses}"
        assert metric(rokka, "rokka_rocketmq5_request_read_timeouts_total") >= 1
        assert metric(rokka, "rokka_inflight_request_bytes", listener="grpc") == 0
    finally:
        for s in senders:
            s.close()
