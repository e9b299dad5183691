"""Sync flush over gRPC: a send is answered OK only once its message is on
disk. With every msync failing (injected EIO), no send may be told OK."""
import os
import sys
import uuid

import pytest
from conftest import GRPC
from test_grpc import Clients, message

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import Rokka, results_dir  # noqa: E402


@pytest.fixture(scope="module")
def failing_disk():
    # The store reads its injected faults from the environment at start.
    os.environ["ROKKA_FAULTS"] = "msync:EIO:*"
    r = Rokka(
        results_dir("rocketmq5", "sync-eio"),
        grpc_extra=GRPC,
        store_extra='flush_mode = "sync"\nsync_flush_timeout_ms = 2000',
    )
    try:
        r.start()
    finally:
        os.environ.pop("ROKKA_FAULTS", None)
    try:
        yield r
    finally:
        # A store whose flush failed refuses writes and exits non-zero.
        r.close()


def test_a_send_is_not_acknowledged_when_its_flush_fails(failing_disk):
    topic = f"g5-eio-{uuid.uuid4().hex[:8]}"
    c = Clients(failing_disk)
    try:
        p = c.producer(topic)
        with pytest.raises(Exception) as refused:
            p.send(message(topic, b"must not be acknowledged"))
        # The client retries: its last answer is MASTER_PERSISTENCE_TIMEOUT
        # or, once the store refuses writes, INTERNAL_SERVER_ERROR.
        text = str(refused.value)
        assert any(code in text for code in ("50401", "50001")), text
    finally:
        c.close()
