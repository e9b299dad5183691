"""A Telemetry stream whose client sends settings and never reads the
broker's replies: once the replies back up, the stream is closed after the
idle timeout (counted), its slot freed — not held until the connection goes."""
import os
import sys
import threading
import time

import grpc
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from rokka_fixture import running  # noqa: E402


@pytest.fixture(scope="module")
def rokka(request):
    with running("rocketmq5", request.module.__name__, grpc_extra="idle_timeout_ms = 2000\n") as r:
        yield r


def metric(rokka, name):
    return sum(v for k, v in rokka.metric_values().items() if k == name or k.startswith(name + "{"))


def test_a_stream_whose_replies_are_never_read_is_closed(rokka):
    from rocketmq.grpc_protocol import definition_pb2, service_pb2

    def settings():
        cmd = service_pb2.TelemetryCommand()
        cmd.settings.client_type = definition_pb2.PRODUCER
        cmd.settings.publishing.topics.add().name = "t5-unread-" + "x" * 200
        # Enough replies to fill the stream's buffer and HTTP/2's windows.
        for _ in range(20000):
            yield cmd.SerializeToString()

    ch = grpc.insecure_channel(f"127.0.0.1:{rokka.grpc_port}")
    call = ch.stream_stream(
        "/apache.rocketmq.v2.MessagingService/Telemetry", request_serializer=None, response_deserializer=None
    )
    responses = call(settings(), metadata=(("x-mq-client-id", "unread-client"),))
    # Never read `responses`: wait for the broker to give up on it.
    deadline = time.time() + 60
    while metric(rokka, "rokka_rocketmq5_telemetry_unread_closed_total") < 1 and time.time() < deadline:
        time.sleep(0.5)
    assert metric(rokka, "rokka_rocketmq5_telemetry_unread_closed_total") == 1
    deadline = time.time() + 10
    while metric(rokka, "rokka_rocketmq5_telemetry_streams") > 0 and time.time() < deadline:
        time.sleep(0.2)
    assert metric(rokka, "rokka_rocketmq5_telemetry_streams") == 0, "the slot was not freed"
    responses.cancel()
    ch.close()
