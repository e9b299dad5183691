"""Pop consumption across a broker restart: acked messages are not
delivered again; every unacked one is (RocketMQ 5 Python client)."""
import time
import uuid

from conftest import receive_all
from test_grpc import Clients, message


def test_a_restart_in_the_middle_of_pop_consumption_keeps_acks(rokka):
    topic, group = f"g5-restart-{uuid.uuid4().hex[:8]}", f"g5-restart-g-{uuid.uuid4().hex[:8]}"
    clients = Clients(rokka)
    try:
        p = clients.producer(topic)
        sent = [f"m-{i}".encode() for i in range(30)]
        for b in sent:
            p.send(message(topic, b))
        c = clients.consumer(group, topic)
        handed = []
        deadline = time.time() + 20
        while len(handed) < 12 and time.time() < deadline:
            handed += c.receive(12 - len(handed), 3)
        assert len(handed) == 12
        # Every other one acked: the committed offset stays at the first
        # unacked, so only the pop state knows what above it was acked.
        acked = {m.body for m in handed[1::2]}
        for m in handed[1::2]:
            c.ack(m)
    finally:
        clients.close()
    rokka.restart()
    clients = Clients(rokka)
    try:
        c = clients.consumer(group, topic)
        got = receive_all(c, 30 - len(acked), invisible=30, timeout=30)
        time.sleep(3.5)
        got += receive_all(c, 1, invisible=30, timeout=3)
    finally:
        clients.close()
    bodies = [m.body for m in got]
    assert not acked & set(bodies), f"acked before the restart, delivered again: {sorted(acked & set(bodies))}"
    assert sorted(bodies) == sorted(set(sent) - acked), "every unacked message, once"
    unacked_before = {m.body for m in handed[0::2]}
    assert all(m.delivery_attempt == 2 for m in got if m.body in unacked_before), "handed out before: attempt 2"


def test_sigterm_stops_rokka_promptly_with_a_client_still_connected(rokka):
    """A live client's Telemetry stream held the gRPC listener's graceful
    shutdown open until the stream went idle (grpc.idle_timeout_ms, ten
    minutes): SIGTERM did not stop rokka, and a supervisor's SIGKILL then
    left the store to recover as after a crash. Connections now get a
    short grace; the store closes cleanly (exit 0)."""
    topic = f"g5-term-{uuid.uuid4().hex[:8]}"
    clients = Clients(rokka)
    try:
        p = clients.producer(topic)
        p.send(message(topic, b"before the stop"))
        started = time.time()
        code = rokka.stop()
        took = time.time() - started
    finally:
        clients.close()
    assert code == 0, f"rokka exited with {code} after {took:.1f} s; log: {rokka.log_path}"
    assert took < 15, f"SIGTERM took {took:.1f} s"
    rokka.start()
