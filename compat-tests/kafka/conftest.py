"""Starts a rokka per test module on free loopback ports."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import Rokka, free_port, results_dir  # noqa: E402,F401 (tests import free_port from here)

@pytest.fixture(scope="module")
def rokka(request):
    r = Rokka(results_dir("kafka", request.module.__name__))
    r.start()
    try:
        yield r
    finally:
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"


_n = [0]


@pytest.fixture
def topic(rokka, request):
    """A fresh topic name per test."""
    _n[0] += 1
    return f"t-{request.node.name[:40].replace('[', '-').replace(']', '')}-{_n[0]}".replace("_", "-")
