#!/usr/bin/env python3
"""Drain-and-forward (issue 28; ARCHITECTURE.md §7): a worker told to go (SIGTERM) under load
loses no request and restarts none. Real processes on loopback, the null engine paced at 10 ms a
token (fault_util.py).

  drain_test.py FERRY_ROUTER FERRY_WORKER MODEL --pd | --aggregated

--pd: a router, prefill and decode workers (UCX tcp):
  - SIGTERM on one of two decode workers while it streams: its requests keep decoding for the
    grace (--drain_grace=2s), then each is handed off with its KV to the other decode worker (the
    KV pushed worker to worker; no re-prefill), every stream equal to a fault-free run, and the
    drained worker exits 0;
  - a hand-off whose target is SIGKILLed while the push is held falls back to re-prefill on a
    third decode worker: the stream still equals its fault-free run;
  - SIGTERM on a prefill worker whose pushes are held: it finishes the prefills it accepted and
    exits 0 only after their KV reached the decode worker; no request fails.
--aggregated: the first case on two aggregated workers (the hand-off goes aggregated to
aggregated).
"""
import os
import re
import signal
import sys
import threading
import time
import unittest

import fault_util as fu

PD = "--pd" in sys.argv
GRACE = "--drain_grace=2s"
TRANSPORT = ["--transport=ucx", "--ucx_tls=tcp"]
STREAMS = 8
LATE = 4          # more requests started during the grace: they must avoid the draining worker
MAX_TOKENS = 300  # 3 s at 10 ms a token: past the 2 s grace


def body(port, i, max_tokens=MAX_TOKENS):
    prompt = f"Request {i}: the ferry leaves at dawn and crosses the strait twice."
    if i % 2 == 0:
        return fu.chat_body(port, prompt, max_tokens)
    return fu.chat_body(port, prompt, max_tokens, temperature=0.8, seed=2800 + i)


def counters(router):
    s = router.metrics()
    out = fu.router_fault_counters(router)
    out["handoff_migrations"] = fu.metric_sum(s, "ferry_router_migrations_total",
                                              cause="drain_handoff")
    out["completed"] = fu.metric_sum(s, "ferry_router_handoffs_total", outcome="completed")
    out["fell_back"] = fu.metric_sum(s, "ferry_router_handoffs_total", outcome="fell_back")
    out["precopied"] = fu.metric_sum(s, "ferry_router_precopies_total", outcome="done")
    out["precopy_failed"] = fu.metric_sum(s, "ferry_router_precopies_total", outcome="failed")
    return out


def delta(after, before):
    return {k: after[k] - before[k] for k in after
            if isinstance(after[k], (int, float)) and not isinstance(after[k], bool)}


def start_streams(port, bodies, results, on_token=None):
    threads = []
    for i, b in enumerate(bodies):
        def work(i=i, b=b):
            results[i] = fu.collect(port, b, on_token)
        t = threading.Thread(target=work)
        t.start()
        threads.append(t)
    return threads


def wait_for(what, predicate, timeout=20):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def inflight(router, worker):
    return router.workers().get(worker.address, {}).get("inflight", 0)


