"""Synchronous OffsetCommit latency from confluent-kafka on a two-set
cluster: for each partition of a fresh 4-partition topic, 1000 commits of
that partition alone; partitions on the coordinator's set are committed
there, the others forwarded to their set's master (bench/cluster/sets.sh)."""
import statistics
import sys
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

brokers = sys.argv[1]
topic, group, n = f"lat{time.time_ns()}", "latency-group", 1000
a = AdminClient({"bootstrap.servers": brokers})
for f in a.create_topics([NewTopic(topic, 4, 1)]).values():
    f.result(15)
time.sleep(1)
leaders = {p: m.leader for p, m in a.list_topics(topic, timeout=10).topics[topic].partitions.items()}
c = Consumer({"bootstrap.servers": brokers, "group.id": group, "enable.auto.commit": False})
c.assign([TopicPartition(topic, p, 0) for p in leaders])
by_leader = {}
for p, leader in sorted(leaders.items()):
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        c.commit(offsets=[TopicPartition(topic, p, i + 1)], asynchronous=False)
        lat.append((time.perf_counter() - t0) * 1000)
    lat.sort()
    by_leader.setdefault(leader, []).extend(lat)
    print(f"partition {p} (leader {leader}): p50 {statistics.median(lat):.2f} ms, p99 {lat[int(n * 0.99)]:.2f} ms")
c.close()
for leader, lat in sorted(by_leader.items()):
    lat.sort()
    print(f"partitions led by {leader}: p50 {statistics.median(lat):.2f} ms, p99 {lat[int(len(lat) * 0.99)]:.2f} ms")
