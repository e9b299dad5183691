"""A librdkafka consumer speaking the KIP-848 protocol (group.protocol=consumer)
run as a child process, so a test can SIGKILL it. Prints its whole
assignment after every change and every message as JSON lines; leaves the
group cleanly on stdin EOF. An optional fourth argument is its
group.instance.id (a static member); errors are printed as JSON lines too."""
import json
import sys
import threading

from confluent_kafka import Consumer

bootstrap, group, topic = sys.argv[1:4]


def on_error(e):
    print(json.dumps({"error": str(e), "code": e.code(), "fatal": e.fatal()}), flush=True)


conf = {
    "bootstrap.servers": bootstrap,
    "group.id": group,
    "group.protocol": "consumer",
    "auto.offset.reset": "earliest",
    "auto.commit.interval.ms": 200,
    "error_cb": on_error,
}
if len(sys.argv) > 4:
    conf["group.instance.id"] = sys.argv[4]
c = Consumer(conf)
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
    elif m is not None:
        on_error(m.error())
c.close()
print(json.dumps({"closed": True}), flush=True)
