"""The RocketMQ C++-core client (PyPI `rocketmq` 0.4.4, librocketmq bundled)
against rokka: a producer fills a topic, then a push consumer of a new group
starts with the default CONSUME_FROM_LAST_OFFSET. As against Apache
RocketMQ, the new group reads the young topic from the start (the broker
answers QUERY_CONSUMER_OFFSET with 0 while the queue still starts at 0 and
its first message is in memory), then gets what is sent while it runs.
Usage: cpp_client.py NAMESRV_ADDR. Exit 0 on success."""
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer

addr = sys.argv[1]
topic = "CppTopic"
before, after = 40, 20

p = Producer("cpp-producer-group")
p.set_namesrv_addr(addr)
p.start()
sent = []
for i in range(before):
    m = Message(topic)
    m.set_keys(f"k{i}")
    m.set_tags("TagA")
    m.set_body(f"before-{i}")
    r = p.send_sync(m)
    assert int(r.status) == 0, r
    sent.append(f"before-{i}")
print(f"compat: sent {before} before the group existed")

got = []
lock = threading.Lock()


def on_message(msg):
    with lock:
        got.append(msg.body.decode())


c = PushConsumer("cpp-new-group")
c.set_namesrv_addr(addr)
c.subscribe(topic, on_message)
c.start()
deadline = time.time() + 60
while time.time() < deadline:
    with lock:
        if len(set(got)) >= before:
            break
    time.sleep(0.2)
with lock:
    first = sorted(set(got))
if first != sorted(sent):
    print(f"compat: FAILED the new group read {len(first)} of the {before} earlier messages", flush=True)
    c.shutdown()
    p.shutdown()
    sys.exit(1)
for i in range(after):
    m = Message(topic)
    m.set_body(f"after-{i}")
    r = p.send_sync(m)
    assert int(r.status) == 0, r
    sent.append(f"after-{i}")
deadline = time.time() + 60
while time.time() < deadline:
    with lock:
        if len(set(got)) >= before + after:
            break
    time.sleep(0.2)
c.shutdown()
p.shutdown()
with lock:
    dups = len(got) - len(set(got))
    ok = sorted(set(got)) == sorted(sent)
print(f"compat: the new group read {len(set(got))} of {len(sent)} ({dups} redelivered)", flush=True)
sys.exit(0 if ok else 1)
