"""Push consumers (auto_renew) with the RocketMQ 5 Python client: a message
whose processing outlasts the invisible time is renewed while its client
lives, as Apache's proxy renews receipt handles — not delivered to the other
member as well — and the client acks it with the handle it was given."""
import threading
import time

import pytest
from rocketmq import ClientConfiguration, ConsumeResult, Credentials, FilterExpression, MessageListener, Producer, PushConsumer
from rocketmq import Message

from conftest import GRPC
from rokka_fixture import running


@pytest.fixture(scope="module")
def rokka():
    # A 2 s renewal slice (Apache: 60 s) so a few seconds of processing
    # outlast it; one queue, so both members pop the same messages.
    with running(
        "rocketmq5",
        "auto_renew",
        grpc_extra=GRPC + "auto_renew_invisible_ms = 2000\n",
        broker_extra="default_partitions = 1",
    ) as r:
        yield r


class Slow(MessageListener):
    """Takes `secs` over each message; records who consumed what."""

    def __init__(self, who, secs, seen, lock):
        self.who, self.secs, self.seen, self.lock = who, secs, seen, lock

    def consume(self, message):
        time.sleep(self.secs)
        with self.lock:
            self.seen.append((self.who, message.body))
        return ConsumeResult.SUCCESS


def test_a_message_processed_longer_than_its_invisible_time_is_not_delivered_twice(rokka):
    topic, group = f"renew-{int(time.time())}", "renew-g"
    cfg = ClientConfiguration(f"127.0.0.1:{rokka.grpc_port}", Credentials())
    p = Producer(cfg, (topic,))
    p.startup()
    seen, lock = [], threading.Lock()
    members = []
    try:
        for who in ("a", "b"):
            c = PushConsumer(cfg, group, Slow(who, 7, seen, lock), {topic: FilterExpression("*")})
            c.startup()
            members.append(c)
        time.sleep(3)
        before = rokka.metric_values().get("rokka_rocketmq5_invisible_renewals_total", 0)
        bodies = [f"slow-{i}".encode() for i in range(3)]
        for b in bodies:
            m = Message()
            m.topic = topic
            m.body = b
            p.send(m)
        deadline = time.time() + 45
        while time.time() < deadline:
            with lock:
                if sorted(b for _, b in seen) == sorted(bodies):
                    break
            time.sleep(0.5)
        # Anything delivered a second time would be processed by now too.
        time.sleep(9)
        with lock:
            got = sorted(b for _, b in seen)
        assert got == sorted(bodies), f"each once over both members (7 s each, invisible 2 s): {seen}"
        renewals = rokka.metric_values().get("rokka_rocketmq5_invisible_renewals_total", 0) - before
        assert renewals >= 3, renewals
    finally:
        for c in members:
            c.shutdown()
        p.shutdown()
