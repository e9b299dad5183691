"""A rokka process on free loopback ports, for the Python compat suites."""
import os
import signal
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rokka:
    def __init__(self, workdir, metrics_extra=""):
        self.workdir = workdir
        self.kafka_port = free_port()
        self.metrics_port = free_port()
        self.namesrv_port = free_port()
        self.broker_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.kafka_port}"
        self.config = os.path.join(workdir, "rokka.toml")
        with open(self.config, "w") as f:
            f.write(
                f"""
[log]
level = "info"
[metrics]
listen = "127.0.0.1:{self.metrics_port}"
{metrics_extra}
[store]
data_dir = "{workdir}/data"
commitlog_segment_bytes = 67108864
preallocate = false
[kafka]
listen = "127.0.0.1:{self.kafka_port}"
[rocketmq]
namesrv_listen = "127.0.0.1:{self.namesrv_port}"
broker_listen = "127.0.0.1:{self.broker_port}"
"""
            )
        self.proc = None
        self.log = open(os.path.join(workdir, "rokka.log"), "ab")

    def start(self):
        self.proc = subprocess.Popen(
            [os.environ.get("ROKKA_BIN", "../../target/debug/rokka"), "--config", self.config],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.kafka_port), timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"rokka exited with {self.proc.returncode}")
                time.sleep(0.1)
        raise RuntimeError("rokka did not start listening")

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode if self.proc else None
        self.proc = None
        return code

    def restart(self):
        assert self.stop() == 0
        self.start()

    def metrics(self):
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()
