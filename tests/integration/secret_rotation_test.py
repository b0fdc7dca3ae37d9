#!/usr/bin/env python3
"""Secrets rotated on a running stack, applied without a signal or a restart (polled files).

  secret_rotation_test.py FERRY_ROUTER FERRY_WORKER FERRY_KVSTORE FERRY_WORKER_CLI MODEL_GGUF

A ferry-kvstore, a null-engine ferry-worker writing to it (and its gRPC KV transport), and a
ferry-router in front (probing the store), each with its own copy of the shared token file (as
pods see a Secret's update at different times) polled every 20 ms. The token rolls from `old` to
`new` in the three steps shared_token.h describes, one service at a time: after every file
change the test waits for that service's ferry_secret_reloads_total{secret="auth_token",
result="applied"} to count it, then a chat completion through the router (router -> worker,
worker -> store calls) must succeed, and no service may have refused a call. A bad new content
(a token too short) is rejected and the old tokens stay. Once `old` is dropped everywhere, a
call carrying it is UNAUTHENTICATED. The router's API key file rolls the same way: a key added
is accepted and a key removed refused, with no SIGHUP.
"""
import json
import os
import subprocess
import sys
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferry_services import TMP, metric, start, stop_all, wait_for, wait_metric  # noqa: E402

ROUTER, WORKER, KVSTORE, WORKER_CLI, MODEL = sys.argv[1:6]
OLD = "old-token-0123456789abcdef"
NEW = "new-token-fedcba9876543210"
KEY_A = "sk-first-0123456789abcdef"
KEY_B = "sk-second-0123456789abcdef"
POLL = "--secret_poll_interval=20ms"
UNAUTHENTICATED = "ferry_worker_unauthenticated_calls_total"
WRITES = "ferry_worker_store_write_blocks_total"


def reloads_line(secret, result="applied"):
    return f'ferry_secret_reloads_total{{result="{result}",secret="{secret}"}}'


def write(path, text):
    # As the kubelet does it: the new content appears at once (a rename), never half written.
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def write_keys(path, keys):
    keys = [{"key": k, "tenant": "t"} for k in keys]
    write(path, json.dumps({"tenants": {"t": {}}, "keys": keys}))


class SecretRotationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.token = {n: os.path.join(TMP, f"token_{n}") for n in ("store", "worker", "router")}
        for path in cls.token.values():
            write(path, OLD + "\n")
        cls.keys = os.path.join(TMP, "keys.json")
        write_keys(cls.keys, [KEY_A])
        _, s = start(KVSTORE, [f"--dir={TMP}/store", "--capacity=64MiB", "--segment_bytes=8MiB",
                               "--max_object_bytes=4MiB", f"--auth_token_file={cls.token['store']}",
                               POLL], "kvstore")
        _, w = start(WORKER, [f"--model={MODEL}", "--engine=null", "--null_token_seconds=0",
                              "--block_tokens=16", "--kv_pool_bytes=64MiB", "--transport=grpc",
                              f"--kvstore=127.0.0.1:{s['grpc_port']}",
                              f"--auth_token_file={cls.token['worker']}", POLL], "worker")
        _, r = start(ROUTER, [f"--model={MODEL}", "--served_model_name=smol",
                              f"--workers=127.0.0.1:{w['grpc_port']}",
                              f"--kvstore=127.0.0.1:{s['grpc_port']}",
                              f"--auth_token_file={cls.token['router']}",
                              f"--api_keys_file={cls.keys}", POLL], "router")
        cls.admin = {"store": s["admin_port"], "worker": w["admin_port"], "router": r["admin_port"]}
        cls.worker_address = f"127.0.0.1:{w['grpc_port']}"
        cls.http = r["http_port"]
        cls.applied = {name: 0 for name in cls.admin}
        cls.prompts = 0

        def up():
            with urllib.request.urlopen(f"http://127.0.0.1:{r['admin_port']}/workers") as page:
                return any(x["state"] == "up" for x in json.loads(page.read()))
        wait_for(up, "the worker coming up in the router")

    @classmethod
    def tearDownClass(cls):
        stop_all()

    def chat(self, key=KEY_A):
        """The HTTP status of a new chat completion through the router."""
        type(self).prompts += 1
        body = json.dumps({"model": "smol", "max_tokens": 4, "messages": [{
            "role": "user",
            "content": f"Request {self.prompts}: tell me about the rotation of secrets, slowly."}]})
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http}/v1/chat/completions", data=body.encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                r.read()
                return r.status
        except urllib.error.HTTPError as e:
            e.read()
            return e.code


    def rotate(self, name, text):
        """Writes `name`'s token file and waits until that service applied it."""
        write(self.token[name], text)
        self.applied[name] += 1
        wait_metric(self.admin[name], reloads_line("auth_token"), self.applied[name])

    def assert_served(self, what):
        stored_before = self.store_writes()
        self.assertEqual(self.chat(), 200, what)
        # The worker's write of the prompt's blocks reached the store (worker -> store).
        wait_for(lambda: self.store_writes() > stored_before, f"a store write after {what}")
        worker = self.admin["worker"]
        self.assertEqual(metric(worker, WRITES + '{outcome="failed"}'), 0, what)
        self.assertEqual(metric(worker, UNAUTHENTICATED), 0, what)

    def store_writes(self):
        return sum(metric(self.admin["worker"], WRITES + f'{{outcome="{o}"}}')
                   for o in ("written", "present", "extended"))

    def cli_abort(self, token):
        """ferry-worker-cli abort with `token`: (exit status, stderr)."""
        path = os.path.join(TMP, "cli_token")
        write(path, token + "\n")
        run = subprocess.run([WORKER_CLI, "abort", f"--addr={self.worker_address}",
                              f"--auth_token_file={path}", f"--model={MODEL}", "no-such-request"],
                             capture_output=True, text=True, timeout=60)
        return run.returncode, run.stderr

    def test_a_token_rotation_never_refuses_a_call(self):
        self.assert_served("before the rotation")
        both_old_first, both_new_first = f"{OLD}\n{NEW}\n", f"\n{NEW}\n\n{OLD}\n"
        # 1. Every server accepts the new token too (each still sends the old one).
        for name in ("store", "worker", "router"):
            self.rotate(name, both_old_first)
            self.assert_served(f"{name} accepts both")
        # 2. Every client sends the new one (clients of servers that accept both).
        for name in ("router", "worker", "store"):
            self.rotate(name, both_new_first)
            self.assert_served(f"{name} sends the new token")
        # A bad new content is refused, logged, and the tokens in force stay.
        write(self.token["worker"], "too-short\n")
        wait_metric(self.admin["worker"], reloads_line("auth_token", "rejected"), 1)
        self.assert_served("after a refused token file")
        # 3. The old token is dropped everywhere.
        for name in ("store", "worker", "router"):
            self.rotate(name, NEW + "\n")
            self.assert_served(f"{name} dropped the old token")
        status, err = self.cli_abort(OLD)
        self.assertEqual(status, 1, err)
        self.assertIn("shared token", err)
        self.assertEqual(metric(self.admin["worker"], UNAUTHENTICATED), 1)
        status, err = self.cli_abort(NEW)
        self.assertEqual(status, 0, err)

    def test_api_keys_roll_without_a_signal(self):
        self.assertEqual(self.chat(KEY_B), 401)
        router = self.admin["router"]
        before = metric(router, reloads_line("api_keys"))
        write_keys(self.keys, [KEY_A, KEY_B])
        wait_metric(router, reloads_line("api_keys"), before + 1)
        self.assertEqual(self.chat(KEY_B), 200)
        write(self.keys, "{ not json")
        wait_metric(router, reloads_line("api_keys", "rejected"), 1)
        self.assertEqual(self.chat(KEY_B), 200)  # the keys in force stay
        write_keys(self.keys, [KEY_A])
        wait_metric(router, reloads_line("api_keys"), before + 2)
        self.assertEqual(self.chat(KEY_B), 401)
        self.assertEqual(self.chat(KEY_A), 200)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
