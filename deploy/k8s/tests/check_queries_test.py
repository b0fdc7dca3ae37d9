"""check_queries.py on a small fixture (testdata/) and on the shipped dashboard and rules."""

import io
import json
import os
import shutil
import sys
import tempfile
import unittest
from contextlib import redirect_stderr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import check_queries  # noqa: E402

DATA = os.path.join(HERE, "testdata")
SCRAPE = os.path.join(DATA, "scrape.txt")
MONITORING = os.path.join(os.path.dirname(HERE), "components", "monitoring")


class CheckQueriesTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        self.addCleanup(shutil.rmtree, self.dir)

    def dashboard(self, *exprs):
        """A dashboard file with one panel per expression."""
        path = os.path.join(self.dir, "d%d.json" % len(os.listdir(self.dir)))
        with open(path, "w") as f:
            json.dump({"panels": [{"title": "p", "targets": [{"refId": "A", "expr": e}]}
                                  for e in exprs]}, f)
        return path

    def test_fixture_passes(self):
        problems = check_queries.check([os.path.join(DATA, "dashboard.json")],
                                       [os.path.join(DATA, "rules.yaml")], [SCRAPE])
        self.assertEqual(problems, [])

    def test_unknown_metric_is_named_with_its_place(self):
        d = self.dashboard('sum(rate(ferry_router_requets_total[5m]))')
        problems = check_queries.check([d], [], [SCRAPE])
        self.assertEqual(len(problems), 1)
        self.assertIn("ferry_router_requets_total", problems[0])
        self.assertIn("panel 'p'", problems[0])

    def test_histogram_series_map_to_their_family(self):
        ok = self.dashboard("rate(ferry_router_ttft_seconds_sum[5m]) / "
                            "rate(ferry_router_ttft_seconds_count[5m])")
        self.assertEqual(check_queries.check([ok], [], [SCRAPE]), [])
        # A counter has no buckets; a gauge no _count.
        bad = self.dashboard("rate(ferry_router_requests_total_bucket[5m])",
                             "ferry_worker_kv_used_fraction_count")
        problems = check_queries.check([bad], [], [SCRAPE])
        self.assertEqual(len(problems), 2, problems)

    def test_labels_strings_functions_and_variables_are_not_metrics(self):
        d = self.dashboard(
            'label_replace(ferry_worker_kv_used_fraction, "ferry_dst", "$1", "ferry_src", "(.*)")',
            'max by (ferry_label) (ferry_worker_kv_used_fraction{ferry_x="ferry_y"}) '
            '/ ignoring (ferry_z) group_left (ferry_w) ferry_worker_kv_used_fraction offset 1h',
            'clamp_max(ferry_worker_kv_used_fraction[$__range:1m] @ 1609746000, 1e3)',
            'sum(ferry_worker_kv_used_fraction) unless bool on () vector(1)')
        self.assertEqual(check_queries.check([d], [], [SCRAPE]), [])

    def test_recorded_names_need_their_rule(self):
        d = self.dashboard("ferry:kv_used:avg")
        self.assertEqual(len(check_queries.check([d], [], [SCRAPE])), 1)
        self.assertEqual(check_queries.check([d], [os.path.join(DATA, "rules.yaml")], [SCRAPE]), [])

    def test_external_series(self):
        d = self.dashboard("node_load1 and up")
        self.assertEqual(len(check_queries.check([d], [], [SCRAPE])), 1)
        self.assertEqual(check_queries.check([d], [], [SCRAPE], external=["node_load1"]), [])

    def test_command_line(self):
        bad = self.dashboard("ferry_nonexistent_total")
        err = io.StringIO()
        with redirect_stderr(err):
            self.assertEqual(check_queries.main(["--dashboard", bad, SCRAPE]), 1)
        self.assertIn("ferry_nonexistent_total", err.getvalue())
        with redirect_stderr(io.StringIO()):
            self.assertEqual(check_queries.main(
                ["--dashboard", os.path.join(DATA, "dashboard.json"),
                 "--rules", os.path.join(DATA, "rules.yaml"), SCRAPE]), 0)

    def test_shipped_dashboard_and_rules_parse(self):
        """The real files: every query read, names found; the fixture scrape lacks most."""
        dash = os.path.join(MONITORING, "dashboard.json")
        rules = os.path.join(MONITORING, "prometheusrule.yaml")
        queries = check_queries.dashboard_queries(dash)
        self.assertGreater(len(queries), 15)
        names = {n for _, e in queries for n in check_queries.metric_names(e)}
        for n in ("ferry_router_ttft_seconds_bucket", "ferry_router_inter_token_seconds_bucket",
                  "ferry_router_prompt_tokens_total", "ferry_router_billable_tokens_total",
                  "ferry:worker_busy_fraction:avg", "ferry_build_info"):
            self.assertIn(n, names)
        self.assertFalse({"namespace", "le", "code", "source"} & names, names)
        problems = check_queries.check([dash], [rules], [SCRAPE])
        self.assertTrue(any(p.startswith("ferry_worker_busy_fraction:") for p in problems))
        self.assertFalse(any(p.startswith("ferry:") for p in problems), problems)


if __name__ == "__main__":
    unittest.main()
