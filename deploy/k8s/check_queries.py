#!/usr/bin/env python3
"""Fails when a dashboard or rule query names a metric that no scrape declares.

  check_queries.py [--dashboard FILE]... [--rules FILE]... [--external NAME]... SCRAPE...

Every PromQL expression of the Grafana dashboards (each panel's targets, rows' panels included,
and the templating variables' queries) and of the rule files (a PrometheusRule object, or a
Prometheus rule file: `groups:`) is reduced to the metric names it reads: string literals,
label matchers {...}, label lists of by/without/on/ignoring/group_left/group_right, range and
subquery brackets, offsets, Grafana variables ($x, ${x}, [$__rate_interval]), numbers,
keywords and functions (a name followed by "(") are dropped. A name is then known if
  - a `# TYPE NAME ...` line of one of the SCRAPE files (Prometheus text, as /metrics serves
    it) declares it; NAME_bucket, NAME_sum, NAME_count also when NAME is a histogram (and
    NAME_sum, NAME_count when a summary);
  - a recording rule of the rule files records it (its own expression is checked the same way);
  - it is one of the series no Ferry process exports but the queries may read (EXTERNAL below,
    plus --external NAME).
Anything else is reported, one line per name with where it is used; the exit status is then 1.
A scrape of an idle process lacks the families it never observed: scrape a stack that served
requests (deploy/k8s/README.md).
"""

import argparse
import json
import re
import sys

import yaml

# Series that Ferry's processes do not export, that the rules read on purpose.
EXTERNAL = {
    "up": "Prometheus: 1 when the target's last scrape worked",
    "kube_deployment_status_replicas_ready": "kube-state-metrics",
    "kube_deployment_spec_replicas": "kube-state-metrics",
}

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan", "atan2"}
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr):
    """The metric names a PromQL (or Grafana templating) expression reads."""
    e = STRING.sub('""', expr)
    # Grafana: label_values(SELECTOR, label) reads SELECTOR; label_values(label) reads nothing.
    e = re.sub(r"\blabel_values\s*\(\s*([^,()]*(?:\{[^}]*\})?)\s*,\s*[a-zA-Z_]\w*\s*\)",
               r"(\1)", e)
    e = re.sub(r"\blabel_values\s*\(\s*[a-zA-Z_]\w*\s*\)", "", e)
    e = re.sub(r"\$\{[^}]*\}|\$[a-zA-Z_]\w*", "", e)  # Grafana variables
    e = re.sub(r"\{[^{}]*\}", "", e)  # label matchers (strings are gone)
    e = LABEL_LIST.sub("", e)
    e = re.sub(r"\[[^\[\]]*\]", "", e)  # ranges, subqueries
    e = re.sub(r"\boffset\s+-?[0-9a-z]+", "", e)
    e = re.sub(r"@\s*[0-9.]+|@\s*(start|end)\s*\(\s*\)", "", e)
    e = re.sub(r"(?<![a-zA-Z0-9_:])[0-9][0-9a-zA-Z_.+]*", "", e)  # numbers (1e3, 0x1f, 5m)
    names = []
    for m in NAME.finditer(e):
        rest = e[m.end():].lstrip()
        if rest.startswith("("):  # a function or an aggregation
            continue
        if m.group(0).lower() in KEYWORDS:
            continue
        names.append(m.group(0))
    return names


def dashboard_queries(path):
    """(where, expr) of every query of a Grafana dashboard JSON."""
    with open(path, encoding="utf-8") as f:
        dash = json.load(f)
    out = []

    def panels(items):
        for p in items or []:
            yield p
            yield from panels(p.get("panels"))

    for p in panels(dash.get("panels")):
        for t in p.get("targets") or []:
            if t.get("expr"):
                out.append(("%s: panel %r %s" % (path, p.get("title"), t.get("refId", "")),
                            t["expr"]))
    for v in (dash.get("templating") or {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if q:
            out.append(("%s: variable %s" % (path, v.get("name")), q))
    return out


def rule_groups(path):
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    groups = []
    for d in docs:
        if d.get("kind") == "PrometheusRule":
            groups += d["spec"]["groups"]
        elif "groups" in d:
            groups += d["groups"]
        else:
            raise ValueError("%s: neither a PrometheusRule nor a rule file (groups:)" % path)
    return groups


def declared(scrape_paths):
    """{name: type} from the `# TYPE` lines of the scrapes."""
    types = {}
    for path in scrape_paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"#\s*TYPE\s+([a-zA-Z_:][a-zA-Z0-9_:]*)\s+(\w+)", line)
                if m:
                    types[m.group(1)] = m.group(2)
    return types


def known(name, types):
    if name in types:
        return True
    for suffix, kinds in (("_bucket", ("histogram",)), ("_sum", ("histogram", "summary")),
                          ("_count", ("histogram", "summary"))):
        if name.endswith(suffix) and types.get(name[:-len(suffix)]) in kinds:
            return True
    return False


def check(dashboards, rules, scrapes, external=()):
    """The problems, one line each ([] when every name is known)."""
    types = declared(scrapes)
    if not types:
        return ["no `# TYPE` line in %s" % ", ".join(scrapes)]
    queries, recorded = [], set()
    for path in dashboards:
        queries += dashboard_queries(path)
    for path in rules:
        for g in rule_groups(path):
            for r in g.get("rules", []):
                if "record" in r:
                    recorded.add(r["record"])
                what = "record %s" % r["record"] if "record" in r else "alert %s" % r.get("alert")
                queries.append(("%s: group %s, %s" % (path, g.get("name"), what), str(r["expr"])))
    allowed = set(EXTERNAL) | set(external) | recorded
    unknown = {}
    for where, expr in queries:
        for n in metric_names(expr):
            if n not in allowed and not known(n, types):
                unknown.setdefault(n, []).append(where)
    return ["%s: declared by no scrape (# TYPE), used in %s" % (n, "; ".join(w))
            for n, w in sorted(unknown.items())]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dashboard", action="append", default=[], help="Grafana dashboard JSON")
    p.add_argument("--rules", action="append", default=[],
                   help="PrometheusRule YAML or Prometheus rule file")
    p.add_argument("--external", action="append", default=[],
                   help="a series no scrape has that the queries may read")
    p.add_argument("scrapes", nargs="+", help="Prometheus text scrapes (/metrics pages)")
    a = p.parse_args(argv)
    if not a.dashboard and not a.rules:
        p.error("nothing to check: give --dashboard or --rules")
    problems = check(a.dashboard, a.rules, a.scrapes, a.external)
    for line in problems:
        print("check_queries: " + line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
