#!/usr/bin/env python3
"""In-flight requests survive worker death (issue 27; ARCHITECTURE.md §7): SIGKILL of the worker
streaming a request, mid-stream, on real processes on loopback.

  kill_test.py FERRY_ROUTER FERRY_WORKER MODEL --pd | --aggregated

--pd: a router, a prefill and two decode workers (UCX tcp); --aggregated: a router and two
aggregated workers. Twenty streaming chat requests run one after another, half greedy, half
sampled (temperature 0.8, a seed); each first runs without faults (the reference), then again
with the worker streaming it killed at a random token position (random.Random(27)); the killed
worker is restarted on its address at once (it may come back while the moved stream still runs)
and the router must see it up before the next request. The router waits --queue_timeout (2 s
here) for a worker before it gives a request up. Every faulted stream must complete, equal
to its reference (token ids, text, finish reason, usage), and the router must count 20
migrations and no failed request. And (P/D only: the rules are unit-tested, the stream's end is
the same code in both shapes) a request whose worker is killed twice, the second time with no
worker left to take it within the queue's timeout, or a fourth time (--max_migrations, default 3), ends its stream with an
error event (and counts as failed).
"""
import signal
import sys
import time
import unittest

import fault_util as fu

PD = "--pd" in sys.argv
REQUESTS = 20
MAX_TOKENS = 48
# A request with no worker left waits this long for one (issue 44), then ends with an error.
QUEUE = ["--queue_timeout=2s"]


class KillTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        model = fu.model_dir()
        if PD:
            cls.router, prefill, cls.streamers = fu.Stacks.pd(model, router_flags=QUEUE)
            cls.all = [prefill] + cls.streamers
        else:
            cls.router, cls.streamers = fu.Stacks.aggregated(model, router_flags=QUEUE)
            cls.all = cls.streamers

    @classmethod
    def tearDownClass(cls):
        fu.stop_all()

    def setUp(self):
        # Every worker alive and up (a failed case may have left one killed).
        for w in self.all:
            if w.proc.poll() is not None:
                w.start()
        self.router.wait_up(self.all)

    def body(self, i):
        prompt = f"Request {i}: tell me about the ferry that crosses the strait."
        if i % 2 == 0:
            return fu.chat_body(self.router.port, prompt, MAX_TOKENS)
        return fu.chat_body(self.router.port, prompt, MAX_TOKENS, temperature=0.8, seed=1000 + i)

    def test_kill_the_streaming_worker_mid_stream(self):
        bodies = [self.body(i) for i in range(REQUESTS)]
        references = fu.run_all(self.router.port, bodies)
        for i, ref in enumerate(references):
            self.assertTrue(ref.done and ref.error is None, f"reference {i}: {ref.describe()}")
            self.assertEqual(ref.usage["completion_tokens"], MAX_TOKENS)
        # Sampling is on: the sampled references are not all the greedy text.
        self.assertGreater(len({r.text for r in references}), REQUESTS // 2)

        before = fu.router_fault_counters(self.router)
        rng = fu.rng()
        started = time.monotonic()
        kill_positions = []
        for i, body in enumerate(bodies):
            kill_at = rng.randint(2, MAX_TOKENS - 12)
            killed = []

            def on_token(r):
                if not killed and r.tokens() >= kill_at:
                    w = self.router.streaming_worker(self.streamers)
                    w.kill()
                    killed.append((w, r.tokens()))
                    # Restarted on the same gRPC address (the router's static list reaches it
                    # again) while the moved stream goes on. (On this thread: a child dies with
                    # the thread that started it, PR_SET_PDEATHSIG.)
                    w.start()

            got = fu.collect(self.router.port, body, on_token)
            self.assertTrue(killed, f"request {i}: no kill ({got.describe()})")
            w, at = killed[0]
            kill_positions.append(at)
            fu.assert_same_stream(self, got, references[i],
                                  f"request {i} ({'greedy' if i % 2 == 0 else 'sampled'}), "
                                  f"{w.name} killed at token {at}")
            self.router.wait_up(self.all)
        elapsed = time.monotonic() - started

        after = fu.router_fault_counters(self.router)
        self.assertTrue(after["has_migration_metrics"],
                        "the router exports no ferry_router_migrations_total")
        self.assertEqual(after["migrations"] - before["migrations"], REQUESTS)
        self.assertEqual(after["failed"] - before["failed"], 0)
        self.assertEqual(after["non_200"] - before["non_200"], 0)
        # Carried over: at least what each client had at its kill, at most the whole outputs.
        carried = after["migrated_tokens"] - before["migrated_tokens"]
        self.assertGreaterEqual(carried, sum(kill_positions))
        self.assertLessEqual(carried, REQUESTS * MAX_TOKENS)
        self.assertEqual(after["worker_error"] - before["worker_error"], 0)
        self.assertLess(elapsed, 150, "20 kills and restarts took too long")
        # The streams were killed on the workers' token streams (opened as the restarted workers
        # came up), not only on requests' own calls: most of the faulted output came through them.
        through_streams = after["stream_chunks"] - before["stream_chunks"]
        print(f"chunks through token streams: {through_streams} (kills at {sum(kill_positions)})")
        self.assertGreaterEqual(through_streams, sum(kill_positions) // 2)

    # The rules (the migration limit; no worker left) are unit-tested in
    # router/dispatch/dispatch_rules_test.cc, and a stream's end is the same code in both shapes:
    # the end to end check runs once, on the P/D stack.
    @unittest.skipUnless(PD, "the P/D stack checks it (the rule is unit-tested)")
    def test_at_most_three_migrations(self):
        """--max_migrations (default 3): a request whose worker is killed a fourth time ends its
        stream with an error event after a prefix of the fault-free tokens."""
        # Long enough never to end before the fourth kill, however far the router runs ahead of
        # the client while it restarts workers; compared with the first 250 tokens of a
        # fault-free run (greedy: a longer run continues a shorter one).
        prompt = "Tell the long story of the four crossings."
        body = fu.chat_body(self.router.port, prompt, 1000)
        ref = fu.collect(self.router.port, fu.chat_body(self.router.port, prompt, 250))
        before = fu.router_fault_counters(self.router)
        killed = []

        def on_token(r):
            # 40 tokens apart: past what the router held when it moved the request (the client
            # lags while it restarts a worker), so the next kill hits the worker it moved to.
            if len(killed) < 4 and r.tokens() >= 10 + 40 * len(killed):
                self.router.wait_up(self.all)  # the last one killed is back: a place to move to
                w = self.router.streaming_worker(self.streamers)
                w.kill()
                killed.append(r.tokens())
                w.start()

        got = fu.collect(self.router.port, body, on_token)
        self.assertFalse(got.hung, f"the stream hangs after {len(killed)} kills at tokens "
                                   f"{killed}: {got.describe()}")
        self.assertEqual(len(killed), 4, f"killed {len(killed)} times: {got.describe()}")
        self.assertIsNotNone(got.error, f"no error event after the fourth kill: {got.describe()}")
        self.assertTrue(got.error.get("message") and got.error.get("type"), got.error)
        self.assertGreaterEqual(got.tokens(), killed[3], got.describe())
        self.assertLess(got.tokens(), 1000, got.describe())
        n = min(len(got.text), len(ref.text))
        self.assertEqual(got.text[:n], ref.text[:n], "not the fault-free text")
        if got.ids:
            n = min(len(got.ids), len(ref.ids))
            self.assertEqual(got.ids[:n], ref.ids[:n], "not the fault-free tokens")
        after = fu.router_fault_counters(self.router)
        self.assertEqual(after["migrations"] - before["migrations"], 3)
        self.assertEqual(after["migration_limit"] - before["migration_limit"], 1,
                         str(fu.samples_of(self.router.metrics(), "ferry_router_failed_requests")))

    @unittest.skipUnless(PD, "the P/D stack checks it (the rule is unit-tested)")
    def test_no_worker_left_ends_the_stream_with_an_error(self):
        """The request survives the first kill; killed again with no worker left to take it, it
        waits in the router's queue (--queue_timeout, 2 s here), then its stream ends with an
        OpenAI-style error event after a prefix of the fault-free tokens."""
        body = self.body(100)
        ref = fu.collect(self.router.port, body)
        before = fu.router_fault_counters(self.router)
        killed = []

        def on_token(r):
            if r.tokens() >= 8 * (len(killed) + 1) and len(killed) < 2:
                w = self.router.streaming_worker(self.streamers)
                w.signal(signal.SIGKILL)
                killed.append((w, r.tokens()))

        try:
            got = fu.collect(self.router.port, body, on_token)
        finally:
            for w, _ in killed:
                w.proc.wait()
                w.start()
            self.router.wait_up(self.all)
        self.assertFalse(got.hung, f"the stream hangs: {got.describe()}")
        self.assertEqual(len(killed), 2, f"the stream ended after the first kill: "
                                         f"{got.describe()}")
        self.assertEqual(len({w.name for w, _ in killed}), 2, "killed one worker twice")
        self.assertIsNotNone(got.error, f"no error event: {got.describe()}")
        self.assertTrue(got.error.get("message") and got.error.get("type"), got.error)
        self.assertGreaterEqual(got.tokens(), killed[1][1], got.describe())
        self.assertLess(got.tokens(), MAX_TOKENS, got.describe())
        self.assertTrue(ref.text.startswith(got.text), "not a prefix of the fault-free text")
        if got.ids:
            self.assertEqual(got.ids, ref.ids[:len(got.ids)])
        after = fu.router_fault_counters(self.router)
        # (The second move may count as a migration too: decided, then no worker took it.)
        self.assertGreaterEqual(after["migrations"] - before["migrations"], 1)
        self.assertEqual(after["failed"] - before["failed"], 1,
                         "the request that could not move is not counted as failed: " +
                         str(fu.samples_of(self.router.metrics(), "ferry_router_failed_requests",
                                           "ferry_router_migrations")))


if __name__ == "__main__":
    try:
        unittest.main(argv=[sys.argv[0]], verbosity=2)
    finally:
        fu.finish()
