"""A rokka with its gRPC listener per test module, the RocketMQ 5 Python
client, and the remoting harness (rocketmq-client-rust) for crossings."""
import logging
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import harness, running  # noqa: E402,F401 (harness: for the tests)


# Short invisible durations and few attempts, so redelivery and the dead
# letter queue show within seconds.
GRPC = 'min_invisible_ms = 1000\nmax_delivery_attempts = 3\nfifo_groups = ["g5-fifo-ordered"]\n'

# The client logs every RPC at INFO to its own file; keep the output short.
logging.getLogger("rocketmq").setLevel(logging.WARNING)


@pytest.fixture(scope="module")
def rokka(request):
    with running(
        "rocketmq5",
        request.module.__name__,
        grpc_extra=GRPC,
        metrics_extra="lag_interval_ms = 300",
        # Topics the clients create get four queues, as Apache's default.
        broker_extra="default_partitions = 4",
        # Open transactions are checked within seconds.
        rocketmq_extra="transaction_check_interval_ms = 1000\ntransaction_timeout_ms = 2000",
    ) as r:
        yield r


def receive_all(consumer, n, invisible=30, timeout=30, ack=True):
    """Receives until n messages arrived (acking each unless told not to) or
    the time is up; the messages in arrival order."""
    got = []
    deadline = time.time() + timeout
    while len(got) < n and time.time() < deadline:
        for m in consumer.receive(16, invisible):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got
