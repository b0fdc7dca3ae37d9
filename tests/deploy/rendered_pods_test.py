#!/usr/bin/env python3
"""rendered_pods.py on a fixture in the contract's shape (testdata/rendered_cpu.yaml): env from
the Downward API, a ConfigMap and resource limits; Kubernetes' $(VAR) expansion, escapes and
unknown references included; Secret volumes as files; the StatefulSet's stable names; the
hosts lines the smoke test serves over DNS; and what must be refused.

  rendered_pods_test.py FIXTURE
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import rendered_pods as rp  # noqa: E402

FIXTURE = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.realpath(__file__)), "testdata", "rendered_cpu.yaml")


def objects():
    with open(FIXTURE) as f:
        return rp.load(f.read())


class ExpandTest(unittest.TestCase):
    def test_kubernetes_rules(self):
        v = {"A": "1", "B": "two"}
        self.assertEqual(rp.expand("$(A)-$(B)", v), "1-two")
        self.assertEqual(rp.expand("$$(A)", v), "$(A)")          # escaped
        self.assertEqual(rp.expand("$(C)", v), "$(C)")           # unknown: as written
        self.assertEqual(rp.expand("x$(", v), "x$(")             # unterminated
        self.assertEqual(rp.expand("$x$", v), "$x$")             # $ before anything else
        self.assertEqual(rp.expand("$$$$", v), "$$")
        self.assertEqual(rp.expand("", v), "")


class PodsTest(unittest.TestCase):
    def setUp(self):
        self.objects = objects()
        self.by_name = {w.name: w for w in rp.workloads(self.objects)}

    def test_decode_worker_command_line(self):
        w = self.by_name["ferry-decode"]
        self.assertEqual(w.component(), "decode")
        self.assertEqual(w.replicas, 3)
        pod = w.pod(1, "127.9.9.4")
        self.assertEqual(pod.name, "ferry-decode-smoke-1")
        (c,) = pod.containers
        self.assertFalse(c.has_command)
        self.assertEqual(c.env["POD_IP"], "127.9.9.4")
        self.assertEqual(c.env["UCX_TCP_PORT_RANGE"], "50100-50199")  # envFrom a ConfigMap
        self.assertEqual(c.env["THREADS"], "2")                       # ceil(1500m)
        self.assertEqual(c.env["GRPC"], "127.9.9.4:50051")            # an earlier variable
        self.assertIn("--advertise_address=127.9.9.4", c.argv)
        self.assertIn("--worker_id=ferry-decode-smoke-1", c.argv)
        self.assertIn("--threads=2", c.argv)
        self.assertIn("--note=127.9.9.4:50051 $(UNDEFINED) $(POD_IP) $(", c.argv)
        self.assertEqual(c.flag("admin_port"), "9091")
        self.assertEqual(c.flag("absent", "d"), "d")
        self.assertEqual(c.readiness, {"path": "/readyz", "port": 9091})  # a named port
        kinds = {m.path: m.kind for m in c.mounts}
        self.assertEqual(kinds, {"/models": "claim", "/etc/ferry/token": "secret",
                                 "/tmp": "emptyDir"})
        token = [m for m in c.mounts if m.kind == "secret"][0]
        self.assertTrue(token.read_only)
        self.assertEqual(token.files, {"token": b"example-token-old\nexample-token-new\n"})

    def test_statefulset_pod(self):
        w = self.by_name["ferry-kvstore"]
        pod = w.pod(0, "127.9.9.6")
        self.assertEqual((pod.name, pod.hostname, pod.subdomain),
                         ("ferry-kvstore-0", "ferry-kvstore-0", "ferry-kvstore"))
        (c,) = pod.containers
        self.assertTrue(c.has_command)
        self.assertEqual(c.argv[0], "/usr/local/bin/ferry-kvstore")
        self.assertIn("--advertise_address=127.9.9.6", c.argv)
        self.assertEqual([(m.path, m.kind) for m in c.mounts], [("/data", "claim")])

    def test_services(self):
        s = rp.services(self.objects)
        self.assertEqual(s["ferry-decode"][1], True)
        self.assertEqual(s["ferry-router"][1], False)
        self.assertEqual(s["ferry-kvstore"][0]["app.kubernetes.io/component"], "kvstore")

    def test_api_keys_secret_with_string_data(self):
        self.assertEqual(rp._secret_data(self.objects, "ferry-api-keys")["keys.json"][:9],
                         b'{"keys": ')

    def test_refused(self):
        with open(FIXTURE) as f:
            text = f.read()
        bad = text.replace("mountPath: /etc/ferry/token\n",
                           "mountPath: /etc/ferry/token\n          subPath: token\n")
        with self.assertRaisesRegex(rp.UnsupportedError, "subPath"):
            [w.pod(0, "127.9.9.2") for w in rp.workloads(rp.load(bad))]
        bad = text.replace("fieldPath: metadata.name", "fieldPath: metadata.uid")
        with self.assertRaisesRegex(rp.UnsupportedError, "metadata.uid"):
            [w.pod(0, "127.9.9.2") for w in rp.workloads(rp.load(bad))]
        with self.assertRaises(KeyError):
            rp.find(self.objects, "Secret", "absent")


class SmokeHelpersTest(unittest.TestCase):
    """The parts of image_smoke_test.py that need no daemon."""

    def test_hosts_lines_and_rewrites(self):
        import image_smoke_test as st
        self.assertEqual(st.listen_rewrite("--address=0.0.0.0:50051", "127.9.9.3"),
                         "--address=127.9.9.3:50051")
        self.assertEqual(st.listen_rewrite("--admin_host=0.0.0.0", "127.9.9.3"),
                         "--admin_host=127.9.9.3")
        self.assertEqual(st.listen_rewrite("--kvstore_dns=ferry-kvstore:7400", "127.9.9.3"),
                         "--kvstore_dns=ferry-kvstore:7400")
        self.assertEqual(st.go_duration_seconds("1m30s"), 90)
        self.assertEqual(st.go_duration_seconds("250ms"), 0.25)
        stack = st.Stack(None, {}, objects(), "/models", "/tmp")
        stack.base = "127.9.9"
        workloads = {w.name: w for w in rp.workloads(stack.objects)}
        stack.pods = [(workloads["ferry-decode"], workloads["ferry-decode"].pod(0, "127.9.9.4")),
                      (workloads["ferry-decode"], workloads["ferry-decode"].pod(1, "127.9.9.5")),
                      (workloads["ferry-kvstore"], workloads["ferry-kvstore"].pod(0, "127.9.9.6"))]
        self.assertEqual(sorted(stack.hosts_lines()), [
            "127.9.9.4 ferry-decode.ferry.svc.cluster.local ferry-decode",
            "127.9.9.5 ferry-decode.ferry.svc.cluster.local ferry-decode",
            "127.9.9.6 ferry-kvstore-0.ferry-kvstore.ferry.svc.cluster.local "
            "ferry-kvstore.ferry.svc.cluster.local ferry-kvstore"])


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
