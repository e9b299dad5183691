"""Topic names come from clients: auto-creation by a producer or a metadata
request, a retry topic per RocketMQ consumer group. broker.max_topics bounds
them; past it a real producer is told (Kafka POLICY_VIOLATION, RocketMQ
MESSAGE_ILLEGAL), the refusals are counted, and existing topics keep
working."""
import os
import sys

import pytest
from confluent_kafka import Producer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402

MAX = 30


@pytest.fixture(scope="module")
def rokka():
    with running("hostile", "max-topics", broker_extra=f"max_topics = {MAX}") as r:
        yield r


def metric(rokka, name):
    return sum(v for k, v in rokka.metric_values().items() if k == name or k.startswith(name + "{"))


def test_auto_created_topics_stop_at_max_topics(rokka):
    results = {}

    def report(err, msg):
        results[msg.topic()] = err

    p = Producer({"bootstrap.servers": rokka.bootstrap, "message.timeout.ms": 10000, "retries": 0})
    for i in range(2 * MAX):
        p.produce(f"mt-{i}", value=b"v", on_delivery=report)
    p.flush(60)
    ok = [t for t, e in results.items() if e is None]
    refused = [t for t, e in results.items() if e is not None]
    assert 0 < len(ok) <= MAX, results
    assert refused, "nothing was refused past broker.max_topics"
    assert metric(rokka, "rokka_topics") <= MAX
    assert metric(rokka, "rokka_topics_refused_total") >= 1
    # A topic that exists takes records as before.
    again = {}
    p.produce(ok[0], value=b"again", on_delivery=lambda err, msg: again.setdefault("err", err))
    p.flush(30)
    assert again.get("err", "unset") is None, again


def test_a_validate_only_create_is_held_to_max_topics(rokka):
    """CreateTopics with validate_only names many topics: only as many as
    could be made pass (each answer lists the topic's configs, so the
    response stays bounded); the rest are POLICY_VIOLATION, as a real
    create past broker.max_topics."""
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": rokka.bootstrap})
    names = [f"vo-{i}" for i in range(3 * MAX)]
    fs = a.create_topics([NewTopic(n, 1, 1) for n in names], validate_only=True, request_timeout=30)
    ok, refused = 0, 0
    for f in fs.values():
        try:
            f.result(30)
            ok += 1
        except Exception as e:  # noqa: BLE001 (the refusal is the point)
            assert "POLICY_VIOLATION" in str(e) or "max_topics" in str(e), e
            refused += 1
    assert ok <= MAX and refused >= 2 * MAX, (ok, refused)
    assert not any(n in a.list_topics(timeout=10).topics for n in names), "validate_only made a topic"
