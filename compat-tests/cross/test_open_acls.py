"""`allow_everyone_if_no_acl_found = true`: a resource no ACL names is open
to every user — but not the broker's own topics, which hold every topic's
delayed, timer and uncommitted transactional messages (reading them would
bypass the ACLs of the topics those messages are for). librdkafka, signed
in as a user no ACL names, reads an open topic and is refused the delay
levels' topic, where a RocketMQ client's delayed message waits."""
import json
import socket
import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from rokka_fixture import Rokka, results_dir
from test_acls import PASSWORDS, sasl  # the same users' SCRAM logins



def rmq_frame(code, opaque, ext, body=b""):
    header = json.dumps(
        {"code": code, "language": "JAVA", "version": 453, "opaque": opaque, "flag": 0, "extFields": ext}
    ).encode()
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        assert chunk, "closed"
        b += chunk
    return b


@pytest.fixture(scope="module")
def rokka():
    r = Rokka(
        results_dir("cross", "test_open_acls"),
        kafka_extra='sasl_listen = "127.0.0.1:0"\n',
        rocketmq_extra='[security]\nallow_everyone_if_no_acl_found = true\nsuper_users = ["User:admin"]\n',
    )
    r.start()
    try:
        plain = AdminClient({"bootstrap.servers": r.bootstrap})
        ups = [UserScramCredentialUpsertion(u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), p.encode())
               for u, p in PASSWORDS.items()]
        for f in plain.alter_user_scram_credentials(ups).values():
            f.result(15)
        # A RocketMQ producer's delayed message (level 9: five minutes):
        # it waits in SCHEDULE_TOPIC_XXXX.
        with socket.create_connection(("127.0.0.1", r.broker_port), timeout=10) as s:
            ext = {"producerGroup": "pg", "topic": "payroll", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
                   "queueId": "0", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
                   "properties": "DELAY\x019\x02UNIQ_KEY\x01AB01\x02"}
            s.sendall(rmq_frame(10, 1, ext, body=b"salary-of-bob"))
            n = struct.unpack(">i", recv_exact(s, 4))[0]
            frame = recv_exact(s, n)
            hlen = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
            assert json.loads(frame[4 : 4 + hlen])["code"] == 0
        r.restart_with_authorization()
        yield r
    finally:
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"


def read(conf, topic, partitions, n, timeout=15):
    """(values, error codes) of a consumer assigned `partitions` of `topic` from the start."""
    c = Consumer({**conf, "group.id": f"open-{topic}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in partitions])
    got, errs, deadline = [], [], time.time() + timeout
    while len(got) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            errs.append(m.error().code())
            if m.error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                break
            continue
        got.append(m.value())
    c.close()
    return got, errs


def test_an_open_table_does_not_open_the_brokers_own_topics(rokka):
    alice = sasl(rokka, "alice")
    # No ACL names anything: alice writes and reads a topic of her own.
    p = Producer({**alice, "message.timeout.ms": 10000})
    errors = []
    p.produce("open-topic", value=b"hello", partition=0, on_delivery=lambda e, _m: errors.append(e))
    p.flush(15)
    assert errors == [None], errors
    got, errs = read(alice, "open-topic", [0], 1)
    assert got == [b"hello"], errs
    # The delay levels' topic: the delayed record is never read (librdkafka
    # sees the topic as missing: Metadata does not show it to her).
    got, errs = read(alice, "SCHEDULE_TOPIC_XXXX", range(18), 1, timeout=10)
    assert b"salary-of-bob" not in got, "the delayed message was read before its time, past the ACLs"
    # Nor listed to her; the super user still sees it.
    assert "SCHEDULE_TOPIC_XXXX" not in Consumer({**alice, "group.id": "x"}).list_topics(timeout=10).topics
    assert "SCHEDULE_TOPIC_XXXX" in Consumer({**sasl(rokka, "admin"), "group.id": "x"}).list_topics(timeout=10).topics
