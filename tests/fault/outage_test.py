#!/usr/bin/env python3
"""No request lost to a transient (issue 44): the router retries under a new attempt id and waits
through outages, on real processes on loopback (null engine, fault_util.py).

  outage_test.py FERRY_ROUTER FERRY_WORKER MODEL

- The retry race, placed by events: a P/D stack (one prefill, two decode workers); the decode
  worker serving a request is SIGKILLed before the request's first token, alternately while the
  prefill worker computes the prompt (the router has its Prefill call in flight; the null engine
  computes the prompt at 1,000 tokens/s: over half a second, against the 50 ms poll that finds
  the call) and while its KV push waits (the
  prefill worker's push seam holds it and logs so). The
  router retries on the other decode worker and the same prefill worker, which may still hold the
  first attempt: every attempt has its own id, so it never answers ALREADY_EXISTS (the client's
  409 of old). 20 repetitions: every stream completes equal to its fault-free run, 20 retries, no
  collision, no failed request, no non-200 answer.
- The only decode worker restarted while streams run (and while a new request arrives): the
  running streams migrate to nothing, wait in the router's queue, and finish equal to their
  fault-free runs once the worker is back; the new request waits too instead of a 503. The time
  from the restarted worker's readiness to the router taking it up is printed (the registry's
  reconnect interval is unit-tested on a fake clock: worker_registry_test).
"""
import os
import signal
import sys
import threading
import time
import unittest

import fault_util as fu

REPETITIONS = 20
MAX_TOKENS = 16
TRANSPORT = ["--transport=ucx", "--ucx_tls=tcp"]


def counters(router):
    s = router.metrics()
    c = fu.router_fault_counters(router)
    c["retries"] = fu.metric_sum(s, "ferry_router_retries_total")
    c["collisions"] = fu.metric_sum(s, "ferry_router_attempt_collisions_total")
    c["queue_waits"] = fu.metric_sum(s, "ferry_router_queue_wait_seconds_count")
    c["expired"] = fu.metric_sum(s, "ferry_router_queue_expired_total")
    c["code_409"] = sum(v for k, v in s.items()
                        if k.startswith("ferry_router_requests_total{") and 'code="409"' in k)
    return c


def delta(after, before):
    return {k: after[k] - before[k] for k in after if not isinstance(after[k], bool)}


def prompt(i, words):
    return f"Request {i}: " + " ".join(f"word{(i * 7 + j) % 97}" for j in range(words))


