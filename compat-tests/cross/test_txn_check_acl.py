"""Transaction checks under authorization. A check (CHECK_TRANSACTION_STATE)
carries the whole half message — an uncommitted body — to a live producer
of the message's producer group, and whoever answers it commits or rolls
it back. A HEART_BEAT naming a producer group needs no permission, so the
check goes only to a producer signed as a principal allowed to write the
message's topic: an anonymous client claiming the group gets nothing; the
real producer, signed, gets the check. A client id live on another
connection is not taken over by another principal."""
import base64
import hashlib
import hmac
import json
import socket
import struct
import time

import pytest

from realclients import run_harness
from rokka_fixture import Rokka, results_dir

CAROL = "carol-secret"
HEART_BEAT, SEND_MESSAGE, CHECK_TRANSACTION_STATE, NO_PERMISSION = 34, 10, 39, 16


@pytest.fixture(scope="module")
def rokka():
    r = Rokka(
        results_dir("cross", "test_txn_check_acl"),
        rocketmq_extra="transaction_check_interval_ms = 500\ntransaction_timeout_ms = 500\n"
        '[security]\nsuper_users = ["User:carol"]\n',
    )
    r.start()
    try:
        # carol's RocketMQ secret, made with authorization off.
        h = run_harness(r, "create-carol", "create-user", f"127.0.0.1:{r.broker_port}", "carol", CAROL)
        assert h.lines("created carol"), h.lines()
        r.restart_with_authorization()
        yield r
    finally:
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"


def signed(ext, body, user, secret):
    """AclClientRPCHook's signature: HMAC-SHA1 over the extFields values in key order, then the body."""
    ext = {**ext, "AccessKey": user}
    content = "".join(ext[k] for k in sorted(ext)).encode() + body
    return {**ext, "Signature": base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()}


class Conn:
    """One raw remoting connection: requests, and the frames the broker sends on its own."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.opaque = 0

    def send(self, code, ext, body=b""):
        self.opaque += 1
        header = json.dumps({"code": code, "language": "JAVA", "version": 453, "opaque": self.opaque, "flag": 0,
                             "extFields": ext}).encode()
        self.s.sendall(struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body)
        return self.opaque

    def frame(self, timeout):
        """(header, body) of the next frame, or None within `timeout`."""
        self.s.settimeout(timeout)
        try:
            n = struct.unpack(">i", self._exact(4))[0]
        except (socket.timeout, TimeoutError):
            return None
        self.s.settimeout(10)
        data = self._exact(n)
        hlen = struct.unpack(">i", data[:4])[0] & 0xFFFFFF
        return json.loads(data[4 : 4 + hlen]), data[4 + hlen:]

    def _exact(self, n):
        b = b""
        while len(b) < n:
            chunk = self.s.recv(n - len(b))
            assert chunk, "closed"
            b += chunk
        return b

    def call(self, code, ext, body=b""):
        opaque = self.send(code, ext, body)
        while True:
            f = self.frame(10)
            assert f is not None, "no answer"
            if f[0].get("opaque") == opaque and f[0].get("flag", 0) & 1:
                return f[0]

    def checks(self, within):
        """CHECK_TRANSACTION_STATE frames the broker sends within `within` seconds."""
        got, deadline = [], time.time() + within
        while time.time() < deadline:
            f = self.frame(max(0.05, deadline - time.time()))
            if f and f[0].get("code") == CHECK_TRANSACTION_STATE:
                got.append(f)
        return got

    def close(self):
        self.s.close()


def heartbeat(client_id, producer_group):
    return json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": producer_group}],
                       "consumerDataSet": []}).encode()


def test_checks_go_only_to_a_producer_allowed_to_write_the_topic(rokka):
    group, topic = "pg-secret", f"txn-acl-{int(time.time())}"
    mallory = Conn(rokka.broker_port)
    carol = Conn(rokka.broker_port)
    try:
        # Anonymous, unsigned: the heartbeat claiming carol's producer group is taken.
        assert mallory.call(HEART_BEAT, {}, heartbeat("mallory@1", group))["code"] == 0
        # carol's half message, never ended.
        ext = {"producerGroup": group, "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
               "queueId": "0", "sysFlag": "4", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
               "properties": f"TRAN_MSG\x01true\x02PGROUP\x01{group}\x02UNIQ_KEY\x01C0FFEE01\x02"}
        body = b"uncommitted-salary"
        h = carol.call(SEND_MESSAGE, signed(ext, body, "carol", CAROL), body)
        assert h["code"] == 0, h
        # Checks are due within a second or two; none reaches mallory.
        got = mallory.checks(6)
        assert not got, f"an anonymous client got the half message: {got}"
        # carol's own heartbeat, signed: the next check is hers.
        hb = heartbeat("carol@1", group)
        assert carol.call(HEART_BEAT, signed({}, hb, "carol", CAROL), hb)["code"] == 0
        got = carol.checks(10)
        assert got and body in got[0][1], f"the producer allowed to write the topic got no check: {got[:1]}"
        # mallory cannot take carol's client id while carol's connection lives.
        h = mallory.call(HEART_BEAT, {}, heartbeat("carol@1", group))
        assert h["code"] == NO_PERMISSION, h
    finally:
        mallory.close()
        carol.close()
