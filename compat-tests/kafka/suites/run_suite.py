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
from pki import make_pki  # noqa: E402

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
        '[security]\nauthorization = true\nsuper_users = ["User:ANONYMOUS", "User:alice"]\n',
        # The tests that start a broker of their own (SASL_PLAINTEXT with
        # PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; SSL) run in a second pass
        # without KAFKA_URI, their broker fixture pointed at rokka's SASL
        # and SSL listeners by a plugin (kafka_python_rokka.py); the user is
        # the fixture's own (KafkaFixture.broker_user), made over the
        # plaintext listener as the fixture adds it before its broker starts.
        "own_broker_tests": ["test/integration/test_sasl_integration.py", "test/integration/test_ssl_integration.py"],
        "plugin": ("kafka_python_rokka.py", "test/rokka_external.py", "test.rokka_external"),
        "kafka_extra": lambda pki: (
            'sasl_listen = "127.0.0.1:0"\nsasl_mechanisms = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]\n'
            f'ssl_listen = "127.0.0.1:0"\nssl_certificate = "{pki["server.pem"]}"\nssl_key = "{pki["server.key"]}"\n'
        ),
        "users": {"alice": "alice-secret"},
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
    if "plugin" in spec:
        source, dest, _ = spec["plugin"]
        shutil.copyfile(os.path.join(HERE, source), os.path.join(src, dest))
    return src


def add_users(bootstrap, users):
    """SCRAM-SHA-256 and -512 credentials for each user (PLAIN checks the
    password against them), made over the plaintext listener."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = AdminClient({"bootstrap.servers": bootstrap})
    ups = [UserScramCredentialUpsertion(u, ScramCredentialInfo(m, 4096), p.encode())
           for u, p in users.items() for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(15)


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


def path_id(name, src):
    """`test.integration.mod::case` as pytest selects it: `test/integration/mod.py::case`;
    `test.integration.mod.Class::case` as `test/integration/mod.py::Class::case`."""
    dotted, case = name.split("::", 1)
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        module = "/".join(parts[:n]) + ".py"
        if os.path.exists(os.path.join(src, module)):
            return "::".join([module, *parts[n:], case])
    return f"{dotted.replace('.', '/')}.py::{case}"


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
    kafka_extra = ""
    if "kafka_extra" in spec:
        os.makedirs(os.path.join(d, "pki"))
        pki = make_pki(os.path.join(d, "pki"))
        kafka_extra = spec["kafka_extra"](pki)
        ssl_dir = os.path.join(d, "ssl")
        os.makedirs(ssl_dir)
        shutil.copyfile(pki["ca.pem"], os.path.join(ssl_dir, "ca-cert"))
    rokka = Rokka(d, kafka_extra=kafka_extra)
    with open(rokka.config, "a") as f:
        f.write(spec["rokka"])
    rokka.start()
    try:
        env = {**os.environ, **spec["env"](rokka)}
        if spec.get("users"):
            add_users(rokka.bootstrap, spec["users"])

        def run(selection, report, env=env, extra=()):
            subprocess.run(
                [sys.executable, "-m", "pytest", *selection, "-q", "-p", "no:cacheprovider", "--timeout", "60", "--timeout-method", "signal",
                 f"--junitxml={report}", "-o", "junit_family=xunit1", *extra],
                cwd=src,
                env=env,
            )
            return outcomes(report)

        own_files = spec.get("own_broker_tests", [])

        def own_broker(n):
            return any(n.split("::", 1)[0] == m or n.startswith(m + ".") for m in (t[:-3].replace("/", ".") for t in own_files))

        # Their broker is rokka too, reached through the plugin; without
        # KAFKA_URI they do not skip themselves.
        own = {k: v for k, v in env.items() if k != "KAFKA_URI"}
        if own_files:
            own.update({
                "ROKKA_PLAINTEXT": rokka.bootstrap,
                "ROKKA_SASL_PLAINTEXT": f"127.0.0.1:{rokka.sasl_port}",
                "ROKKA_SSL": f"127.0.0.1:{rokka.ssl_port}",
                "ROKKA_SSL_DIR": ssl_dir,
                "ROKKA_LOG": log_path,
            })
        own_extra = ("-p", spec["plugin"][2]) if own_files else ()

        first = run([spec["tests"]], os.path.join(d, "junit.xml"))
        if own_files:
            # The first pass collected them too (skipped there).
            first = {n: o for n, o in first.items() if not own_broker(n)}
            first.update(run(own_files, os.path.join(d, "junit-own-broker.xml"), env=own, extra=own_extra))
        result = dict(first)
        # A flaky-listed test that failed runs once more on its own (see
        # FINDINGS.md for why each is listed); any other failure stands.
        failed_allowed = sorted(n for n in allow if first.get(n, ("missing", ""))[0] != "passed")
        candidates = [n for n in failed_allowed if n in flaky]
        rerun, over_cap = candidates[:MAX_RERUNS], candidates[MAX_RERUNS:]
        again = {}
        for own_pass, report in ((False, "rerun.xml"), (True, "rerun-own-broker.xml")):
            ids = [path_id(n, src) for n in rerun if own_broker(n) == own_pass]
            if ids:
                again.update(run(ids, os.path.join(d, report), env=own if own_pass else env, extra=own_extra if own_pass else ()))
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
