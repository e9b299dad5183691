"""A rokka per test module, on ports it picks itself."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import Rokka, results_dir  # noqa: E402


@pytest.fixture(scope="module")
def rokka(request):
    r = Rokka(
        results_dir("hostile", request.module.__name__),
        kafka_extra="idle_timeout_ms = 5000",
        rocketmq_extra="idle_timeout_ms = 5000\nmax_inflight_requests_per_connection = 256",
    )
    r.start()
    try:
        yield r
    finally:
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"
