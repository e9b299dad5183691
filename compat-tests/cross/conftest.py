"""A rokka per test module, and the RocketMQ harness (rocketmq-client-rust)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import HARNESS, Rokka, harness, results_dir, running  # noqa: E402


@pytest.fixture(scope="module")
def rokka(request):
    if os.environ.get("ROKKA_CROSS_ON_TWO_SETS"):
        # The cluster suite runs chosen cases here on two broker sets.
        yield from _two_sets(request.module.__name__)
        return
    with running("cross", request.module.__name__, metrics_extra="lag_interval_ms = 300") as r:
        yield r


def _two_sets(name):
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "cluster", "conftest.py")
    spec = importlib.util.spec_from_file_location("cluster_conftest", path)
    cc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cc)
    c = cc.TwoSets(f"cross-{name}", metrics_extra="lag_interval_ms = 300")
    try:
        c.masters()
        yield cc.AsOneBroker(c)
    finally:
        c.close()


def _unhex(s):
    return b"" if s == "-" else bytes.fromhex(s)


class Delivery:
    """One message as the RocketMQ push consumer saw it."""

    def __init__(self, line):
        q, off, born, body, keys, tags, props, self.store_host = line.split(" ")
        self.queue, self.offset, self.born = int(q), int(off), int(born)
        self.body, self.keys, self.tags = _unhex(body), _unhex(keys).decode(), _unhex(tags).decode()
        self.props = {}
        for kv in _unhex(props).split(b"\x02"):
            if b"\x01" in kv:
                k, v = kv.split(b"\x01", 1)
                self.props[k.decode()] = v.decode()


def rocketmq_consume(rokka, topic, group, n, expr="*"):
    lines = harness(rokka, "cross-consume", topic, group, n, expr)
    return [Delivery(l[len("msg "):]) for l in lines if l.startswith("msg ")]
