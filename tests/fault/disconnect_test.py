#!/usr/bin/env python3
"""Clients that go away (issue 27): a hundred streaming clients close their connections after a
few tokens, and every worker must let go of their requests at once.

  disconnect_test.py FERRY_ROUTER FERRY_WORKER MODEL

On a P/D stack (a router, a prefill and two decode workers) and then on an aggregated one (a
router and two aggregated workers), 100 streaming chat requests start together, each over a raw
HTTP connection of its own that it closes after 0 to 5 tokens (0: right after the response
headers, while the request may still be queued or prefilling; a third of them reset the
connection, the others close it). Then:

  - every worker's running + queued requests are 0 within one engine step of the router
    noticing the last close: each worker takes at most STEP_BOUND steps after the last close
    (the step under way at the close, whose token's write fails at the router, and the one
    under way when the cancel arrives; engine step counters, not sleeps: a step lasts
    --null_token_seconds, 50 ms, and no step is taken once a worker is idle);
  - KV blocks in use are back to the cached (idle) level on every worker;
  - the router answered all 100 as 499 (client closed), none failed; the stack serves on.
"""
import sys
import threading
import time
import unittest

import fault_util as fu

CLIENTS = 100
TOKEN_SECONDS = 0.05
STEP_BOUND = 2
MAX_RUNNING = 32  # per worker: of 100 requests on two, some wait queued


class DisconnectTest(unittest.TestCase):
    def setUp(self):
        self.model = fu.model_dir()

    def tearDown(self):
        fu.stop_all()
        fu.ferry_services.PROCESSES.clear()

    def disconnect_all(self, router, workers, what):
        rng = fu.rng()
        plans = [rng.randint(0, 5) for _ in range(CLIENTS)]
        bodies = [fu.chat_body(router.port, f"Client {i} asks about the tides.", 400,
                               temperature=0.8 if i % 2 else 0.0, seed=i) for i in range(CLIENTS)]
        got = [None] * CLIENTS
        errors = []
        go = threading.Barrier(CLIENTS)

        def client(i):
            try:
                go.wait()
                s = fu.Stream(router.port, bodies[i])
                if plans[i] == 0:
                    s.close(reset=i % 3 == 0)
                    got[i] = 0
                    return
                tokens = 0
                for event in s.events():
                    if event == "[DONE]" or "error" in event:
                        errors.append(f"client {i}: {event}")
                        break
                    if any(c.get("delta", {}).get("content") or c.get("token_ids")
                           for c in event.get("choices") or []):
                        tokens += 1
                        if tokens >= plans[i]:
                            break
                s.close(reset=i % 3 == 0)
                got[i] = tokens
            except Exception as e:  # reported below, with the others
                errors.append(f"client {i}: {e!r}")

        before = router.metrics()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # The last connection is closed now.
        steps_at_close = {w.name: w.steps() for w in workers}
        self.assertEqual(errors, [], what)
        self.assertEqual(got, plans, f"{what}: tokens each client read before closing")

        # Idle: nothing running or queued, and no step taken any more (two reads of the step
        # counters, and of the gauges, agree with a refresh of the gauges between them).
        deadline = time.monotonic() + 30
        while True:
            samples = {w.name: w.metrics() for w in workers}
            if all(w.busy(samples[w.name]) == 0 for w in workers):
                # The gauges are refreshed every --watch_interval (20 ms): two more refreshes
                # (the first may have been under way at the read) make the second read a later
                # state; a mismatch only retries.
                refreshed = {w.name: fu.metric_sum(samples[w.name],
                                                   "ferry_worker_load_refreshes_total") + 2
                             for w in workers}
                fu.wait_for(lambda: all(
                    fu.metric_sum(w.metrics(), "ferry_worker_load_refreshes_total") >=
                    refreshed[w.name] for w in workers), f"{what}: a refresh of the gauges", 10)
                again = {w.name: w.metrics() for w in workers}
                if all(w.busy(again[w.name]) == 0 and
                       w.steps(again[w.name]) == w.steps(samples[w.name]) for w in workers):
                    break
            self.assertLess(time.monotonic(), deadline, f"{what}: workers still busy: " + str(
                {w.name: w.busy(samples[w.name]) for w in workers}))
            time.sleep(0.02)
        for w in workers:
            s = again[w.name]
            taken = w.steps(s) - steps_at_close[w.name]
            self.assertLessEqual(taken, STEP_BOUND,
                                 f"{what}: {w.name} took {taken:.0f} steps after the last close")
            used = fu.metric_sum(s, "ferry_worker_kv_blocks", state="used")
            cached = fu.metric_sum(s, "ferry_worker_kv_blocks", state="cached")
            self.assertEqual(used, cached, f"{what}: {w.name} holds KV blocks beyond its cache")
            print(f"{what}: {w.name}: {taken:.0f} step(s) after the last close; "
                  f"{used:.0f} KV blocks used = cached", file=sys.stderr)

        after = router.metrics()

        def delta(name, **labels):
            return fu.metric_sum(after, name, **labels) - fu.metric_sum(before, name, **labels)

        # The router counts a request once its stream ended: poll briefly for the last ones.
        deadline = time.monotonic() + 10
        while delta("ferry_router_requests_total", code="499") < CLIENTS:
            self.assertLess(time.monotonic(), deadline, f"{what}: 499s: " + str(
                delta("ferry_router_requests_total", code="499")))
            time.sleep(0.05)
            after = router.metrics()
        self.assertEqual(delta("ferry_router_requests_total"), CLIENTS, what)
        self.assertEqual(delta("ferry_router_failed_requests_total"), 0, what)

        # The stack serves on.
        body = fu.chat_body(router.port, "And after?", 8)
        r = fu.collect(router.port, body)
        self.assertTrue(r.done and r.error is None and r.usage["completion_tokens"] == 8,
                        f"{what}: {r.describe()}")

    def test_pd(self):
        router, prefill, decode = fu.Stacks.pd(self.model, token_seconds=TOKEN_SECONDS,
                                               worker_extra=[f"--max_running={MAX_RUNNING}"])
        self.disconnect_all(router, [prefill] + decode, "P/D")

    def test_aggregated(self):
        router, workers = fu.Stacks.aggregated(self.model, token_seconds=TOKEN_SECONDS,
                                                worker_extra=[f"--max_running={MAX_RUNNING}"])
        self.disconnect_all(router, workers, "aggregated")


if __name__ == "__main__":
    try:
        unittest.main(argv=[sys.argv[0]], verbosity=2)
    finally:
        fu.finish()
