"""Runs a Kafka client library's own integration tests against rokka.

    python run_suite.py kafka-python            # check the allow-list
    python run_suite.py kafka-python --update   # add newly passing tests

The suite's source comes from its PyPI sdist (pinned below). Every test in
`<suite>.allow` must pass — the list only grows; tests outside it may fail,
and why is written in FINDINGS.md.

An allow-listed test that fails is a regression at once, unless it is in
`<suite>.flaky` (`<test id>  # <reason>`, each named in FINDINGS.md with the
evidence): those run once more on their own, at most MAX_RERUNS of them per
run, and pass only if the rerun passes. Every rerun is written to
`$ROKKA_RESULTS_DIR/<suite>-reruns.txt`; the broker's work directory (its
log, the JUnit reports) is kept under `$ROKKA_RESULTS_DIR/<suite>/`
(default results directory: target/compat-results), which CI prints."""
import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from conftest import Rokka  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
RESULTS = os.environ.get("ROKKA_RESULTS_DIR", os.path.join(ROOT, "target", "compat-results"))
FINDINGS = os.path.join(HERE, "..", "FINDINGS.md")
# Reruns of flaky-listed tests in one run of a suite (each test once at most).
MAX_RERUNS = 3

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
        # As kafka-python's own test broker (test/integration/fixtures.py):
        # four partitions per auto-created topic (num.partitions), a lower
        # minimum session timeout and no initial rebalance delay (the tests
        # poll groups with short deadlines). Rokka keeps Kafka's defaults.
        # Authorization on (test_create_describe_delete_acls needs an
        # authorizer), the suite's anonymous clients super users.
        "rokka": "[group]\nmin_session_timeout_ms = 1000\ninitial_rebalance_delay_ms = 0\n[broker]\ndefault_partitions = 4\n"
        '[security]\nauthorization = true\nsuper_users = ["User:ANONYMOUS"]\n',
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


def read_list(path):
    """Test ids of an allow-list, one a line; `#` starts a comment."""
    if not os.path.exists(path):
        return set()
    return {l.strip() for l in open(path) if l.strip() and not l.startswith("#")}


def read_flaky(path, allow):
    """{test id: reason} from `<suite>.flaky`; every entry is allow-listed, has
    a reason, and is named in FINDINGS.md."""
    flaky = {}
    if not os.path.exists(path):
        return flaky
    findings = open(FINDINGS).read()
    for n, line in enumerate(open(path), 1):
        if not line.strip() or line.startswith("#"):
            continue
        test, _, reason = line.partition("#")
        test, reason = test.strip(), reason.strip()
        where = f"{os.path.basename(path)}:{n}"
        if not reason:
            raise SystemExit(f"{where}: `{test}` has no reason (`<test id>  # <reason>, see FINDINGS.md`)")
        if test not in allow:
            raise SystemExit(f"{where}: `{test}` is not allow-listed")
        if f"`{test.split('::', 1)[1]}`" not in findings:
            raise SystemExit(f"{where}: `{test}` is not named in FINDINGS.md")
        flaky[test] = reason
    return flaky


def outcomes(report):
    """{test id: (outcome, message)} from a JUnit report; outcome is passed,
    failed, error or skipped."""
    out = {}
    if not os.path.exists(report):
        return out
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        for kind, outcome in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            el = case.find(kind)
            if el is not None:
                msg = " ".join((el.get("message") or el.text or "").split())
                out[name] = (outcome, msg[:300])
                break
        else:
            out[name] = ("passed", "")
    return out


def path_id(name):
    """`test.integration.mod::case` as pytest selects it: `test/integration/mod.py::case`."""
    mod, case = name.split("::", 1)
    return f"{mod.replace('.', '/')}.py::{case}"


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
    allow = read_list(allow_path)
    flaky = read_flaky(os.path.join(HERE, f"{args.suite}.flaky"), allow)

    # The broker's work directory is kept: its log is what explains a failure.
    d = os.path.join(RESULTS, args.suite, f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    os.makedirs(d)
    reruns_path = os.path.join(RESULTS, f"{args.suite}-reruns.txt")
    log_path = os.path.join(d, "rokka.log")
    rokka = Rokka(d)
    with open(rokka.config, "a") as f:
        f.write(spec["rokka"])
    rokka.start()
    try:
        env = {**os.environ, **spec["env"](rokka)}

        def run(selection, report):
            subprocess.run(
                [sys.executable, "-m", "pytest", *selection, "-q", "-p", "no:cacheprovider", "--timeout", "60", "--timeout-method", "signal",
                 f"--junitxml={report}", "-o", "junit_family=xunit1"],
                cwd=src,
                env=env,
            )
            return outcomes(report)

        first = run([spec["tests"]], os.path.join(d, "junit.xml"))
        result = dict(first)
        # A flaky-listed test that failed runs once more on its own (see
        # FINDINGS.md for why each is listed); any other failure stands.
        failed_allowed = sorted(n for n in allow if first.get(n, ("missing", ""))[0] != "passed")
        candidates = [n for n in failed_allowed if n in flaky]
        rerun, over_cap = candidates[:MAX_RERUNS], candidates[MAX_RERUNS:]
        again = run([path_id(n) for n in rerun], os.path.join(d, "rerun.xml")) if rerun else {}
        with open(reruns_path, "w") as f:
            f.write(f"# {args.suite} reruns of flaky-listed tests, {time.strftime('%Y-%m-%d %H:%M:%S')}; broker log: {log_path}\n")
            f.write("# test\tfirst outcome\trerun outcome\treason it may be rerun\n")
            for n in rerun:
                o1, m1 = first.get(n, ("missing", "not in the report"))
                o2, m2 = again.get(n, ("missing", "not in the rerun's report"))
                result[n] = (o2, m2)
                line = f"{n}\t{o1}: {m1}\t{o2}{': ' + m2 if m2 else ''}\t{flaky[n]}"
                f.write(line + "\n")
                print(f"RERUN {line}")
            for n in over_cap:
                f.write(f"{n}\t{first.get(n, ('missing', ''))[0]}\tnot rerun: at most {MAX_RERUNS} reruns per run\t{flaky[n]}\n")
    finally:
        code = rokka.stop()
        rokka.log.close()
        shutil.rmtree(os.path.join(d, "data"), ignore_errors=True)

    passed = {n for n, (o, _) in result.items() if o == "passed"}
    failed = {n for n, (o, _) in result.items() if o in ("failed", "error")}
    regressions = sorted(allow - passed)
    new = sorted(passed - allow)
    print(f"{args.suite}: {len(passed)} passed, {len(failed)} failed; allow-list {len(allow)}, "
          f"{len(rerun)} rerun{'s' if len(rerun) != 1 else ''} ({reruns_path})")
    for n in regressions:
        why = result.get(n, ("missing", "not in the report"))
        how = ", also on its rerun" if n in rerun else f", not rerun: at most {MAX_RERUNS} reruns per run" if n in over_cap else ""
        print(f"REGRESSION (allow-listed, not passing{how}): {n}: {why[0]} {why[1]}")
    for n in new:
        print(f"newly passing (not yet allow-listed): {n}")
    if regressions or rerun or code != 0:
        print(f"broker log: {log_path}")
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
