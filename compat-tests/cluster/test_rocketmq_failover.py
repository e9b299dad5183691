"""RocketMQ clients through failovers: the real client (rocketmq-client-rust,
through the harness) sends synchronously to the set (one attempt per
message, so an acknowledged message was stored by exactly one request)
while a push consumer group consumes, and the master is SIGKILLed three
times (ROKKA_FAILOVER_ROUNDS), the killed node coming back each time as a
replica.

Checked: every acknowledged message is in the log exactly once (read back
through the Kafka view of the same topic); every message the consumer was
served is still in the log (nothing served and later truncated); the group
was served every acknowledged message; and a new member of the group after
the last failover starts from the committed offsets the old masters held,
not from the beginning. The time from each kill to the first acknowledged
send on the new master is printed (docs/benchmarks.md): the client learns
of the new master when it next polls a name server (every 10 s here, the
client's minimum; 30 s by default)."""
import os
import subprocess
import threading
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from conftest import Cluster, read_topic

from rokka_fixture import HARNESS
# Each round costs about 25 s (the client polls its name servers every
# 10 s); three make every node a killed master that comes back as a
# replica once more rounds are asked for.
ROUNDS = int(os.environ.get("ROKKA_FAILOVER_ROUNDS", "3"))
TOPIC = "RmqFailover"
GROUP = "rmq-failover-cg"
QUEUES = 4  # the harness producer's default_topic_queue_nums


RUNNING = []


@pytest.fixture(scope="module")
def cluster():
    c = Cluster("rmq-failover")
    yield c
    for h in RUNNING:  # a failed test leaves no harness behind
        if h.proc.poll() is None:
            h.proc.kill()
            h.proc.wait(10)
    c.close()


class Harness:
    """One harness process whose `compat:` lines are collected with the
    time each arrived."""

    def __init__(self, namesrv, *args):
        env = dict(os.environ, ROKKA_RMQ_POLL_NAMESRV_MS="10000")
        self.proc = subprocess.Popen(
            [HARNESS, namesrv, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines = []  # (time, words)
        self.raw = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        RUNNING.append(self)

    def _read(self):
        for line in self.proc.stdout:
            self.raw.append(line)
            if line.startswith("compat: "):
                self.lines.append((time.time(), line[len("compat: ") :].split()))

    def wait(self, timeout):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise
        self.reader.join(10)
        return self.proc.returncode

    def words(self, first):
        return [(t, w) for t, w in list(self.lines) if w and w[0] == first]

    def tail(self):
        return "".join(self.raw[-40:])


def log_bodies(cluster):
    """Every message of TOPIC in the log, read through the Kafka view."""
    return read_topic(cluster.bootstrap(), TOPIC, QUEUES)


def committed(cluster):
    c = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": GROUP, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(TOPIC, q) for q in range(QUEUES)], timeout=10)
    finally:
        c.close()
    return {tp.partition: tp.offset for tp in got}


def test_kill_the_master_under_rocketmq_sync_sends(cluster):
    namesrv = ";".join(f"127.0.0.1:{n.namesrv_port}" for n in cluster.nodes.values())
    stop = os.path.join(cluster.dir, "rmq-stop")
    sender = Harness(namesrv, "dur-send", TOPIC, "f", "1000000", "400", "2", stop)
    consumer_stop = os.path.join(cluster.dir, "rmq-consumer-stop")
    consumer = Harness(namesrv, "dur-consume", TOPIC, GROUP, "400", "0", "0", consumer_stop)
    kills, first_ack = [], []
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(sender.words("acked")) < 50:
            time.sleep(0.2)
        assert len(sender.words("acked")) >= 50, sender.tail()
        assert cluster.wait_in_sync(timeout=60), "all three in sync before the first kill"
        for r in range(ROUNDS):
            time.sleep(2)
            master = cluster.master()
            kills.append(time.time())
            cluster.nodes[master].kill()
            cluster.master(timeout=30, exclude=(master,))
            # The first acknowledged send after the first failed one (an
            # answer read just after the kill may be from before it; with
            # no failure, one a second after the kill): the client has
            # polled a name server (10 s) and sent to the new master.
            def first_after():
                fails = [t for t, _ in sender.words("failed") if t > kills[-1]]
                since = min(fails) if fails else kills[-1] + 1.0
                return [t for t, _ in sender.words("acked") if t > since]

            deadline = time.time() + 40
            while time.time() < deadline and not first_after():
                time.sleep(0.1)
            after = first_after()
            assert after, f"round {r}: nothing acknowledged within 40 s of the kill\n{sender.tail()}"
            first_ack.append(round(min(after) - kills[-1], 2))
            cluster.nodes[master].start()
            assert cluster.wait_in_sync(timeout=60), f"round {r}: node {master} did not catch up"
        time.sleep(2)
    finally:
        open(stop, "w").close()
    assert sender.wait(60) == 0, sender.tail()
    with open(os.path.join(cluster.dir, "sender.log"), "w") as f:
        f.writelines(f"{t:.3f} {' '.join(w)}\n" for t, w in sender.lines)
        f.write("kills " + " ".join(f"{k:.3f}" for k in kills) + "\n")
    acked = {w[1] for _, w in sender.words("acked")}
    failed = len(sender.words("failed"))
    # The group catches up (its members are served up to the high
    # watermark), then stops and saves its offsets.
    deadline = time.time() + 60
    while time.time() < deadline and not acked <= {w[5] for _, w in consumer.words("got")}:
        time.sleep(0.5)
    open(consumer_stop, "w").close()  # a clean shutdown: the client saves its offsets
    assert consumer.wait(60) == 0, consumer.tail()
    served = {w[5] for _, w in consumer.words("got")}

    log = log_bodies(cluster)
    stored = set(log)
    import collections

    dups = sorted(b for b, n in collections.Counter(log).items() if n > 1 and b in acked)
    print(
        f"\nrocketmq failover: {ROUNDS} kills, {len(acked)} acked, {failed} failed; "
        f"kill -> first acknowledged send on the new master (s): {first_ack}"
    )
    assert not acked - stored, f"{len(acked - stored)} acknowledged messages lost, e.g. {sorted(acked - stored)[:5]}"
    assert not dups, f"acknowledged once, stored more than once: {dups[:10]}"
    gone = served - stored
    assert not gone, f"{len(gone)} messages served to the consumer and later gone, e.g. {sorted(gone)[:5]}"
    assert acked <= served, f"{len(acked - served)} acknowledged messages never served to the group"

    # A new member after the last failover starts from the offsets the
    # group committed: it is served at most what the old one had not yet
    # committed, not the whole topic again.
    offsets = committed(cluster)
    assert all(o >= 0 for o in offsets.values()), offsets
    again = Harness(namesrv, "dur-consume", TOPIC, GROUP, "20")
    assert again.wait(90) == 0, again.tail()
    redelivered = len(again.words("got"))
    assert redelivered <= max(100, len(stored) // 10), (
        f"{redelivered} of {len(stored)} served again: the group did not keep its place"
    )
