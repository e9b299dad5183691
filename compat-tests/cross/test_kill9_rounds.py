"""Five SIGKILLs of rokka in sync-flush mode while librdkafka (acks=all,
idempotent) and the RocketMQ client (sync sends, one attempt each) write:
every acknowledged message is there exactly once at the end, read back by
confluent-kafka from both topics (the RocketMQ one crossing)."""
import collections
import os
import random
import threading
import time

import pytest
from confluent_kafka import Producer

from rokka_fixture import running
from realclients import Harness, create_topics, read_topic, values, wait_for

ROUNDS = 5


@pytest.fixture(scope="module")
def rokka():
    with running("cross", "test_kill9_rounds", store_extra='flush_mode = "sync"') as r:
        yield r


def test_kill9_rounds_lose_no_acknowledged_message(rokka):
    create_topics(rokka, {"K9Kafka": 2, "K9Rmq": 4})
    rng = random.Random(9)
    acked, errors = [], []
    stop = threading.Event()

    def produce():
        p = Producer(
            {
                "bootstrap.servers": rokka.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 120000,
                "reconnect.backoff.max.ms": 500,
            }
        )

        def cb(err, msg):
            if err is None:
                acked.append(msg.value().decode())
            else:
                errors.append(str(err))

        i = 0
        while not stop.is_set():
            try:
                p.produce("K9Kafka", value=f"k-{i}".encode(), partition=i % 2, on_delivery=cb)
                i += 1
            except BufferError:
                pass
            p.poll(0.002)
        if p.flush(120) != 0:
            errors.append("not every message delivered by the end")

    stop_file = os.path.join(rokka.workdir, "k9-stop")
    rmq = Harness(rokka, "k9-send", "dur-send", "K9Rmq", "r", 1_000_000, 600, 2, stop_file)
    t = threading.Thread(target=produce)
    t.start()
    try:
        for round_ in range(ROUNDS):
            before = len(acked)
            # Let both clients get acknowledgements in, then kill at a random moment.
            wait_for(f"round {round_}: Kafka acknowledgements", lambda: len(acked) > before + 50, 60)
            wait_for(
                f"round {round_}: RocketMQ acknowledgements",
                lambda: len(rmq.lines("acked ")) > 20 * (round_ + 1),
                90,
            )
            time.sleep(rng.uniform(0.1, 1.0))
            assert rokka.kill() == -9
            time.sleep(rng.uniform(0.2, 1.0))
            rokka.start()
        wait_for("Kafka acknowledgements after the last restart", lambda: len(acked) > 100, 60)
    finally:
        stop.set()
        with open(stop_file, "w"):
            pass
        t.join(180)
        rmq.wait(120)

    assert not errors, f"Kafka producer errors: {errors[:5]}"
    rmq_acked = [line.split()[1] for line in rmq.lines("acked ")]
    assert len(rmq_acked) > 20 * ROUNDS
    kafka_got = values(read_topic(rokka, "K9Kafka"))
    rmq_got = values(read_topic(rokka, "K9Rmq"))
    lost = [v for v in acked if kafka_got[v] == 0]
    assert not lost, f"{len(lost)} acknowledged Kafka records lost, e.g. {lost[:5]}"
    twice = {v: n for v, n in kafka_got.items() if n > 1}
    assert not twice, f"Kafka records stored twice: {list(twice.items())[:5]}"
    lost = [v for v in rmq_acked if rmq_got[v] == 0]
    assert not lost, f"{len(lost)} acknowledged RocketMQ messages lost, e.g. {lost[:5]}"
    twice = {v: n for v, n in rmq_got.items() if n > 1}
    assert not twice, f"RocketMQ messages stored twice: {list(twice.items())[:5]}"
    print(
        f"{ROUNDS} kill -9 rounds: {len(acked)} Kafka and {len(rmq_acked)} RocketMQ acknowledged, "
        f"{sum(kafka_got.values())} / {sum(rmq_got.values())} stored"
    )
    assert collections.Counter(acked) == collections.Counter({v: 1 for v in acked})
