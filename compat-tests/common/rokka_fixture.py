"""A rokka process on loopback ports it picks itself, for the Python compat suites.

rokka binds port 0 for every listener and writes the addresses it bound to a
ports file (`--ports-file`); no port is guessed ahead, so two picks cannot
collide and no other process can take a port between the pick and the bind.
A restart binds the same ports again, so clients keep their addresses.

Work directories live under the results directory (`ROKKA_RESULTS_DIR`,
default `target/compat-results`), which CI prints on failure: the broker's
log is kept, the data directory is removed once the fixture is done with it.
"""
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The RocketMQ client harness (compat-tests/rocketmq/harness), as the
# suites' run.sh build it: `cargo build --profile ci`.
HARNESS = os.environ.get(
    "ROKKA_RMQ_HARNESS",
    os.path.join(ROOT, "compat-tests", "rocketmq", "harness", "target", "ci", "rokka-rocketmq-compat"),
)


def harness(rokka, *args, timeout=150, env=None, check=True):
    """Runs one remoting harness scenario against `rokka` (with `env` added to
    its environment); its `compat:` lines."""
    p = subprocess.run(
        [HARNESS, f"127.0.0.1:{rokka.namesrv_port}", *[str(a) for a in args]],
        capture_output=True,
        timeout=timeout,
        text=True,
        env={**os.environ, **(env or {})},
    )
    lines = [l[len("compat: "):] for l in p.stdout.splitlines() if l.startswith("compat: ")]
    assert p.returncode == 0 or not check, f"harness {args} failed: {lines[-5:]} {p.stderr[-2000:]}"
    return lines


def rokka_bin():
    """The rokka binary the suites run (ROKKA_BIN, else the debug build)."""
    return os.environ.get("ROKKA_BIN", os.path.join(ROOT, "target", "debug", "rokka"))
RESULTS = os.environ.get("ROKKA_RESULTS_DIR", os.path.join(ROOT, "target", "compat-results"))
_seq = itertools.count()


@contextlib.contextmanager
def running(suite, name, **extras):
    """A started Rokka for a test module (its work directory under the
    suite's results); stopped after, and a non-zero exit fails the module."""
    r = Rokka(results_dir(suite, name), **extras)
    r.start()
    try:
        yield r
    finally:
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"


def results_dir(suite, name):
    """A fresh, kept directory for one broker's files: <results>/<suite>/<name>-<pid>-<n>."""
    d = os.path.join(RESULTS, suite, f"{re.sub(r'[^A-Za-z0-9_.-]', '-', name)}-{os.getpid()}-{next(_seq)}")
    os.makedirs(d, exist_ok=True)
    return d


def free_port():
    """A port for a client-side listener of a test's own (not for rokka)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LISTENERS = {
    # ports-file key: the config line that binds it
    "metrics": 'listen = "127.0.0.1:{}"  # metrics',
    "kafka": 'listen = "127.0.0.1:{}"  # kafka',
    # Only in configs that ask for it (kafka_extra).
    "kafka_ssl": 'ssl_listen = "127.0.0.1:{}"',
    "kafka_sasl": 'sasl_listen = "127.0.0.1:{}"',
    "namesrv": 'namesrv_listen = "127.0.0.1:{}"',
    "broker": 'broker_listen = "127.0.0.1:{}"',
    "replication": 'replication_listen = "127.0.0.1:{}"',
    "grpc": 'listen = "127.0.0.1:{}"  # grpc',
    "console": 'listen = "127.0.0.1:{}"  # console',
}


class Rokka:
    def __init__(
        self,
        workdir,
        metrics_extra="",
        store_extra="",
        kafka_extra="",
        # The store lines every suite shares (small segments, no
        # preparation ahead of the writer); "" runs the store's defaults.
        store_base="commitlog_segment_bytes = 67108864\npreallocate = false",
        rocketmq_extra="",
        group_extra="",
        broker_extra="",
        cluster_extra=None,
        grpc_extra=None,
        console_extra=None,
        nofile=None,
    ):
        self.workdir = workdir
        # An open-file limit (soft and hard) to start rokka under: rokka
        # raises its soft limit to the hard one, so both are set.
        self.nofile = nofile
        self.ports = {}
        self.config = os.path.join(workdir, "rokka.toml")
        self.ports_file = os.path.join(workdir, "ports.json")
        self.log_path = os.path.join(workdir, "rokka.log")
        line = {k: v.format(0) for k, v in LISTENERS.items()}
        # Only when asked: callers may append their own [group] table.
        group_section = f"[group]\n{group_extra}" if group_extra else ""
        broker_section = f"[broker]\n{broker_extra}" if broker_extra else ""
        # Cluster mode (compat-tests/cluster): its replication port is
        # picked and pinned like the others.
        cluster_section = (
            f"[cluster]\nenabled = true\n{LISTENERS['replication'].format(0)}\n{cluster_extra}"
            if cluster_extra is not None
            else ""
        )
        # The RocketMQ 5 gRPC listener (compat-tests/rocketmq5), when asked.
        grpc_section = (
            f"[grpc]\nenabled = true\n{line['grpc']}\n{grpc_extra}" if grpc_extra is not None else ""
        )
        # The web console, when asked.
        console_section = (
            f"[console]\nenabled = true\n{line['console']}\n{console_extra}" if console_extra is not None else ""
        )
        # The suites share the machine's disk with the build: how full it is
        # is not what they test (cross/test_retention.py sets its own
        # threshold; the store's fault tests cover the refusal), so the
        # disk-use guards are off unless a caller names them.
        disk_guards = "\n".join(
            f"{key} = 0"
            for key in ("disk_max_used_percent", "disk_refuse_writes_percent")
            if key not in store_extra and key not in store_base
        )
        with open(self.config, "w") as f:
            f.write(
                f"""
