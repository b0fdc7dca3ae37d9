#!/usr/bin/env python3
"""A network partition (issue 27; ARCHITECTURE.md §7): the decode worker streaming a request is
cut off mid-stream by an nftables drop rule inside its network namespace.

  partition_test.py FERRY_ROUTER FERRY_WORKER MODEL

The test runs in a network namespace of its own (the lab: nothing it does shows in the
machine's). Each of two decode workers runs in a network namespace of its own, joined to the
lab by a veth pair (10.213.x addresses), listening on its veth address; a prefill worker and the
router run in the lab; the KV moves over UCX pinned to tcp on the veth interfaces (shared memory
does not cross namespaces). Mid-stream, the namespace of the worker streaming the request drops
every packet but loopback's: the router's Watch stream falls silent, and the request must move
to the other decode worker within --heartbeat_timeout (1 s) plus a margin and complete equal to
a fault-free run. As soon as tokens flow again the rule goes, while the migrated stream still
runs: what the cut-off worker sent in the meantime must not reach the client; the worker must
rejoin and let go of its copy of the request, which went on computing while cut off (cancelled,
or aborted by id once it is back, or finished meanwhile: which one is a matter of timing, so
only that it lets go is checked, and the outcome printed).

Needs root, ip, nft, unshare and nsenter. Under CI=true a missing one fails the test; otherwise
it skips with a message. The namespaces and veths are removed at the end, also on failure (and
die with the test: the lab is the test process's, the others' holders have PR_SET_PDEATHSIG).
"""
import os
import shutil
import sys
import threading
import time
import unittest

import fault_util as fu

HEARTBEAT_TIMEOUT = 1.0
MAX_TOKENS = 150  # the cut-off copy still runs when the worker is back: Abort by id finds it
CUT_AT = 10
TOKEN_SECONDS = 0.02
WATCHDOG_MARGIN = 4.0


LAB = "FERRY_FAULT_LAB"  # set once this process runs in its own network namespace


def missing():
    """Why this machine cannot run the test ("" when it can)."""
    if os.geteuid() != 0:
        return "not root"
    lacking = [t for t in ("ip", "nft", "unshare", "nsenter", "mount") if shutil.which(t) is None]
    if lacking:
        return f"missing {', '.join(lacking)}"
    probe = fu.run(["unshare", "--net", "--mount", "true"], check=False)
    return f"cannot unshare a network namespace: {probe.strip()}" if probe.strip() else ""


def enter_lab():
    """Runs this script again in a network and mount namespace of its own (the lab), so that the
    veths, addresses and rules it makes never show in the machine's namespace: other tests'
    UCX tcp workers list that one's interfaces, and must not see them come and go. Everything
    the test starts lives in the lab, and the lab ends with it."""
    os.environ[LAB] = "1"
    os.execvp("unshare", ["unshare", "--net", "--mount", "--propagation", "private", "--",
                          sys.executable, os.path.abspath(sys.argv[0])] + sys.argv[1:])


