"""Starts a rokka per test module on free loopback ports."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import Rokka, free_port, results_dir, running  # noqa: E402,F401 (tests import free_port from here)

@pytest.fixture(scope="module")
def rokka(request):
    with running("kafka", request.module.__name__) as r:
        yield r


_n = [0]


@pytest.fixture
def topic(rokka, request):
    """A fresh topic name per test."""
    _n[0] += 1
    return f"t-{request.node.name[:40].replace('[', '-').replace(']', '')}-{_n[0]}".replace("_", "-")
