"""The PrometheusRule's groups pass `promtool check rules` and `promtool test rules`.

The rendered cpu overlay's PrometheusRule (what a cluster gets) is written as a Prometheus rule
file, checked, and run against rules_test.yaml: series that must fire each alert, and series
that must not. An alert of the rules without both kinds of case in rules_test.yaml fails, and so
does a case for an alert the rules do not have. promtool comes from the PATH (Debian's
`prometheus` package).
"""

import os
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

    def promtool(self, *args):
        out = subprocess.run([promtool(), *args], cwd=self.dir, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, "promtool %s:\n%s%s" % (" ".join(args), out.stdout,
                                                                   out.stderr))

    def test_check_rules(self):
        self.promtool("check", "rules", "ferry-rules.yaml")

    def test_rules_tests(self):
        self.promtool("test", "rules", "rules_test.yaml")

    def test_every_alert_fires_and_holds(self):
        alerts = {r["alert"] for g in self.groups for r in g["rules"] if "alert" in r}
        with open(os.path.join(HERE, "rules_test.yaml")) as f:
            cases = [c for t in yaml.safe_load(f)["tests"] for c in t.get("alert_rule_test", [])]
        fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
        holds = {c["alertname"] for c in cases if not c.get("exp_alerts")}
        self.assertEqual(alerts - fires, set(), "alerts never shown firing")
        self.assertEqual(alerts - holds, set(), "alerts never shown not firing")
        self.assertEqual((fires | holds) - alerts, set(), "cases for alerts the rules lack")


if __name__ == "__main__":
    unittest.main()