class OutageTest(unittest.TestCase):
    def tearDown(self):
        fu.stop_all()
        fu.keep_logs()

    def test_retry_race_never_collides(self):
        hold = os.path.join(fu.TMP, "hold_push")
        model = fu.model_dir()
        # Slow prefill in small chunks: a request's prompt takes many engine steps.
        flags = fu.worker_flags(model, 0.01, TRANSPORT)
        prefill = fu.Worker("prefill", "prefill", flags + [
            "--null_prefill_tokens_per_second=1000", f"--push_hold_file={hold}"]).start()
        decodes = [fu.Worker(f"decode{i}", "decode", flags).start() for i in range(2)]
        router = fu.Router(model, [prefill] + decodes, (), "router_retry")
        everyone = [prefill] + decodes
        router.wait_up(everyone)
        bodies = [fu.chat_body(router.port, prompt(i, 150), MAX_TOKENS,
                               temperature=0.0 if i % 2 == 0 else 0.7,
                               seed=None if i % 2 == 0 else 500 + i)
                  for i in range(REPETITIONS)]
        references = fu.run_all(router.port, bodies)
        prompt_tokens = min(r.usage["prompt_tokens"] for r in references if r.usage)
        self.assertGreater(prompt_tokens, 500, "the prompt must take the prefill worker a while")
        # A fresh prefill worker: the references' prompts are not in its cache.
        prefill.kill()
        prefill.start()
        router.wait_up(everyone)
        before = counters(router)
        started = time.monotonic()
        for i, b in enumerate(bodies):
            for w in everyone:
                if w.proc.poll() is not None:
                    w.start()
            router.wait_up(everyone)
            during_push = i % 2 == 1
            if during_push:
                open(hold, "w").close()
            pushes_held = prefill.log().count("test seam: holding the prefill push")
            results = [None]

            def run():
                results[0] = fu.collect(router.port, b)

            t = threading.Thread(target=run)
            t.start()
            if during_push:
                # The prompt is computed and its push waits on the seam.
                fu.wait_for(lambda: prefill.log().count(
                    "test seam: holding the prefill push") > pushes_held, "the held push", 20)
            else:
                # The router's Prefill call is in flight (the prompt takes 500+ ms to compute).
                fu.wait_for(lambda: router.workers().get(prefill.address, {}).get(
                    "inflight", 0) > 0, "the prefill call", 20)
            victim = router.streaming_worker(decodes)
            victim.kill()
            if during_push:
                os.unlink(hold)
            t.join()
            what = f"request {i} (decode worker killed during the {'push' if during_push else 'prefill'})"
            fu.assert_same_stream(self, results[0], references[i], what)
        elapsed = time.monotonic() - started
        d = delta(counters(router), before)
        print(f"{REPETITIONS} retry races in {elapsed:.1f} s ({prompt_tokens}+ prompt tokens, "
              f"a prefill of {prompt_tokens / 1000:.2f}+ s): {d}", file=sys.stderr)
        self.assertEqual(d["collisions"], 0, str(d))
        self.assertEqual(d["code_409"], 0, str(d))
        self.assertEqual(d["non_200"], 0, str(d))
        self.assertEqual(d["failed"], 0, str(d))
        self.assertEqual(d["migrations"], 0, f"a kill landed after the first token: {d}")
        self.assertGreaterEqual(d["retries"], REPETITIONS, str(d))
        # The abandoned first attempts were aborted on the prefill worker, and (most of them) were
        # still there: the retry would have met them under a reused id.
        self.assertGreater(d["orphan_found"], 0, str(d))
        self.assertLess(elapsed, 60, "20 repetitions within a minute")

    def test_the_only_decode_worker_restarts_while_streams_run(self):
        model = fu.model_dir()
        flags = fu.worker_flags(model, 0.02, TRANSPORT)
        prefill = fu.Worker("prefill", "prefill", flags).start()
        decode = fu.Worker("decode0", "decode", flags).start()
        router = fu.Router(model, [prefill, decode], (), "router_restart")
        router.wait_up([prefill, decode])
        bodies = [fu.chat_body(router.port, prompt(100 + i, 20), 40,
                               temperature=0.0 if i % 2 == 0 else 0.9,
                               seed=None if i % 2 == 0 else 900 + i) for i in range(5)]
        references = fu.run_all(router.port, bodies, parallel=5)
        before = counters(router)
        results = [None] * len(bodies)
        ready = threading.Event()

        def on_token(r):
            if r.tokens() >= 4:
                ready.set()

        def run(k):
            results[k] = fu.collect(router.port, bodies[k], on_token if k == 0 else None)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        self.assertTrue(ready.wait(20), "no token arrived")
        decode.kill()
        # The router sees it down (its streams broke: they wait in the queue for a decode worker).
        fu.wait_for(lambda: router.workers()[decode.address]["state"] != "up",
                    "the router to see the decode worker down", 20)
        # A new request while no decode worker is up waits too (no 503).
        late = threading.Thread(target=run, args=(4,))
        late.start()
        fu.wait_for(lambda: fu.metric_sum(router.metrics(), "ferry_router_queue_depth") >= 1,
                    "the new request to wait", 20)
        decode.start()  # on its address: start() returns once it is ready
        restarted = time.monotonic()
        router.wait_up([decode])
        seen = time.monotonic() - restarted
        for t in threads + [late]:
            t.join()
        for k, r in enumerate(results):
            fu.assert_same_stream(self, r, references[k], f"stream {k} across the restart")
        d = delta(counters(router), before)
        print(f"restarted decode worker taken up {seen * 1000:.0f} ms after its readiness; {d}",
              file=sys.stderr)
        self.assertEqual(d["failed"], 0, str(d))
        self.assertEqual(d["non_200"], 0, str(d))
        self.assertEqual(d["expired"], 0, str(d))
        self.assertGreaterEqual(d["migrations"], 4, str(d))
        self.assertGreaterEqual(d["queue_waits"], 1, str(d))


if __name__ == "__main__":
    try:
        unittest.main(argv=[sys.argv[0]], verbosity=2)
    finally:
        fu.finish()
