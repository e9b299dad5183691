"""Apache's Rust RocketMQ 5 client (crates.io `rocketmq` 5.0.0, built by
run.sh into compat-tests/rocketmq5/rust/target/ci) against rokka's gRPC
listener: a producer's messages (tags, keys, a non-ASCII body) come back
byte-exact to a SimpleConsumer, each once; one left unacked comes back after
its invisible time with delivery attempt 2; a Kafka consumer reads the same
bodies."""
import os
import subprocess
import uuid

from kafka import KafkaConsumer
from rokka_fixture import rokka_bin

RUST = os.environ.get(
    "ROKKA_RMQ5_RUST",
    os.path.join(os.path.dirname(__file__), "rust", "target", "ci", "rokka-rmq5-rust"),
)


def test_the_rust_client_sends_receives_and_sees_a_redelivery(rokka):
    topic, group = f"g5-rust-{uuid.uuid4().hex[:6]}", f"g5-rust-g-{uuid.uuid4().hex[:6]}"
    # The client fetches routes at start: the topic exists first.
    kafka_topic_create = subprocess.run(
        [rokka_bin(), "topic", "create", topic, "--partitions", "4",
         "--brokers", rokka.bootstrap],
        capture_output=True, text=True, timeout=60,
    )
    assert kafka_topic_create.returncode == 0, kafka_topic_create.stderr
    p = subprocess.run(
        [RUST, f"127.0.0.1:{rokka.grpc_port}", "send-receive", topic, group, "12"],
        capture_output=True, text=True, timeout=150,
    )
    lines = [l for l in p.stdout.splitlines() if l.startswith("compat: ")]
    assert p.returncode == 0, f"{lines[-5:]}\n{p.stderr[-2000:]}"
    assert lines[-1].startswith("compat: 12 sent, received once each"), lines[-3:]
    got = {l.split(" ", 3)[3] for l in lines if l.startswith("compat: got ")}
    assert got == {f"rust5-{i}-é" for i in range(12)}
    k = KafkaConsumer(topic, bootstrap_servers=rokka.bootstrap, auto_offset_reset="earliest",
                      consumer_timeout_ms=8000, group_id=f"k-{group}")
    read = {m.value.decode() for m in k}
    k.close()
    assert read == got
