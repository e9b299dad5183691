"""Starts a rokka per test module on free loopback ports."""
import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import Rokka, free_port  # noqa: E402,F401 (tests import free_port from here)

@pytest.fixture(scope="module")
def rokka():
    with tempfile.TemporaryDirectory(prefix="rokka-compat-") as d:
        r = Rokka(d)
        r.start()
        try:
            yield r
        finally:
            code = r.stop()
            r.log.close()
            assert code == 0, f"rokka exited with {code}; log in {d}/rokka.log"


_n = [0]


@pytest.fixture
def topic(rokka, request):
    """A fresh topic name per test."""
    _n[0] += 1
    return f"t-{request.node.name[:40].replace('[', '-').replace(']', '')}-{_n[0]}".replace("_", "-")