class PartitionTest(unittest.TestCase):
    namespaces = []

    @classmethod
    def setUpClass(cls):
        why = os.environ.get(LAB + "_MISSING", "")
        if why:
            if fu.in_ci():
                raise AssertionError(f"partition_test must run under CI: {why} (root, and "
                                     "nftables from ./ferry setup)")
            raise unittest.SkipTest(f"partition_test needs root, ip, nft, unshare, nsenter: {why}")
        # The lab's own /sys (UCX lists network devices from /sys/class/net) and loopback.
        fu.run(["umount", "-l", "/sys"], check=False)
        fu.run(["mount", "-t", "sysfs", "sysfs", "/sys"])
        fu.run(["ip", "link", "set", "lo", "up"])
        try:
            for side, subnet in (("a", "10.213.1"), ("b", "10.213.2")):
                cls.namespaces.append(fu.Netns(side, subnet))
        except AssertionError as e:
            cls.tearDownClass()
            if fu.in_ci():
                raise
            raise unittest.SkipTest(f"cannot make network namespaces here: {e}")
        a, b = cls.namespaces
        model = fu.model_dir()
        flags = fu.worker_flags(model, TOKEN_SECONDS, ["--transport=ucx", "--ucx_tls=tcp",
                                                       "--watch_heartbeat=200ms"])
        cls.prefill = fu.Worker("prefill", "prefill", flags, wrap=[
            "env", "UCX_TLS=tcp", f"UCX_NET_DEVICES={a.host_if},{b.host_if}"]).start()
        cls.decode = [
            fu.Worker(f"decode_{side}", "decode", flags, host=ns.ip, wrap=ns.enter_with_sysfs() +
                      ["env", "UCX_TLS=tcp", f"UCX_NET_DEVICES={ns.ns_if}"]).start()
            for side, ns in zip("ab", cls.namespaces)]
        cls.netns_of = dict(zip([w.name for w in cls.decode], cls.namespaces))
        cls.router = fu.Router(model, [cls.prefill] + cls.decode,
                               [f"--heartbeat_timeout={HEARTBEAT_TIMEOUT}s"])
        cls.router.wait_up([cls.prefill] + cls.decode)

    @classmethod
    def tearDownClass(cls):
        fu.stop_all()
        for ns in cls.namespaces:
            ns.close()

    def test_partition_mid_stream(self):
        body = fu.chat_body(self.router.port, "Which way does the ferry turn?", MAX_TOKENS)
        ref = fu.collect(self.router.port, body)
        self.assertTrue(ref.done and ref.error is None, f"reference: {ref.describe()}")
        before = fu.router_fault_counters(self.router)
        cut = {}

        def on_token(r):
            now = time.monotonic()
            if "ns" not in cut and r.tokens() >= CUT_AT:
                w = self.router.streaming_worker(self.decode)
                ns = self.netns_of[w.name]
                ns.partition()
                cut.update(worker=w, ns=ns, at=now, tokens=r.tokens())
                watchdog.start()
            elif "resumed" not in cut and "ns" in cut and now - cut["at"] > HEARTBEAT_TIMEOUT / 2:
                # Tokens flow again, and not ones sent before the cut (those arrive at once): the
                # request moved. Heal while this stream still runs: what the cut-off worker sent
                # meanwhile now reaches the router, and must not reach this client.
                cut["resumed"] = now
                cut["ns"].heal()

        def heal():  # the request never moved: let the stream end rather than hang
            cut["watchdog"] = True
            cut["ns"].heal()

        watchdog = threading.Timer(HEARTBEAT_TIMEOUT + WATCHDOG_MARGIN, heal)
        try:
            got = fu.collect(self.router.port, body, on_token)
        finally:
            watchdog.cancel()
            if "ns" in cut:
                cut["ns"].heal()
        self.assertIn("ns", cut, f"never cut a worker off: {got.describe()}")
        w = cut["worker"]
        self.assertFalse(cut.get("watchdog"),
                         f"no token for {HEARTBEAT_TIMEOUT + WATCHDOG_MARGIN} s after {w.name} "
                         f"was cut off (the request did not move); healed: {got.describe()}")
        fu.assert_same_stream(self, got, ref, f"{w.name} cut off at token {cut['tokens']}")
        moved_after = cut["resumed"] - cut["at"]
        self.assertLess(moved_after, HEARTBEAT_TIMEOUT + WATCHDOG_MARGIN)
        after = fu.router_fault_counters(self.router)
        self.assertEqual(after["migrations"] - before["migrations"], 1)
        self.assertEqual(after["worker_down"] - before["worker_down"], 1,
                         "a silent worker's request moves with cause worker_down")
        self.assertEqual(after["failed"] - before["failed"], 0)

        # Healed: it rejoins and holds nothing.
        self.router.wait_up([self.prefill] + self.decode, timeout=60)
        deadline = time.monotonic() + 20
        while w.busy() > 0:
            self.assertLess(time.monotonic(), deadline, f"{w.name} still holds requests")
            time.sleep(0.05)
        s = w.metrics()
        print(f"moved {moved_after:.2f} s after the cut; the cut-off worker's requests ended: " +
              str({o: fu.metric_sum(s, "ferry_worker_requests_total", outcome=o)
                   for o in ("completed", "aborted", "cancelled")}) + "; router orphan aborts: " +
              str(fu.samples_of(self.router.metrics(), "ferry_router_orphan_aborts_total")),
              file=sys.stderr)
        # And the stack serves on.
        r = fu.collect(self.router.port, fu.chat_body(self.router.port, "And now?", 16))
        self.assertTrue(r.done and r.error is None and r.usage["completion_tokens"] == 16,
                        f"after the partition: {r.describe()}")


if __name__ == "__main__":
    if LAB not in os.environ:
        why = missing()
        if not why:
            enter_lab()  # does not return
        os.environ[LAB + "_MISSING"] = why
    try:
        unittest.main(argv=[sys.argv[0]], verbosity=2)
    finally:
        fu.finish()
        for ns in PartitionTest.namespaces:
            ns.close()