[log]
level = "info"
[metrics]
{line["metrics"]}
{metrics_extra}
[store]
data_dir = "{workdir}/data"
{store_base}
{disk_guards}
{store_extra}
[kafka]
{line["kafka"]}
{kafka_extra}
[rocketmq]
{line["namesrv"]}
{line["broker"]}
{rocketmq_extra}
{group_section}
{broker_section}
{cluster_section}
{grpc_section}
{console_section}
"""
            )
        self.proc = None
        self.log = open(self.log_path, "ab")

    def restart_with_authorization(self):
        """Stops, turns `security.authorization` on (after the config's
        `super_users` line, which the suite wrote) and starts again: users
        are made first with it off, as Kafka's SCRAM users are made before
        its authorizer has anyone to trust."""
        self.stop()
        with open(self.config) as f:
            text = f.read()
        assert "super_users = " in text, "the config names the super users"
        with open(self.config, "w") as f:
            f.write(text.replace("\nsuper_users = ", "\nauthorization = true\nsuper_users = ", 1))
        self.start()

    # The addresses of the last start (0 before the first).
    @property
    def kafka_port(self):
        return self.ports.get("kafka", 0)

    @property
    def ssl_port(self):
        return self.ports.get("kafka_ssl", 0)

    @property
    def sasl_port(self):
        return self.ports.get("kafka_sasl", 0)

    @property
    def metrics_port(self):
        return self.ports.get("metrics", 0)

    @property
    def namesrv_port(self):
        return self.ports.get("namesrv", 0)

    @property
    def broker_port(self):
        return self.ports.get("broker", 0)

    @property
    def grpc_port(self):
        return self.ports.get("grpc", 0)

    @property
    def console_port(self):
        return self.ports.get("console", 0)

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.kafka_port}"

    def _pin_ports(self):
        """After a first start, later starts bind the same ports again."""
        with open(self.config) as f:
            text = f.read()
        for key, port in self.ports.items():
            text = text.replace(LISTENERS[key].format(0), LISTENERS[key].format(port))
        with open(self.config, "w") as f:
            f.write(text)

    def start(self, timeout=30):
        if self.ports:
            self._pin_ports()
        if os.path.exists(self.ports_file):
            os.remove(self.ports_file)
        self.log.write(f"--- rokka start {time.strftime('%H:%M:%S')}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(
            [
                rokka_bin(),
                "--config",
                self.config,
                "--ports-file",
                self.ports_file,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=self._limit_files if self.nofile else None,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(self.ports_file):
                with open(self.ports_file) as f:
                    bound = json.load(f)
                self.ports = {k: int(v.rsplit(":", 1)[1]) for k, v in bound.items()}
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"rokka exited with {self.proc.returncode} at start; log: {self.log_path}")
            time.sleep(0.05)
        raise RuntimeError(f"rokka did not report its ports within {timeout} s; log: {self.log_path}")

    def _limit_files(self):
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

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

    def kill(self):
        """SIGKILL, as a crash: returns once the process is gone."""
        return self.stop(signal.SIGKILL)

    def restart(self):
        code = self.stop()
        assert code == 0, f"rokka exited with {code}; log: {self.log_path}"
        self.start()

    def close(self, keep_data=False):
        """Stops rokka (if running), closes the log, removes the data unless asked to keep it."""
        code = self.stop()
        self.log.close()
        if not keep_data:
            shutil.rmtree(os.path.join(self.workdir, "data"), ignore_errors=True)
        return code

    def metrics(self):
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric_values(self):
        """{'name{labels}': value} of every sample."""
        out = {}
        for line in self.metrics().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out
