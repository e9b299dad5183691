"""The /metrics endpoint's and the console's connection budgets
(metrics|console.max_connections, connection_timeout_ms): clients that
connect and send nothing, or send a request that never ends, hold at most
the budget and only until their deadline; a real HTTP client (urllib) is
answered once they are gone, and the metrics say what happened."""
import os
import socket
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402

DEADLINE_S = 3


@pytest.fixture(scope="module")
def rokka():
    with running(
        "hostile",
        "http_budget",
        metrics_extra=f"max_connections = 2\nconnection_timeout_ms = {DEADLINE_S * 1000}",
        console_extra=f"max_connections = 1\nconnection_timeout_ms = {DEADLINE_S * 1000}",
    ) as r:
        yield r


def get(url, timeout):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def hold(port, data=b""):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    if data:
        s.sendall(data)
    return s


def closed_by_peer(s, within):
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except (socket.timeout, ConnectionResetError):
        return False


def value(rokka, name):
    return sum(v for k, v in rokka.metric_values().items() if k.startswith(name) and 'server="metrics"' in k)


def test_metrics_endpoint_budget_and_deadline(rokka):
    url = f"http://127.0.0.1:{rokka.metrics_port}/metrics"
    cut_before = value(rokka, "rokka_http_connections_timed_out_total")
    # Two hostile connections take the whole budget: one silent, one whose
    # request headers never end.
    silent = hold(rokka.metrics_port)
    slow = hold(rokka.metrics_port, b"GET /metrics HTTP/1.1\r\nHost: rokka\r\nX-Slow: ")
    time.sleep(0.2)
    # A scrape meanwhile waits in the accept queue: no answer within 1 s.
    with pytest.raises((socket.timeout, TimeoutError, urllib.error.URLError)):
        get(url, 1)
    # At the deadline the silent one is closed, the slow one after its
    # grace (the timeout again); then scrapes are answered.
    assert closed_by_peer(silent, DEADLINE_S + 10)
    assert closed_by_peer(slow, 2 * DEADLINE_S + 10)
    status, text = get(url, 10)
    assert status == 200
    assert 'rokka_http_connection_budget_waits_total{server="metrics"}' in text
    # Only the request that never ended counts as cut; the silent
    # connection was idle and is closed without counting.
    assert value(rokka, "rokka_http_connections_timed_out_total") == cut_before + 1


def test_console_budget(rokka):
    url = f"http://127.0.0.1:{rokka.console_port}/"
    status, _ = get(url, 30)
    assert status == 200
    silent = hold(rokka.console_port)
    time.sleep(0.2)
    with pytest.raises((socket.timeout, TimeoutError, urllib.error.URLError)):
        get(url, 1)
    assert closed_by_peer(silent, DEADLINE_S + 10)
    status, _ = get(url, 30)
    assert status == 200
