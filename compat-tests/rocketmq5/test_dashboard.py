"""The Grafana dashboard and the alert rules against a live node after a
mixed workload — Kafka (kafka-python), remoting (the harness: sends, a
group, retries into the DLQ, delay levels, transactions) and gRPC (sends,
pops, redelivery into the DLQ, timer messages): every metric they use is
exported with a HELP text, and the per-topic rates they chart count what
the clients did."""
import os
import sys
import time
import uuid

from conftest import harness, receive_all
from kafka import KafkaConsumer, KafkaProducer
from test_grpc import Clients, message, metric

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from dashboard import families, metric_names  # noqa: E402


def test_every_metric_the_dashboard_and_alerts_use_is_exported(rokka):
    run = uuid.uuid4().hex[:6]
    ktopic, gtopic = f"dash-kafka-{run}", f"dash-grpc-{run}"
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap)
    for i in range(10):
        p.send(ktopic, f"k-{i}".encode() * 10)
    p.flush()
    p.close()
    c = KafkaConsumer(ktopic, bootstrap_servers=rokka.bootstrap, group_id=f"dash-kg-{run}",
                      auto_offset_reset="earliest", consumer_timeout_ms=8000)
    got = [m for _, m in zip(range(10), c)]
    c.commit()
    c.close()
    assert len(got) == 10
    assert metric(rokka, "rokka_kafka_messages_in_total", topic=ktopic) == 10
    assert metric(rokka, "rokka_kafka_bytes_in_total", topic=ktopic) > 200
    assert metric(rokka, "rokka_kafka_messages_out_total", topic=ktopic) >= 10
    assert metric(rokka, "rokka_kafka_bytes_out_total", topic=ktopic) > 200
    # Remoting: a group, its retries into the DLQ, delay levels, transactions.
    remoting_in = metric(rokka, "rokka_rocketmq_messages_in_total")
    remoting_out = metric(rokka, "rokka_rocketmq_messages_out_total")
    for scenario in ("send-consume", "retry-dlq", "delay", "transactions"):
        harness(rokka, scenario)
    # The per-topic counters (cached handles, rokka_broker::traffic) count
    # what the harness sent and pulled.
    assert metric(rokka, "rokka_rocketmq_messages_in_total") > remoting_in
    assert metric(rokka, "rokka_rocketmq_messages_out_total") > remoting_out
    assert metric(rokka, "rokka_topic_metric_handles", family="rokka_kafka_messages_in_total") >= 1
    # gRPC: sends, pops, redelivery into the DLQ (max_delivery_attempts = 3),
    # a timer message.
    clients = Clients(rokka)
    try:
        gp = clients.producer(gtopic)
        gp.send(message(gtopic, b"dead"))
        gp.send(message(gtopic, b"later", deliver_at=int(time.time()) + 600))  # seconds on the wire
        gc = clients.consumer(f"dash-gg-{run}", gtopic, wait=1)
        deadline = time.time() + 30
        while metric(rokka, "rokka_rocketmq5_dlq_messages_total") < 1 and time.time() < deadline:
            receive_all(gc, 1, invisible=1, timeout=2, ack=False)
    finally:
        clients.close()
    assert metric(rokka, "rokka_rocketmq5_messages_sent_total", topic=gtopic) == 2
    assert metric(rokka, "rokka_rocketmq5_bytes_sent_total", topic=gtopic) == len(b"dead") + len(b"later")
    time.sleep(1)  # the lag gauges (metrics.lag_interval_ms = 300)
    seen = families(rokka.metrics())
    used = metric_names()
    missing = {m: where for m, where in used.items() if m not in seen}
    assert not missing, f"used by the dashboard/alerts but not exported: {missing}"
    no_help = sorted(m for m in seen if m.startswith("rokka_") and not seen[m])
    assert not no_help, f"exported without a HELP text (document them in docs/metrics.md): {no_help}"
