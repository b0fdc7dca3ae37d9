#!/usr/bin/env python3
"""A stalled decode worker (issue 27; ARCHITECTURE.md §7): SIGSTOP mid-stream.

  stall_test.py FERRY_ROUTER FERRY_WORKER MODEL

A router (--heartbeat_timeout=1s), a prefill and two decode workers (--watch_heartbeat=200ms).
A streaming request (greedy, then one sampled with a seed) has the decode worker streaming it
stopped at a token position: its Watch stream falls silent, so the router must move the
request to the other decode worker within the heartbeat timeout (plus a margin) and continue the
same stream. As soon as tokens flow again the stalled worker is continued (SIGCONT) while the
migrated stream still runs: its late tokens must never reach the client (the tokens equal a
fault-free run's exactly), the work it still held must be aborted or cancelled, not run to its
end (the router aborts it by request id once the worker is back, or the cancel of its stream
reaches it), and it must rejoin the pool.
"""
import signal
import sys
import threading
import time
import unittest

import fault_util as fu

HEARTBEAT_TIMEOUT = 1.0
MAX_TOKENS = 80
STOP_AT = 10
TOKEN_SECONDS = 0.02
WATCHDOG_MARGIN = 4.0


class StallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.router, cls.prefill, cls.decode = fu.Stacks.pd(
            fu.model_dir(), token_seconds=TOKEN_SECONDS, worker_extra=["--watch_heartbeat=200ms"],
            router_flags=[f"--heartbeat_timeout={HEARTBEAT_TIMEOUT}s"])

    @classmethod
    def tearDownClass(cls):
        fu.stop_all()

    def stall(self, body, what):
        ref = fu.collect(self.router.port, body)
        self.assertTrue(ref.done and ref.error is None, f"{what}: reference {ref.describe()}")
        before = fu.router_fault_counters(self.router)
        stalled = {}

        def on_token(r):
            now = time.monotonic()
            if "worker" not in stalled and r.tokens() >= STOP_AT:
                w = self.router.streaming_worker(self.decode)
                stalled["outcomes"] = w.metrics()
                w.signal(signal.SIGSTOP)
                stalled.update(worker=w, at=now, tokens=r.tokens())
                watchdog.start()
            elif ("resumed" not in stalled and "worker" in stalled and
                  now - stalled["at"] > HEARTBEAT_TIMEOUT / 2):
                # Tokens flow again, and not ones sent before the stop (those arrive at once):
                # the request moved. Continue the stalled worker while this stream still runs.
                stalled["resumed"] = now
                stalled["worker"].signal(signal.SIGCONT)

        def unstall():  # the request never moved: let the stream end rather than hang
            stalled["watchdog"] = True
            stalled["worker"].signal(signal.SIGCONT)

        watchdog = threading.Timer(HEARTBEAT_TIMEOUT + WATCHDOG_MARGIN, unstall)
        try:
            got = fu.collect(self.router.port, body, on_token)
        finally:
            watchdog.cancel()
            if "worker" in stalled:
                stalled["worker"].signal(signal.SIGCONT)
        self.assertIn("worker", stalled, f"{what}: never stopped a worker: {got.describe()}")
        w = stalled["worker"]
        self.assertFalse(stalled.get("watchdog"),
                         f"{what}: no token for {HEARTBEAT_TIMEOUT + WATCHDOG_MARGIN} s after "
                         f"{w.name} stopped (the request did not move); continued it: "
                         f"{got.describe()}")
        fu.assert_same_stream(self, got, ref, f"{what}: {w.name} stopped at token "
                                              f"{stalled['tokens']}")
        self.assertIn("resumed", stalled, f"{what}: no token after the stop")
        moved_after = stalled["resumed"] - stalled["at"]
        self.assertLess(moved_after, HEARTBEAT_TIMEOUT + WATCHDOG_MARGIN,
                        f"{what}: the request moved {moved_after:.2f} s after the stop")

        # The stalled worker lets go of the request without writing it to its end, and rejoins.
        deadline = time.monotonic() + 20
        while w.busy() > 0:
            self.assertLess(time.monotonic(), deadline,
                            f"{what}: {w.name} still holds requests: {w.metrics()}")
            time.sleep(0.05)
        self.router.wait_up([self.prefill] + self.decode)
        s0, s1 = stalled["outcomes"], w.metrics()

        def ended(outcome):
            return (fu.metric_sum(s1, "ferry_worker_requests_total", outcome=outcome) -
                    fu.metric_sum(s0, "ferry_worker_requests_total", outcome=outcome))

        self.assertEqual(ended("completed"), 0,
                         f"{what}: the stalled worker wrote the migrated request to its end")
        self.assertEqual(ended("aborted") + ended("cancelled"), 1, f"{what}: {s1}")
        after = fu.router_fault_counters(self.router)
        self.assertEqual(after["migrations"] - before["migrations"], 1, what)
        self.assertEqual(after["worker_down"] - before["worker_down"], 1,
                         f"{what}: a silent worker's request moves with cause worker_down")
        self.assertEqual(after["failed"] - before["failed"], 0, what)
        print(f"{what}: moved {moved_after:.2f} s after the stop; the stalled worker's copy "
              f"ended aborted {ended('aborted'):.0f}, cancelled {ended('cancelled'):.0f}; "
              f"router orphan aborts found +{after['orphan_found'] - before['orphan_found']:.0f}",
              file=sys.stderr)
        if ended("aborted"):  # an Abort by id: the router counts it
            self.assertEqual(after["orphan_found"] - before["orphan_found"], 1, what)

    def test_greedy(self):
        self.stall(fu.chat_body(self.router.port, "Where does the night ferry go?", MAX_TOKENS),
                   "greedy")

    def test_sampled(self):
        self.stall(fu.chat_body(self.router.port, "Sing of the harbour.", MAX_TOKENS,
                                temperature=0.8, seed=7), "sampled")


if __name__ == "__main__":
    try:
        unittest.main(argv=[sys.argv[0]], verbosity=2)
    finally:
        fu.finish()
