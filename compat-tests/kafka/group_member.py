"""A confluent-kafka group member run as a child process, so a test can
SIGKILL it. Prints its assignment as JSON lines on stdout; exits on stdin EOF.
Arguments: bootstrap, group, topic, and the session timeout (ms, 6000 if
not given)."""
import json
import sys
import threading

from confluent_kafka import Consumer

bootstrap, group, topic = sys.argv[1:4]
session_ms = int(sys.argv[4]) if len(sys.argv) > 4 else 6000
c = Consumer(
    {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "session.timeout.ms": session_ms,
        "heartbeat.interval.ms": 500,
        "auto.offset.reset": "earliest",
    }
)


def on_assign(consumer, parts):
    print(json.dumps({"assigned": sorted(p.partition for p in parts)}), flush=True)


c.subscribe([topic], on_assign=on_assign)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    m = c.poll(0.2)
    if m is not None and m.error() is None:
        print(json.dumps({"msg": m.value().decode(), "p": m.partition(), "o": m.offset()}), flush=True)
c.close()