class DrainTest(unittest.TestCase):
    def tearDown(self):
        fu.stop_all()

    def drain_streaming_worker(self, router, streamers, everyone, prefill=None):
        """STREAMS long streams, SIGTERM on the worker of `streamers` that streams the most of
        them once every stream has tokens, LATE more during the grace; returns (the drained
        worker, how many it streamed, the router's counter deltas, the prefills `prefill` made
        meanwhile) after asserting every stream equals its fault-free run and the drained worker
        exited 0."""
        bodies = [body(router.port, i) for i in range(STREAMS + LATE)]
        references = fu.run_all(router.port, bodies, parallel=STREAMS)
        for i, ref in enumerate(references):
            self.assertTrue(ref.done and ref.error is None, f"reference {i}: {ref.describe()}")
        router.wait_up(everyone)
        before = counters(router)
        prefills = lambda: fu.metric_sum(prefill.metrics(), "ferry_worker_requests_total",
                                         outcome="completed") if prefill else 0
        prefills_before = prefills()
        results = [None] * len(bodies)
        with_tokens = set()  # the streams (their Results) that have had a token
        threads = start_streams(router.port, bodies[:STREAMS], results,
                                lambda r: with_tokens.add(id(r)))
        wait_for("every stream's first tokens",
                 lambda: len(with_tokens) == STREAMS and
                 sum(inflight(router, w) for w in streamers) == STREAMS)
        drained = max(streamers, key=lambda w: inflight(router, w))
        on_drained = inflight(router, drained)
        self.assertGreater(on_drained, 0)
        drained.signal(signal.SIGTERM)
        # The worker goes unready at once: the router sees it draining and sends it nothing new.
        wait_for("the router to see the worker draining",
                 lambda: router.workers().get(drained.address, {}).get("drain_state")
                 in ("DRAIN_STATE_DRAINING", "DRAIN_STATE_DRAINED"))
        late = [None] * LATE
        threads += start_streams(router.port, bodies[STREAMS:], late)
        for t in threads:
            t.join()
        results[STREAMS:] = late
        code = drained.proc.wait(timeout=60)
        self.assertEqual(code, 0, f"{drained.name} exited {code}")
        for i, (got, ref) in enumerate(zip(results, references)):
            fu.assert_same_stream(self, got, ref, f"request {i} ({drained.name} drained)")
        d = delta(counters(router), before)
        self.assertEqual(d["failed"], 0, str(d))
        self.assertEqual(d["non_200"], 0, str(d))
        return drained, on_drained, d, prefills() - prefills_before

    def test_drain_hands_off_with_kv(self):
        if PD:
            router, prefill, decodes = fu.Stacks.pd(fu.model_dir(), worker_extra=[GRACE])
            everyone, streamers = [prefill] + decodes, decodes
        else:
            router, workers = fu.Stacks.aggregated(fu.model_dir(),
                                                   worker_extra=[GRACE] + TRANSPORT)
            everyone, streamers = workers, workers
        drained, on_drained, d, prefills = self.drain_streaming_worker(
            router, streamers, everyone, everyone[0] if PD else None)
        other = [w for w in streamers if w is not drained][0]
        s = other.metrics()
        received = fu.metric_sum(s, "ferry_worker_handoffs_received_total")
        received_bytes = fu.metric_sum(s, "ferry_worker_handoff_received_bytes_total")
        # Every request still on the drained worker at its deadline moved with its KV.
        self.assertGreater(received, 0, str(d))
        self.assertGreater(received_bytes, 0)
        self.assertEqual(d["completed"], received, str(d))
        self.assertEqual(d["handoff_migrations"], received, str(d))
        self.assertEqual(d["fell_back"], 0, str(d))
        self.assertEqual(d["migrations"], received, f"a request moved by re-prefill: {d}")
        self.assertLessEqual(received, on_drained)
        # Each was pre-copied to its target while the source drained (the target pulled the KV
        # computed by then; the hand-off pushed the rest).
        self.assertGreaterEqual(d["precopied"], received, str(d))
        self.assertEqual(d["precopy_failed"], 0, str(d))
        pulled = [int(n) for n in re.findall(r"pre-copy of request \S+ from \S+: (\d+) blocks to pull",
                                             other.log())]
        self.assertTrue(pulled and max(pulled) > 0, f"nothing pre-copied: {pulled}")
        if PD:
            # No re-prefill: the prefill worker prefilled each request once.
            self.assertEqual(prefills, STREAMS + LATE)

    @unittest.skipUnless(PD, "P/D only")
    def test_target_dies_mid_push_falls_back_to_reprefill(self):
        hold = os.path.join(fu.TMP, "hold_handoff")
        router, prefill, decodes = fu.Stacks.pd(
            fu.model_dir(), decodes=3, worker_extra=["--drain_grace=1s", f"--push_hold_file={hold}"])
        everyone = [prefill] + decodes
        b = body(router.port, 7)
        ref = fu.collect(router.port, b)
        before = counters(router)
        state = {}

        def on_token(r):
            if "source" not in state and r.tokens() >= 5:
                source = router.streaming_worker(decodes)
                open(hold, "w").close()
                source.signal(signal.SIGTERM)
                state["source"] = source

        results = [None]
        t = start_streams(router.port, [b], results, on_token)[0]
        wait_for("the drain", lambda: "source" in state)
        others = [w for w in decodes if w is not state["source"]]
        # After the grace the request moves to another decode worker, which asks the source for
        # the KV; the source holds the push (and logs that it does): kill the target then.
        target = router.streaming_worker(others, timeout=10)
        wait_for("the source to hold the hand-off push",
                 lambda: "test seam: the hand-off push" in state["source"].log())
        target.kill()
        os.unlink(hold)
        t.join()
        fu.assert_same_stream(self, results[0], ref, "hand-off target killed mid-push")
        code = state["source"].proc.wait(timeout=60)
        self.assertEqual(code, 0)
        d = delta(counters(router), before)
        self.assertEqual(d["failed"], 0, str(d))
        self.assertEqual(d["fell_back"], 1, str(d))
        self.assertEqual(d["completed"], 0, str(d))

    @unittest.skipUnless(PD, "P/D only")
    def test_precopy_target_dies_mid_precopy(self):
        """The worker pre-copying a draining worker's request is SIGKILLed while the source's
        pre-copy push is held: the source survives and drains, and at the deadline the request
        is handed off (all of its KV) to the third decode worker, equal to its fault-free run."""
        hold = os.path.join(fu.TMP, "hold_precopy")
        router, prefill, decodes = fu.Stacks.pd(
            fu.model_dir(), decodes=3, worker_extra=["--drain_grace=2s", f"--push_hold_file={hold}"])
        b = body(router.port, 9)
        router.wait_up([prefill] + decodes)
        # The fault-free run comes after (outputs are deterministic): run first, it would leave
        # the request's blocks cached on a worker that may be the pre-copy's target.
        before = counters(router)
        state = {}

        def on_token(r):
            if "source" not in state and r.tokens() >= 40:  # past the first blocks
                source = router.streaming_worker(decodes)
                open(hold, "w").close()
                source.signal(signal.SIGTERM)
                state["source"] = source

        results = [None]
        t = start_streams(router.port, [b], results, on_token)[0]
        wait_for("the drain", lambda: "source" in state)
        others = [w for w in decodes if w is not state["source"]]
        wait_for("the source to hold the pre-copy push",
                 lambda: "test seam: the pre-copy push" in state["source"].log())
        targets = [w for w in others if "pre-copy of request" in w.log()]
        self.assertEqual(len(targets), 1, "no single pre-copy target")
        targets[0].kill()
        os.unlink(hold)
        t.join()
        code = state["source"].proc.wait(timeout=60)
        self.assertEqual(code, 0)
        d = delta(counters(router), before)
        ref = fu.collect(router.port, b)
        fu.assert_same_stream(self, results[0], ref, "pre-copy target killed mid-pre-copy")
        self.assertEqual(d["failed"], 0, str(d))
        self.assertEqual(d["precopy_failed"], 1, str(d))
        self.assertEqual(d["completed"], 1, str(d))
        self.assertEqual(d["fell_back"], 0, str(d))
        survivor = [w for w in others if w is not targets[0]][0]
        self.assertEqual(fu.metric_sum(survivor.metrics(), "ferry_worker_handoffs_received_total"),
                         1)

    @unittest.skipUnless(PD, "P/D only")
    def test_prefill_drain_finishes_its_pushes(self):
        hold = os.path.join(fu.TMP, "hold_prefill")
        model = fu.model_dir()
        flags = fu.worker_flags(model, 0.01, TRANSPORT + ["--drain_grace=0s"])
        held = fu.Worker("prefill0", "prefill", flags + [f"--push_hold_file={hold}"]).start()
        free = fu.Worker("prefill1", "prefill", flags).start()
        decodes = [fu.Worker(f"decode{i}", "decode", flags).start() for i in range(2)]
        router = fu.Router(model, [held, free] + decodes, (), "router_prefill_drain")
        everyone = [held, free] + decodes
        router.wait_up(everyone)
        bodies = [body(router.port, 100 + i, 24) for i in range(6)]
        references = fu.run_all(router.port, bodies)
        before = counters(router)
        open(hold, "w").close()
        results = [None] * len(bodies)
        threads = []
        # One at a time until the held prefill worker has one (its pushes wait for the file).
        for i in range(len(bodies)):
            threads += start_streams(router.port, [bodies[i]], results[i:i + 1])
            try:
                wait_for("a prefill", lambda: inflight(router, held) + inflight(router, free) > 0,
                         timeout=5)
            except AssertionError:
                pass
            if inflight(router, held) > 0:
                break
        self.assertGreater(inflight(router, held), 0, "no request reached prefill0")
        held.signal(signal.SIGTERM)
        # Its drain has begun (with a 0 s grace only the held pushes keep it), then it must stay.
        wait_for("the router to see prefill0 draining",
                 lambda: router.workers().get(held.address, {}).get("drain_state")
                 == "DRAIN_STATE_DRAINING")
        # Kept: "did not exit" of another process, which exposes no drain step count to wait on; a
        # worker that does not wait for its pushes exits within milliseconds of its drain.
        time.sleep(1.0)
        self.assertIsNone(held.proc.poll(), "the prefill worker exited with pushes pending")
        os.unlink(hold)
        for t in threads:
            t.join()
        code = held.proc.wait(timeout=30)
        self.assertEqual(code, 0)
        started = [i for i, r in enumerate(results) if r is not None]
        for i in started:
            fu.assert_same_stream(self, results[i], references[i], f"request {i}")
        d = delta(counters(router), before)
        self.assertEqual(d["failed"], 0, str(d))
        self.assertEqual(d["migrations"], 0, str(d))


if __name__ == "__main__":
    try:
        unittest.main(argv=[sys.argv[0]], verbosity=2)
    finally:
        fu.finish()
