"""A rokka per test module, on ports it picks itself."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import Rokka, results_dir, running  # noqa: E402


@pytest.fixture(scope="module")
def rokka(request):
    with running(
        "hostile",
        request.module.__name__,
        kafka_extra="idle_timeout_ms = 5000",
        rocketmq_extra="idle_timeout_ms = 5000\nmax_inflight_requests_per_connection = 256",
    ) as r:
        yield r
