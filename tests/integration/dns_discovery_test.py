"""Discovery by DNS with real processes (issue 45): a router with --workers_dns and --kvstore_dns
and a worker with --kvstore_dns, against Debian's dnsmasq on a loopback port answering from a
hosts file the test rewrites (as a headless Service's records change when pods come and go).

Workers of one pool share a port and differ by address (127.0.0.N), as pods do. Checked:
  - workers added to and removed from DNS join and leave the router's pool within the re-resolve
    interval (measured from when dnsmasq serves the change), and a request is answered by them;
  - KV store nodes are named by their PTR records (their stable names), and a node that comes
    back on a new address keeps its name; the router's and the worker's store clients follow;
  - a DNS server that stops answering leaves the pool as it was.
"""
import json
import os
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from ferry_services import TMP, get, start, stop_all, wait_for  # noqa: E402
from dnsmasq import Dnsmasq, free_port  # noqa: E402

ROUTER, WORKER, KVSTORE, MODEL = sys.argv[1:5]
INTERVAL_S = 0.2
LINGER_S = 1.0  # --kvstore_dns_linger: how long a store node gone from the DNS stays


def router_workers(admin):
    status, body = get(f"http://127.0.0.1:{admin}/workers")
    if status != 200:
        raise RuntimeError(f"/workers: HTTP {status}")
    return {w["address"]: w.get("state") for w in json.loads(body)}


def log_of(name):
    with open(os.path.join(TMP, name + ".log"), errors="replace") as f:
        return f.read()


class DnsDiscoveryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dns = Dnsmasq()
        cls.dns_flags = [f"--dns_servers=127.0.0.1:{cls.dns.port}", f"--dns_interval={INTERVAL_S}s"]

    @classmethod
    def tearDownClass(cls):
        stop_all()
        cls.dns.stop()

    def start_worker(self, host, port, name, extra=()):
        _, ports = start(WORKER, [f"--model={MODEL}", "--engine=null", "--role=aggregated",
                                  "--null_token_seconds=0.001", "--block_tokens=16",
                                  "--kv_pool_bytes=8MiB", "--threads=1", "--watch_interval=20ms",
                                  f"--address={host}:{port}", f"--admin_host={host}"] +
                         list(extra), name)
        return ports

    def test_workers_and_store_nodes_follow_dns(self):
        hosts = ["127.0.0.11", "127.0.0.12"]
        port = free_port(hosts)
        kv_hosts = ["127.0.0.21", "127.0.0.22", "127.0.0.23"]
        kv_port = free_port(kv_hosts)
        kv = {}
        for i, host in enumerate(kv_hosts):
            d = tempfile.mkdtemp(dir=TMP)
            kv[host] = start(KVSTORE, [f"--dir={d}", f"--address={host}:{kv_port}",
                                       "--capacity=64MiB", "--segment_bytes=8MiB",
                                       "--max_object_bytes=4MiB"], f"kv{i}")
        store_line = "127.0.0.21 kv-0.kv.ferry.test kv.ferry.test"
        self.dns.serve(["127.0.0.11 pool.ferry.test", store_line], "pool.ferry.test",
                       ["127.0.0.11"])

        linger = [f"--kvstore_dns_linger={LINGER_S}s"]
        self.start_worker(hosts[0], port, "w1", [f"--kvstore_dns=kv.ferry.test:{kv_port}"] +
                          linger + self.dns_flags)
        self.start_worker(hosts[1], port, "w2")
        _, r = start(ROUTER, [f"--model={MODEL}", "--served_model_name=tiny",
                              f"--workers_dns=pool.ferry.test:{port}",
                              f"--kvstore_dns=kv.ferry.test:{kv_port}"] + linger + self.dns_flags,
                     "router")
        admin = r["admin_port"]
        a1, a2 = f"127.0.0.11:{port}", f"127.0.0.12:{port}"
        wait_for(lambda: router_workers(admin) == {a1: "up"}, "worker 1 up at the router")
        kv0 = f"kv-0.kv.ferry.test:{kv_port}"
        for name in ("router", "w1"):
            wait_for(lambda: f"KV store nodes from DNS (kv.ferry.test:{kv_port}): {kv0}\n"
                     in log_of(name), f"{name}'s store node kv-0 by its stable name")

        # A second worker and two more store nodes appear.
        self.dns.serve(["127.0.0.11 pool.ferry.test", "127.0.0.12 pool.ferry.test", store_line,
                        "127.0.0.22 kv-1.kv.ferry.test kv.ferry.test",
                        "127.0.0.23 kv-2.kv.ferry.test kv.ferry.test"],
                       "pool.ferry.test", ["127.0.0.11", "127.0.0.12"])
        served = time.monotonic()
        wait_for(lambda: router_workers(admin) == {a1: "up", a2: "up"}, "worker 2 up at the router")
        # Seen within an interval (plus the lookups of a round and the worker's first Watch
        # message, on a loaded machine).
        took = time.monotonic() - served
        print(f"worker change seen by the router {took:.2f} s after DNS served it", file=sys.stderr)
        self.assertLess(took, INTERVAL_S + 3)
        nodes = ", ".join(f"kv-{i}.kv.ferry.test:{kv_port}" for i in range(3))
        for name in ("router", "w1"):
            wait_for(lambda: f"): {nodes}\n" in log_of(name), f"{name}'s three store nodes")
            took = time.monotonic() - served
            print(f"store nodes added seen by {name} {took:.2f} s after DNS served them",
                  file=sys.stderr)
            self.assertLess(took, INTERVAL_S + 3)

        # Requests are served (by either worker).
        for _ in range(4):
            req = urllib.request.Request(
                f"http://127.0.0.1:{r['http_port']}/v1/completions",
                json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4}).encode(),
                {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                self.assertEqual(resp.status, 200)

        # Worker 1's pod goes: it leaves the pool (its Watch stream is cancelled); kv-1 comes
        # back on a new address under its name, so the store set does not change.
        self.dns.serve(["127.0.0.12 pool.ferry.test", store_line,
                        "127.0.0.24 kv-1.kv.ferry.test kv.ferry.test",
                        "127.0.0.23 kv-2.kv.ferry.test kv.ferry.test"],
                       "pool.ferry.test", ["127.0.0.12"])
        served = time.monotonic()
        wait_for(lambda: router_workers(admin) == {a2: "up"}, "worker 1 gone from the router")
        took = time.monotonic() - served
        print(f"worker change seen by the router {took:.2f} s after DNS served it", file=sys.stderr)
        self.assertLess(took, INTERVAL_S + 3)

        # kv-2 leaves: it stays for the linger (its pod may be being replaced), then leaves. The
        # clock starts before DNS serves the change: no lookup can miss kv-2 earlier.
        changing = time.monotonic()
        self.dns.serve(["127.0.0.12 pool.ferry.test", store_line,
                        "127.0.0.24 kv-1.kv.ferry.test kv.ferry.test"],
                       "kv.ferry.test", ["127.0.0.21", "127.0.0.24"])
        two = ", ".join(f"kv-{i}.kv.ferry.test:{kv_port}" for i in range(2))
        for name in ("router", "w1"):
            wait_for(lambda: f"): {two}\n" in log_of(name), f"{name}'s store nodes after kv-2 left")
            took = time.monotonic() - changing
            print(f"store node removal seen by {name} {took:.2f} s after DNS changed (linger "
                  f"{LINGER_S} s)", file=sys.stderr)
            self.assertGreaterEqual(took, LINGER_S)
            # Within the linger, an interval and a round's lookups (a loaded machine's margin).
            self.assertLess(took, LINGER_S + INTERVAL_S + 3)
            # Every set the store clients got, in order: kv-1's new address changed none.
            sets = [line.split("): ", 1)[1] for line in log_of(name).splitlines()
                    if f"KV store nodes from DNS (kv.ferry.test:{kv_port}): " in line]
            self.assertEqual(sets, [kv0, nodes, two], name)

        # The DNS server stops answering: after two failed rounds, the pool is as it was.
        changes = log_of("router").count("workers from DNS (")
        self.dns.stop()
        failed = "workers: DNS lookup of 'pool.ferry.test': "
        wait_for(lambda: log_of("router").count(failed) >= 2, "two failed rounds at the router")
        self.assertEqual(router_workers(admin), {a2: "up"})
        self.assertEqual(log_of("router").count("workers from DNS ("), changes)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
