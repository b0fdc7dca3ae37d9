#!/usr/bin/env python3
"""API keys, tenants, rate limits and billing through the official `openai` SDK, on a real stack.

  router_tenants_test.py FERRY_ROUTER FERRY_WORKER MODEL_DIR

A null-engine ferry-worker behind a ferry-router with a key file (three tenants, one of them rate
limited) and prices: keys in either header or refused with 401; two tenants with the same prompt
never share a cached block (the second tenant's first request reuses nothing, and the worker caches
its blocks anew); a rate-limited tenant gets 429 rate_limit_exceeded with Retry-After while
another is served; a key removed from the file is refused after SIGHUP while a stream it started
finishes; a request chooses its traffic class (x-ferry-traffic-class) only where its tenant allows
it (else 403; a bad class 400); and the billing figures (/billing and the Prometheus counters) equal, class by class, the
usage every client was told, the revenue the prices times those counters, revenue per GPU-hour the
revenue over the GPU time. Every process started is killed at the end (PR_SET_PDEATHSIG too).
"""
import json
import math
import os
import signal
import sys
import time
import unittest
import urllib.error
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferry_services import TMP, metric, start, stop_all  # noqa: E402

ROUTER, WORKER, MODEL = sys.argv[1:4]
KEYS = {"acme": "sk-acme-0123456789abcdef", "lab": "sk-lab-0123456789abcdef0",
        "slow": "sk-slow-0123456789abcdef", "gone": "sk-gone-0123456789abcdef"}
PRICES = {"input": 2.0, "cached_input": 0.5, "output": 8.0}  # dollars per million tokens
KEY_FILE = os.path.join(TMP, "keys.json")
BILLED = {}  # tenant -> {"input", "cached_input", "output"}: what the clients were told
PROMPT = ("The quick brown fox jumps over the lazy dog while the cat watches from the warm "
          "windowsill, thinking about fish and the long afternoon ahead of it.")


def write_keys(tenants_with_keys):
    doc = {"tenants": {"acme": {"traffic_class": "agent"},
                       "lab": {"traffic_class": "batch", "traffic_class_header": True},
                       "slow": {"requests_per_minute": 2}},
           "keys": [{"key": KEYS[t], "tenant": "acme" if t == "gone" else t}
                    for t in tenants_with_keys]}
    with open(KEY_FILE + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(KEY_FILE + ".tmp", KEY_FILE)


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read().decode()


def bill(tenant, usage):
    b = BILLED.setdefault(tenant, {"input": 0, "cached_input": 0, "output": 0})
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    b["input"] += usage.prompt_tokens - cached
    b["cached_input"] += cached
    b["output"] += usage.completion_tokens


class Stack:
    def __init__(self):
        write_keys(["acme", "lab", "slow", "gone"])
        _, w = start(WORKER, [f"--model={MODEL}", "--engine=null", "--null_token_seconds=0.02",
                              "--block_tokens=16", "--kv_pool_bytes=8MiB"], "worker")
        self.worker_admin = w["admin_port"]
        self.router, r = start(ROUTER, [
            f"--model={MODEL}", "--served_model_name=tiny", f"--workers=127.0.0.1:{w['grpc_port']}",
            f"--api_keys_file={KEY_FILE}", f"--price_input_per_mtok={PRICES['input']}",
            f"--price_cached_input_per_mtok={PRICES['cached_input']}",
            f"--price_output_per_mtok={PRICES['output']}", "--gpus_per_worker=8"], "router")
        self.port, self.admin = r["http_port"], r["admin_port"]
        for _ in range(600):
            if any(x["state"] == "up" for x in json.loads(get(self.admin, "/workers"))):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the worker did not come up")

    def client(self, tenant, key=None):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1",
                             api_key=key or KEYS[tenant], max_retries=0, timeout=60)

    def chat(self, tenant, content=PROMPT, max_tokens=4):
        r = self.client(tenant).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": content}], max_tokens=max_tokens)
        bill("acme" if tenant == "gone" else tenant, r.usage)
        return r


STACK = None


def setUpModule():
    global STACK
    STACK = Stack()


def tearDownModule():
    stop_all()


