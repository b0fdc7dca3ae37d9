"""The PrometheusRule's groups pass `promtool check rules` and `promtool test rules`.

The rendered cpu overlay's PrometheusRule (what a cluster gets) is written as a Prometheus rule
file, checked, and run against rules_test.yaml. The cases must cover the rules, or the test fails
(coverage_problems):
  - every alert has a case where it fires, and a healthy case: its input present and healthy,
    evaluated at or after the input's start plus the alert's `for` (and before the input ends),
    where it does not fire; a case before `for` has passed (pending) does not count, nor one on
    input the alert does not read;
  - every recording rule is evaluated by a promql_expr_test that names it and expects samples of
    it, on input it reads;
  - no case names an alert the rules lack.
test_coverage_check_catches_gaps shows each of these fail on rules_test.yaml with a case removed
or moved. promtool comes from the PATH (Debian's `prometheus` package).
"""

import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_render  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def promtool():
    path = shutil.which("promtool")
    if not path:
        raise AssertionError("promtool is not on the PATH "
                             "(Debian's prometheus package; ./ferry setup)")
    return path


def duration(text):
    """A Prometheus duration ("2m", "1h30m", "500ms") in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", str(text))
    if not parts or "".join(a + b for a, b in parts) != str(text):
        raise AssertionError("not a Prometheus duration: %r" % text)
    return sum(int(a) * units[b] for a, b in parts)


def sample_span(values):
    """(first, last) sample index with a value in promtool's expanding notation ("0+10x30",
    "1x5", "_x3 1 2", "stale"), or None if none has one. "a+bxN" and "axN" are N+1 samples;
    "_xN" is N missing ones."""
    index, first, last = 0, None, None
    for token in str(values).split():
        m = re.fullmatch(r"(.+?)x(\d+)", token)
        base, times = (m.group(1), int(m.group(2))) if m else (token, None)
        missing = base == "_" or base == "stale"
        count = 1 if times is None else (times if base == "_" else times + 1)
        if not missing:
            first = index if first is None else first
            last = index + count - 1
        index += count
    return None if first is None else (first, last)


def names_in(expr):
    """The identifiers of a PromQL expression, its quoted strings aside: metric and recorded
    series names among them."""
    return set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)))


def coverage_problems(groups, tests):
    """What rules_test.yaml (TESTS, every scalar a string: yaml.BaseLoader) leaves uncovered of
    the rule GROUPS, [] when nothing."""
    rules = [r for g in groups for r in g["rules"]]
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    records = {r["record"]: r["expr"] for r in rules if "record" in r}

    def reads(expr):
        """The series an expression reads, through the recording rules it names."""
        out, todo = set(), list(names_in(expr))
        while todo:
            name = todo.pop()
            if name not in out:
                out.add(name)
                todo += list(names_in(records.get(name, "")))
        return out

    default_interval = duration(tests.get("evaluation_interval", "1m"))
    fires, healthy, recorded, problems = set(), set(), set(), []
    for group in tests["tests"]:
        interval = duration(group.get("interval", default_interval))
        spans = {}  # series name -> (start, end) in seconds, of the group's input
        for s in group.get("input_series", []):
            span = sample_span(s["values"])
            if span is not None:
                name = s["series"].split("{")[0].strip()
                start, end = span[0] * interval, span[1] * interval
                old = spans.get(name, (start, end))
                spans[name] = (min(old[0], start), max(old[1], end))

        def input_of(expr):
            """(latest start, earliest end) of the group's series EXPR reads, or None."""
            read = [spans[n] for n in reads(expr) if n in spans]
            return (max(s for s, _ in read), min(e for _, e in read)) if read else None

        for case in group.get("alert_rule_test", []):
            name = case["alertname"]
            if name not in alerts:
                problems.append("a case for %s, which the rules lack" % name)
                continue
            span = input_of(alerts[name]["expr"])
            if span is None:
                continue  # input the alert does not read shows nothing
            if case.get("exp_alerts"):
                fires.add(name)
                continue
            at, hold = duration(case["eval_time"]), duration(alerts[name].get("for", "0s"))
            if span[0] + hold <= at <= span[1]:
                healthy.add(name)
        for case in group.get("promql_expr_test", []):
            samples = [s.get("labels", "") for s in case.get("exp_samples") or []]
            for name in names_in(case["expr"]) & set(records):
                if (input_of(records[name]) is not None and
                        any(re.match(re.escape(name) + r"(\{|$)", s) for s in samples)):
                    recorded.add(name)
    for name in sorted(set(alerts) - fires):
        problems.append("%s: no case where it fires" % name)
    for name in sorted(set(alerts) - healthy):
        problems.append("%s: no healthy case evaluated after its `for` (%s) where it does not "
                        "fire" % (name, alerts[name].get("for", "0s")))
    for name in sorted(set(records) - recorded):
        problems.append("%s: no promql_expr_test evaluates it" % name)
    return problems


class RulesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        rules = [o for o in k8s_render.render("cpu") if o["kind"] == "PrometheusRule"]
        assert len(rules) == 1, "one PrometheusRule expected, got %d" % len(rules)
        cls.groups = rules[0]["spec"]["groups"]
        cls.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        with open(os.path.join(cls.dir, "ferry-rules.yaml"), "w") as f:
            yaml.safe_dump({"groups": cls.groups}, f, sort_keys=False)
        shutil.copy(os.path.join(HERE, "rules_test.yaml"), cls.dir)
        # Every scalar a string, as promtool reads them: YAML 1.1 would make `values: 0x10` (ten
        # zeros) the integer 16.
        with open(os.path.join(HERE, "rules_test.yaml")) as f:
            cls.tests = yaml.load(f, Loader=yaml.BaseLoader)

    def promtool(self, *args):
        out = subprocess.run([promtool(), *args], cwd=self.dir, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, "promtool %s:\n%s%s" % (" ".join(args), out.stdout,
                                                                   out.stderr))

    def test_check_rules(self):
        self.promtool("check", "rules", "ferry-rules.yaml")

    def test_rules_tests(self):
        self.promtool("test", "rules", "rules_test.yaml")

    def test_cases_cover_every_rule(self):
        problems = coverage_problems(self.groups, self.tests)
        self.assertEqual(problems, [], "rules_test.yaml:\n" + "\n".join(problems))

    def test_coverage_check_catches_gaps(self):
        """coverage_problems on rules_test.yaml with a case removed or moved."""
        def cases(tests, kind):
            return [(g, c) for g in tests["tests"] for c in g.get(kind, [])]

        def healthy_cases(tests, alert):
            return [(g, c) for g, c in cases(tests, "alert_rule_test")
                    if c["alertname"] == alert and not c.get("exp_alerts")]

        def drop_healthy(tests):
            # FerryKVNearFull keeps its pending case (5m < its 10m `for`), which is not enough.
            for g, c in healthy_cases(tests, "FerryKVNearFull"):
                if duration(c["eval_time"]) >= 600:
                    g["alert_rule_test"].remove(c)

        def healthy_before_for(tests):
            for g, c in healthy_cases(tests, "FerryQueueWaitHigh"):
                c["eval_time"] = "9m"  # its `for` is 10m

        def healthy_after_input(tests):
            for g, c in healthy_cases(tests, "FerryKVStoreDown"):
                c["eval_time"] = "3h"  # the series ended: nothing can fire

        def healthy_on_other_input(tests):
            # The healthy cluster without the series the alert reads: quiet, and vacuously so.
            for g, c in healthy_cases(tests, "FerryRouterNoWorkers"):
                if duration(c["eval_time"]) >= 120:
                    g["input_series"] = [s for s in g["input_series"]
                                         if not s["series"].startswith("ferry_router_workers")]

        def drop_firing(tests):
            for g, c in cases(tests, "alert_rule_test"):
                if c["alertname"] == "FerryFailedRequests" and c.get("exp_alerts"):
                    g["alert_rule_test"].remove(c)

        def unknown_alert(tests):
            tests["tests"][0]["alert_rule_test"].append(
                {"eval_time": "5m", "alertname": "FerryNoSuchAlert", "exp_alerts": []})

        def drop_record_test(tests):
            for g, c in cases(tests, "promql_expr_test"):
                if "ferry:router_queue_depth:sum" in c["expr"]:
                    g["promql_expr_test"].remove(c)

        def record_without_samples(tests):
            for g, c in cases(tests, "promql_expr_test"):
                if "ferry:worker_queued_requests:sum" in c["expr"]:
                    c["exp_samples"] = []

        for mutate in (drop_healthy, healthy_before_for, healthy_after_input,
                       healthy_on_other_input, drop_firing, unknown_alert, drop_record_test,
                       record_without_samples):
            with self.subTest(gap=mutate.__name__):
                tests = copy.deepcopy(self.tests)
                mutate(tests)
                self.assertNotEqual(coverage_problems(self.groups, tests), [],
                                    "%s went unnoticed" % mutate.__name__)


if __name__ == "__main__":
    unittest.main()
