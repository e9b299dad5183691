"""Runs a Kafka client library's own integration tests against rokka.

    python run_suite.py kafka-python            # check the allow-list
    python run_suite.py kafka-python --update   # add newly passing tests

The suite's source comes from its PyPI sdist (pinned below). Every test in
`<suite>.allow` must pass — the list only grows; tests outside it may fail,
and why is written in FINDINGS.md."""
import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from conftest import Rokka  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

SUITES = {
    "kafka-python": {
        "sdist": "kafka-python==3.0.12",
        "dir": "kafka_python-3.0.12",
        "tests": "test/integration",
        # What the sdist lacks to run against an external broker.
        "shims": {
            "test/__init__.py": "",
            "test/service.py": (
                "class ExternalService:\n"
                "    def __init__(self, host, port):\n"
                "        self.host, self.port = host, port\n"
                "    def open(self): pass\n"
                "    def close(self): pass\n"
                "    def stop(self): pass\n"
                "class SpawnedService:\n"
                "    def __init__(self, *a, **k):\n"
                "        raise RuntimeError('KAFKA_URI must be set')\n"
            ),
        },
        "dirs": ["servers/4.0.0/kafka-bin"],
        "env": lambda r: {"KAFKA_URI": f"PLAINTEXT://{r.bootstrap}", "KAFKA_VERSION": "4.0.0"},
        # As Kafka's own test fixtures: a lower minimum session timeout and no
        # initial rebalance delay (the tests poll groups with short deadlines).
        "rokka": "[group]\nmin_session_timeout_ms = 1000\ninitial_rebalance_delay_ms = 0\n",
    },
}


def prepare(name, spec, work):
    src = os.path.join(work, spec["dir"])
    if not os.path.isdir(src):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", work, spec["sdist"]],
            check=True,
        )
        archive = next(f for f in os.listdir(work) if f.endswith(".tar.gz") and f.startswith(spec["dir"]))
        with tarfile.open(os.path.join(work, archive)) as t:
            t.extractall(work, filter="data")
    for path, text in spec["shims"].items():
        with open(os.path.join(src, path), "w") as f:
            f.write(text)
    for d in spec["dirs"]:
        os.makedirs(os.path.join(src, d), exist_ok=True)
    return src


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("--update", action="store_true", help="add newly passing tests to the allow-list")
    args = ap.parse_args()
    spec = SUITES[args.suite]
    work = os.path.join(ROOT, "target", "suites")
    os.makedirs(work, exist_ok=True)
    src = prepare(args.suite, spec, work)
    allow_path = os.path.join(HERE, f"{args.suite}.allow")
    allow = set()
    if os.path.exists(allow_path):
        allow = {l.strip() for l in open(allow_path) if l.strip() and not l.startswith("#")}

    with tempfile.TemporaryDirectory(prefix="rokka-suite-") as d:
        rokka = Rokka(d)
        with open(rokka.config, "a") as f:
            f.write(spec["rokka"])
        rokka.start()
        env = {**os.environ, **spec["env"](rokka)}

        def run(selection, report):
            subprocess.run(
                [sys.executable, "-m", "pytest", *selection, "-q", "-p", "no:cacheprovider", "--timeout", "60",
                 f"--junitxml={report}", "-o", "junit_family=xunit1"],
                cwd=src,
                env=env,
            )
            ok, bad = set(), set()
            for case in ET.parse(report).getroot().iter("testcase"):
                name = f"{case.get('classname')}::{case.get('name')}"
                if case.find("skipped") is not None:
                    continue
                (bad if case.find("failure") is not None or case.find("error") is not None else ok).add(name)
            return ok, bad

        passed, failed = run([spec["tests"]], os.path.join(d, "junit.xml"))
        # A third-party suite has its own races (kafka-python's bootstrap
        # Metadata request can race a subscribe and then sleep 5 minutes):
        # an allow-listed test that failed runs once more on its own, and a
        # pass then is reported as flaky, not as a regression.
        missing = sorted(allow - passed)
        if missing:
            ids = [f"{n.split('::')[0].replace('.', '/')}.py::{n.split('::', 1)[1]}" for n in missing]
            again, _ = run(ids, os.path.join(d, "rerun.xml"))
            for n in sorted(again & set(missing)):
                print(f"flaky (failed, then passed on its rerun): {n}")
            passed |= again
            failed -= again
        code = rokka.stop()
        rokka.log.close()
    regressions = sorted(allow - passed)
    new = sorted(passed - allow)
    print(f"{args.suite}: {len(passed)} passed, {len(failed)} failed; allow-list {len(allow)}")
    for n in regressions:
        print(f"REGRESSION (allow-listed, not passing): {n}")
    for n in new:
        print(f"newly passing (not yet allow-listed): {n}")
    if args.update and new:
        with open(allow_path, "w") as f:
            f.write(f"# {args.suite} integration tests that pass against rokka; this list only grows.\n")
            for n in sorted(allow | passed):
                f.write(n + "\n")
    if code != 0:
        print(f"rokka exited with {code}")
        return 1
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