class TenantsTest(unittest.TestCase):
    def test_1_keys_in_either_header_or_401(self):
        with self.assertRaises(openai.AuthenticationError) as e:
            STACK.client("acme", key="sk-wrong-0123456789abcdef").models.list()
        self.assertEqual(e.exception.status_code, 401)
        self.assertEqual(e.exception.code, "invalid_api_key")
        self.assertNotIn("sk-wrong", str(e.exception.body))
        self.assertEqual(STACK.client("acme").models.list().data[0].id, "tiny")
        req = urllib.request.Request(f"http://127.0.0.1:{STACK.port}/v1/models",
                                     headers={"x-api-key": KEYS["lab"]})
        with urllib.request.urlopen(req, timeout=10) as r:
            self.assertEqual(r.status, 200)
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{STACK.port}/v1/models", timeout=10)
        self.assertEqual(e.exception.code, 401)
        self.assertEqual(json.loads(e.exception.read())["error"]["code"], "missing_api_key")

    def test_2_tenants_never_share_a_cached_block(self):
        cached = lambda: metric(STACK.worker_admin, 'ferry_worker_kv_blocks{state="cached"}')
        first = STACK.chat("acme")
        self.assertEqual(first.usage.prompt_tokens_details.cached_tokens, 0)
        again = STACK.chat("acme")
        full_blocks = (first.usage.prompt_tokens // 16) * 16
        self.assertGreater(full_blocks, 0)
        self.assertEqual(again.usage.prompt_tokens_details.cached_tokens, full_blocks)
        blocks = cached()
        for _ in range(500):  # acme's blocks are in the gauge
            if blocks >= full_blocks // 16:
                break
            time.sleep(0.01)
            blocks = cached()
        other = STACK.chat("lab")  # the same prompt, another tenant: nothing reused
        self.assertEqual(other.usage.prompt_tokens, first.usage.prompt_tokens)
        self.assertEqual(other.usage.prompt_tokens_details.cached_tokens, 0)
        want = blocks + full_blocks // 16  # cached anew, apart (the gauge follows the engine)
        for _ in range(500):
            if cached() >= want:
                break
            time.sleep(0.01)
        self.assertGreaterEqual(cached(), want)
        self.assertEqual(STACK.chat("lab").usage.prompt_tokens_details.cached_tokens, full_blocks)

    def test_3_a_rate_limited_tenant_waits_while_another_is_served(self):
        STACK.chat("slow")
        STACK.chat("slow")
        with self.assertRaises(openai.RateLimitError) as e:
            STACK.chat("slow")
        self.assertEqual(e.exception.status_code, 429)
        self.assertEqual(e.exception.code, "rate_limit_exceeded")
        self.assertGreaterEqual(int(e.exception.response.headers["retry-after"]), 1)
        self.assertEqual(STACK.chat("lab").choices[0].finish_reason, "length")

    def test_4_a_removed_key_is_refused_after_sighup_while_its_stream_finishes(self):
        stream = STACK.client("gone").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=100,
            stream=True, stream_options={"include_usage": True})
        chunks = iter(stream)
        first = next(chunks)
        self.assertEqual(first.choices[0].delta.role, "assistant")
        write_keys(["acme", "lab", "slow"])
        STACK.router.send_signal(signal.SIGHUP)
        for _ in range(400):
            try:
                STACK.client("gone").models.list()
            except openai.AuthenticationError:
                break
            time.sleep(0.01)
        else:
            self.fail("the removed key still works after SIGHUP")
        self.assertEqual(STACK.client("acme").models.list().data[0].id, "tiny")
        finish, usage = None, None
        for chunk in chunks:  # the stream it started goes on to its end
            if chunk.choices:
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
        self.assertEqual(finish, "length")
        self.assertEqual(usage.completion_tokens, 100)
        bill("acme", usage)

    def test_5_a_request_chooses_its_traffic_class_where_its_tenant_allows(self):
        def chat(tenant, traffic_class):
            return STACK.client(tenant).with_options(
                default_headers={"x-ferry-traffic-class": traffic_class}).chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        with self.assertRaises(openai.PermissionDeniedError) as e:
            chat("acme", "batch")
        self.assertEqual(e.exception.status_code, 403)
        self.assertEqual(e.exception.code, "traffic_class_not_allowed")
        with self.assertRaises(openai.BadRequestError) as e:
            chat("lab", "gold")
        self.assertEqual(e.exception.code, "invalid_traffic_class")
        r = chat("lab", "Agent")
        self.assertEqual(r.choices[0].finish_reason, "length")
        bill("lab", r.usage)

    def test_9_billing_equals_what_the_clients_were_told(self):
        report = json.loads(get(STACK.admin, "/billing"))
        got = {u["tenant"]: u for u in report["usage"]}
        self.assertEqual(set(got), set(BILLED))
        revenue = 0.0
        for tenant, want in BILLED.items():
            u = got[tenant]
            self.assertEqual(u["model"], "tiny")
            for cls in ("input", "cached_input", "output"):
                self.assertEqual(u[cls + "_tokens"], want[cls], (tenant, cls))
                self.assertEqual(metric(STACK.admin, 'ferry_router_billable_tokens_total{class="'
                                        + cls + f'",model="tiny",tenant="{tenant}"}}'),
                                 want[cls], (tenant, cls))
            r = sum(want[c] * PRICES[c] for c in PRICES) / 1e6
            self.assertTrue(math.isclose(u["revenue_dollars"], r, rel_tol=1e-9))
            revenue += r
        self.assertTrue(math.isclose(report["revenue_dollars"], revenue, rel_tol=1e-9))
        self.assertGreater(report["gpu_hours"], 0)
        self.assertEqual(report["gpus_per_worker"], 8)
        self.assertTrue(math.isclose(report["revenue_per_gpu_hour"],
                                     report["revenue_dollars"] / report["gpu_hours"],
                                     rel_tol=1e-9))
        self.assertTrue(math.isclose(metric(STACK.admin, "ferry_router_revenue_dollars_total"),
                                     revenue, rel_tol=1e-6))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
