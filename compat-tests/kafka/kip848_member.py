"""A librdkafka consumer speaking the KIP-848 protocol (group.protocol=consumer)
run as a child process, so a test can SIGKILL it. Prints its whole
assignment after every change and every message as JSON lines; leaves the
group cleanly on stdin EOF."""
import json
import sys
import threading

from confluent_kafka import Consumer

bootstrap, group, topic = sys.argv[1:4]
c = Consumer(
    {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "auto.offset.reset": "earliest",
        "auto.commit.interval.ms": 200,
    }
)
owned = set()


def on_assign(consumer, parts):
    owned.update(p.partition for p in parts)
    print(json.dumps({"assigned": sorted(owned)}), flush=True)


def on_revoke(consumer, parts):
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
print(json.dumps({"closed": True}), flush=True)
