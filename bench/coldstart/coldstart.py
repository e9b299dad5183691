"""The first message to a fresh node against a warm one (issue 17).

Starts a rokka binary on a fresh data directory with the default store
settings (1 GiB segments, preallocation on, async flush), then sends single
RocketMQ messages over a raw remoting connection (no client library, so the
only process doing work is rokka) and reads rokka's CPU time (every thread,
/proc/<pid>/stat) and resident memory (/proc/<pid>/status) around each step:

  idle     a window with nothing sent (the node's own timers)
  first    the first message to the fresh store, then the same window
  warm     one more message, then the same window
  few      100 more messages one by one, then the same window

Usage: python3 coldstart.py ROKKA_BIN [ROKKA_BIN ...]   (one line per binary)
"""

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

WINDOW_S = 4.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) / 1024
    return out


def frame(code, opaque, ext, body=b""):
    header = json.dumps(
        {"code": code, "language": "JAVA", "version": 453, "opaque": opaque, "flag": 0, "extFields": ext}
    ).encode()
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


def read_frame(sock):
    def exact(n):
        b = b""
        while len(b) < n:
            c = sock.recv(n - len(b))
            if not c:
                raise ConnectionError("closed")
            b += c
        return b

    total, hlen = struct.unpack(">ii", exact(8))
    hlen &= 0xFFFFFF
    rest = exact(total - 4)
    return json.loads(rest[:hlen]), rest[hlen:]


class Sender:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.opaque = 0

    def send(self, topic, body):
        self.opaque += 1
        ext = {
            "producerGroup": "coldstart",
            "topic": topic,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4",
            "queueId": "0",
            "sysFlag": "0",
            "bornTimestamp": str(int(time.time() * 1000)),
            "flag": "0",
            "properties": "",
            "reconsumeTimes": "0",
            "unitMode": "false",
            "batch": "false",
        }
        self.sock.sendall(frame(10, self.opaque, ext, body))
        header, _ = read_frame(self.sock)
        if header.get("code") != 0:
            raise RuntimeError(f"send refused: {header}")


def measure(binary):
    work = tempfile.mkdtemp(prefix="rokka-coldstart-")
    try:
        config = os.path.join(work, "rokka.toml")
        ports_file = os.path.join(work, "ports.json")
        with open(config, "w") as f:
            f.write(
                f"""
[log]
level = "warn"
[metrics]
listen = "127.0.0.1:0"
[store]
data_dir = "{work}/data"
[kafka]
listen = "127.0.0.1:0"
[rocketmq]
namesrv_listen = "127.0.0.1:0"
broker_listen = "127.0.0.1:0"
"""
            )
        proc = subprocess.Popen(
            [binary, "--config", config, "--ports-file", ports_file],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "rokka.log"), "wb"),
        )
        try:
            deadline = time.time() + 30
            while not os.path.exists(ports_file) and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            with open(ports_file) as f:
                port = int(json.load(f)["broker"].rsplit(":", 1)[1])
            pid = proc.pid
            sender = Sender(port)
            time.sleep(1.0)
            rows = {}

            def step(name, action):
                c0 = cpu_seconds(pid)
                t0 = time.time()
                action()
                time.sleep(WINDOW_S)
                rows[name] = (cpu_seconds(pid) - c0, time.time() - t0, rss_mb(pid))

            rows["start"] = (cpu_seconds(pid), 0, rss_mb(pid))
            step("idle", lambda: None)
            step("first", lambda: sender.send("coldstart", b"hello"))
            step("warm", lambda: sender.send("coldstart", b"hello again"))
            step("few", lambda: [sender.send("coldstart", b"x" * 100) for _ in range(100)])
            return rows
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    for binary in sys.argv[1:]:
        rows = measure(binary)
        idle = rows["idle"][0]
        print(f"== {binary} (window {WINDOW_S:.0f} s; CPU over the window, RSS at its end)")
        for name, (cpu, _, rss) in rows.items():
            extra = "" if name in ("start", "idle") else f"  (-idle: {max(cpu - idle, 0) * 1000:.0f} ms)"
            print(
                f"  {name:<6} cpu {cpu * 1000:7.0f} ms{extra:<22} rss {rss['VmRSS']:7.1f} MB"
                f" (anon {rss['RssAnon']:.1f}, file {rss['RssFile']:.1f})"
            )


if __name__ == "__main__":
    main()
