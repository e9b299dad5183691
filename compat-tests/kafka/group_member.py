"""A confluent-kafka group member run as a child process, so a test can
SIGKILL it. Prints its assignment as JSON lines on stdout; exits on stdin EOF.
Arguments: bootstrap, group, topic, and the session timeout (ms, 6000 if
not given); then optionally a group.instance.id (a static member; "" for
none) and a partition.assignment.strategy — with one, the whole assignment
is printed after every assignment and revocation (a cooperative assignor's
callbacks carry only what changed)."""
import json
import sys
import threading

from confluent_kafka import Consumer

bootstrap, group, topic = sys.argv[1:4]
session_ms = int(sys.argv[4]) if len(sys.argv) > 4 else 6000
instance = sys.argv[5] if len(sys.argv) > 5 else ""
assignor = sys.argv[6] if len(sys.argv) > 6 else ""
conf = {
    "bootstrap.servers": bootstrap,
    "group.id": group,
    "session.timeout.ms": session_ms,
    "heartbeat.interval.ms": 500,
    "auto.offset.reset": "earliest",
}
if instance:
    conf["group.instance.id"] = instance
if assignor:
    conf["partition.assignment.strategy"] = assignor
c = Consumer(conf)
owned = set()


def on_assign(consumer, parts):
    if assignor:
        owned.update(p.partition for p in parts)
        print(json.dumps({"assigned": sorted(owned)}), flush=True)
    else:
        print(json.dumps({"assigned": sorted(p.partition for p in parts)}), flush=True)


def on_revoke(consumer, parts):
    if assignor:
        owned.difference_update(p.partition for p in parts)
        print(json.dumps({"assigned": sorted(owned)}), flush=True)


c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    m = c.poll(0.2)
    if m is not None and m.error() is None:
        print(json.dumps({"msg": m.value().decode(), "p": m.partition(), "o": m.offset()}), flush=True)
c.close()
