"""grpc.max_in_flight_messages with the RocketMQ 5 Python client: a full
budget refuses new messages, but what comes due again (its invisible time
over, never acked) is still handed out again — those redeliveries are what
free the budget. Refusing every receive while the budget was full jammed the
node for good once consumers held it and went away."""
import time

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from conftest import GRPC
from rokka_fixture import running

BUDGET = 8


@pytest.fixture(scope="module")
def rokka():
    with running(
        "rocketmq5",
        "inflight_budget",
        grpc_extra=GRPC + f"max_in_flight_messages = {BUDGET}\n",
        broker_extra="default_partitions = 1",
    ) as r:
        yield r


def receive(consumer, n, invisible, timeout):
    """What the receives got within `timeout` (up to n), and the errors."""
    got, errors = [], []
    deadline = time.time() + timeout
    while len(got) < n and time.time() < deadline:
        try:
            got.extend(consumer.receive(16, invisible))
        except Exception as e:  # the client raises on a refusal
            errors.append(str(e))
            time.sleep(0.3)
    return got, errors


def test_a_full_budget_still_hands_out_what_came_due(rokka):
    topic = f"budget-{int(time.time())}"
    cfg = ClientConfiguration(f"127.0.0.1:{rokka.grpc_port}", Credentials())
    p = Producer(cfg, (topic,))
    p.startup()
    consumers = []
    try:
        for i in range(2 * BUDGET):
            m = Message()
            m.topic = topic
            m.body = f"m-{i}".encode()
            p.send(m)
        holder = SimpleConsumer(cfg, "budget-holder", {topic: FilterExpression("*")}, await_duration=2)
        holder.startup()
        consumers.append(holder)
        # The holder takes the whole budget (invisible for 2 s) and acks nothing.
        held, _ = receive(holder, BUDGET, 2, 20)
        assert len(held) == BUDGET, [m.body for m in held]
        assert rokka.metric_values().get("rokka_rocketmq5_messages_inflight") == BUDGET
        # Another group gets nothing new while the budget is full.
        other = SimpleConsumer(cfg, "budget-other", {topic: FilterExpression("*")}, await_duration=2)
        other.startup()
        consumers.append(other)
        got, errors = receive(other, 1, 30, 3)
        assert got == [] and errors, "a full budget handed out a new message"
        refused = rokka.metric_values().get('rokka_rocketmq5_receives_refused_total{reason="in_flight"}', 0)
        assert refused >= 1
        # Once the holder's messages come due they are its again (refused
        # for good before), and acking them frees the budget for the other.
        time.sleep(2.5)
        again, errors = receive(holder, BUDGET, 30, 15)
        assert sorted(m.body for m in again) == sorted(m.body for m in held), errors
        for m in again:
            holder.ack(m)
        got, errors = receive(other, 1, 30, 15)
        assert got, f"the budget stayed full after the acks: {errors}"
    finally:
        for c in consumers:
            c.shutdown()
        p.shutdown()
