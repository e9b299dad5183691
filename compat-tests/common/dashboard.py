"""The metric names the Grafana dashboard (config/grafana/rokka.json) and the
Prometheus alert rules (config/prometheus/rokka-alerts.yml) use, for tests
that check a live node exports each of them."""
import json
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DASHBOARD = os.path.join(ROOT, "config", "grafana", "rokka.json")
ALERTS = os.path.join(ROOT, "config", "prometheus", "rokka-alerts.yml")
NAME = re.compile(r"\brokka_[a-z0-9_]+")


def _base(name):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def expressions():
    """(where, PromQL) of every dashboard target and alert rule."""
    with open(DASHBOARD) as f:
        dash = json.load(f)
    row = ""
    out = []
    for p in dash["panels"]:
        if p["type"] == "row":
            row = p["title"]
            continue
        for t in p.get("targets", []):
            out.append((f"{row} / {p['title']}", t["expr"]))
    with open(ALERTS) as f:
        alert = ""
        for line in f:
            m = re.match(r"\s*- alert: (\S+)", line)
            if m:
                alert = m.group(1)
            m = re.match(r"\s*expr: (.+)", line)
            if m:
                out.append((f"alert {alert}", m.group(1)))
    return out


# Dashboard rows whose metrics only a node in that mode exports; their
# names are checked by that mode's suite.
MODES = ("Cluster", "Security")


def metric_names(mode=None):
    """{metric family: where it is used} of the dashboard row `mode` (one of
    MODES: cluster mode and its replica-lag alert, security on), or of the
    rest if None."""
    names = {}
    for where, expr in expressions():
        for n in NAME.findall(expr):
            n = _base(n)
            row = where.split(" / ")[0]
            if n.startswith(("rokka_cluster_", "rokka_replication_")):
                row = "Cluster"
            if row == mode or (mode is None and row not in MODES):
                names.setdefault(n, where)
    return names


def families(metrics_text):
    """{family: has HELP} of a /metrics scrape."""
    helps = set(re.findall(r"^# HELP (\S+)", metrics_text, re.M))
    return {t: t in helps for t in re.findall(r"^# TYPE (\S+)", metrics_text, re.M)}
