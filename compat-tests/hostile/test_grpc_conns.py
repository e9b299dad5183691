"""The RocketMQ 5 gRPC listener's connection budgets: connections from one
address beyond grpc.max_connections_per_ip are closed at accept, and a
connection that has not sent the HTTP/2 preface (nothing, or a byte of
it) is closed after grpc.preface_timeout_ms — so silent sockets from one host cannot hold the
listener's slots. A connection that speaks HTTP/2 is served."""
import os
import socket
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402

PER_IP = 4
PREFACE_MS = 1500
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
H2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@pytest.fixture(scope="module")
def rokka():
    with running(
        "hostile",
        "grpc_conns",
        grpc_extra=f"max_connections_per_ip = {PER_IP}\npreface_timeout_ms = {PREFACE_MS}",
    ) as r:
        yield r


def metric(rokka, name, label):
    return sum(v for k, v in rokka.metric_values().items() if k.startswith(name + "{") and label in k)


def closed_by_peer(s, secs):
    """True if the peer closes `s` within `secs` (EOF or reset); what it
    sends before (its HTTP/2 SETTINGS, a GOAWAY) is read and dropped."""
    end = time.time() + secs
    while True:
        left = end - time.time()
        if left <= 0:
            return False
        s.settimeout(left)
        try:
            if s.recv(4096) == b"":
                return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False


def speaks_http2(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(H2_PREFACE + H2_SETTINGS)
        head = s.recv(9)
        # The server's connection preface is a SETTINGS frame.
        return len(head) == 9 and head[3] == 4


def test_silent_connections_are_closed_and_one_address_holds_at_most_its_share(rokka):
    port = rokka.grpc_port
    refused = metric(rokka, "rokka_connections_refused_total", 'listener="grpc"')
    idle = metric(rokka, "rokka_connections_idle_closed_total", 'listener="grpc"')
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(PER_IP)]
    # One sends the preface's first byte, then nothing: no slot either.
    silent[0].sendall(H2_PREFACE[:1])
    try:
        time.sleep(0.3)
        # One more from the same address: accepted by TCP, closed by rokka.
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert closed_by_peer(extra, 5), "a connection past max_connections_per_ip was kept"
        extra.close()
        assert metric(rokka, "rokka_connections_refused_total", 'listener="grpc"') > refused
        # The silent ones are closed once the preface timeout has passed.
        t0 = time.time()
        for s in silent:
            assert closed_by_peer(s, 10), "a connection that sent nothing was kept"
        took = time.time() - t0
        assert took < 8, took
        assert metric(rokka, "rokka_connections_idle_closed_total", 'listener="grpc"') >= idle + PER_IP
    finally:
        for s in silent:
            s.close()
    # Their slots are free again: HTTP/2 clients are served.
    deadline = time.time() + 5
    while time.time() < deadline and metric(rokka, "rokka_connections_open", 'listener="grpc"') > 0:
        time.sleep(0.1)
    assert all(speaks_http2(port) for _ in range(PER_IP + 1))


def test_a_connection_that_spoke_http2_is_not_closed_by_the_preface_timeout(rokka):
    with socket.create_connection(("127.0.0.1", rokka.grpc_port), timeout=5) as s:
        s.sendall(H2_PREFACE + H2_SETTINGS)
        assert s.recv(9)[3:4] == b"\x04"
        # Past the preface timeout the connection is still open (HTTP/2's
        # own pings watch it from here).
        s.settimeout(PREFACE_MS / 1000 * 2)
        try:
            while True:
                data = s.recv(4096)
                assert data != b"", "closed after it spoke HTTP/2"
        except socket.timeout:
            pass
