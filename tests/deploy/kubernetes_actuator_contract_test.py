"""The Kubernetes actuator's contract (issue 46): the exact requests it sends to the API server,
and the RBAC that deploy/k8s grants it.

  kubernetes_actuator_contract_test.py DRIVER [unittest args]

DRIVER is tests/deploy/kubernetes_actuator_driver (the actuator behind a JSON-lines pipe). The API
server is kmock (PyPI, a mock of the Kubernetes API) serving over HTTPS with a certificate of a
CA made for the test (openssl): the Deployments ferry-prefill and ferry-decode (GET, and their
scale subresource, GET and PATCH with the resourceVersion precondition of a real API server:
409 Conflict when stale) and the pods of both pools (list by label selector, PATCH merging
annotations), with Kubernetes' Status objects for errors. Each test asserts the requests the
actuator sent, in order: method, path, query, content type, bearer token and body.

- scale-out: GET scale, PATCH scale with {"metadata":{"resourceVersion"},"spec":{"replicas"}};
- scale-in: GET scale, the pool's pods listed by its selector, pod-deletion-cost PATCHed on each
  pod whose cost changed (least-loaded lowest; a terminating pod left alone), then PATCH scale;
- errors: 403 Forbidden and 404 with the API server's message; 409 Conflict retried while the
  replicas are unchanged, Aborted when someone else scaled; a server that never answers
  (DeadlineExceeded by the call's deadline); hostile answers (not JSON, a body over the limit,
  an HTML 502); a CA that did not sign the server's certificate, or a certificate for another
  host (Unavailable); the token file rotated between calls (the new token sent);
- RBAC: every (verb, resource, name) the actuator called is granted by the Role ferry-planner
  rendered from both overlays, bound to the ServiceAccount the ferry-planner Deployment runs as,
  and the Role grants nothing it did not call.

The server never sleeps: a hanging answer waits on an event the test sets when the call is over.
Needs FERRY_DEPLOY_PYTHON (kmock, PyYAML), openssl and kubectl (FERRY_KUBECTL or the PATH).
"""

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import unittest

import aiohttp.test_utils
import kmock

HERE = os.path.dirname(os.path.abspath(__file__))
for _d in (HERE, os.path.dirname(os.path.realpath(__file__))):
    sys.path.insert(0, os.path.join(_d, "..", "..", "deploy", "k8s", "tests"))
import k8s_render  # noqa: E402

DRIVER = None  # argv[1]
NS = "ferry"
COST = "controller.kubernetes.io/pod-deletion-cost"
MERGE_PATCH = "application/merge-patch+json"
DEPLOYMENT = r"/apis/apps/v1/namespaces/ferry/deployments/([a-z0-9-]+)"
PODS = "/api/v1/namespaces/ferry/pods"
DECODE_SELECTOR = ("labelSelector=app.kubernetes.io%2Fname%3Dferry%2C"
                   "app.kubernetes.io%2Fcomponent%3Ddecode")
CALL_TIMEOUT_S = 30  # the test's own bound on one driver answer


# ------------------------------------------------------------------------------------------------
# A test CA and server certificates.

class Certificates:
    """A CA, another CA, and server certificates signed by the first: one for 127.0.0.1 and one
    for the name kubernetes.default.svc only."""

    def __init__(self, directory):
        self.dir = directory
        openssl = shutil.which("openssl")
        if not openssl:
            if os.environ.get("CI") == "true":
                raise AssertionError("openssl is not on the PATH (./ferry setup installs it)")
            raise unittest.SkipTest("openssl is not on the PATH (./ferry setup installs it)")
        self.openssl = openssl
        self.ca = self._ca("ca")
        self.other_ca = self._ca("other-ca")
        self.server_ip = self._server("server-ip", "IP:127.0.0.1")
        self.server_name = self._server("server-name", "DNS:kubernetes.default.svc")

    def _run(self, *args):
        subprocess.run([self.openssl, *args], check=True, capture_output=True, timeout=60)

    def _ca(self, name):
        crt, key = (os.path.join(self.dir, name + ext) for ext in (".crt", ".key"))
        self._run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                  "-nodes", "-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=" + name,
                  "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign")
        return crt, key

    def _server(self, name, san):
        crt, key, csr, ext = (os.path.join(self.dir, name + e)
                              for e in (".crt", ".key", ".csr", ".ext"))
        with open(ext, "w", encoding="utf-8") as f:
            f.write("subjectAltName=%s\nextendedKeyUsage=serverAuth\n" % san)
        self._run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                  "-keyout", key, "-out", csr, "-subj", "/CN=kube-apiserver")
        self._run("x509", "-req", "-in", csr, "-CA", self.ca[0], "-CAkey", self.ca[1],
                  "-CAcreateserial", "-out", crt, "-days", "2", "-extfile", ext)
        return crt, key

    def context(self, server):
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(*server)
        return ctx


@contextlib.contextmanager
def quiet_handshake_failures():
    """The server's asyncio logs a refused handshake ("Error on transport creation") with a
    traceback: expected where the client refuses the certificate."""
    log = logging.getLogger("asyncio")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def tls_server_class(context):
    """aiohttp's RawTestServer serving TLS with `context` (kmock.Server's server class)."""
    class TlsServer(aiohttp.test_utils.RawTestServer):
        async def start_server(self, loop=None, **kwargs):
            return await super().start_server(loop=loop, ssl=context, **kwargs)
    return TlsServer


# ------------------------------------------------------------------------------------------------
# The cluster kmock serves.

class Cluster:
    """Deployments and pods of the namespace ferry, as an API server would serve them."""

    def __init__(self):
        self.version = 100
        self.deployments = {
            "ferry-prefill": {"replicas": 1, "ready": 1, "generation": 1, "observed": 1},
            "ferry-decode": {"replicas": 3, "ready": 2, "generation": 4, "observed": 4},
        }
        self.rv = {name: self._next() for name in self.deployments}
        self.pods = {}
        for name, ip, component, load in (
                ("ferry-decode-a", "10.0.0.1", "decode", None),
                ("ferry-decode-b", "10.0.0.2", "decode", None),
                ("ferry-decode-c", "10.0.0.3", "decode", "2"),
                ("ferry-decode-gone", "10.0.0.4", "decode", None),
                ("ferry-prefill-a", "10.0.1.1", "prefill", None)):
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": NS, "labels": {
                       "app.kubernetes.io/name": "ferry",
                       "app.kubernetes.io/component": component}},
                   "status": {"phase": "Running", "podIP": ip}}
            if load is not None:
                pod["metadata"]["annotations"] = {COST: load}
            self.pods[name] = pod
        self.pods["ferry-decode-gone"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        # Hooks a test sets: called before a PATCH of a scale is judged.
        self.before_scale_patch = None

    def _next(self):
        self.version += 1
        return str(self.version)

    def touch(self, name, replicas=None):
        """Someone else changed Deployment `name` (its status, or with replicas its spec)."""
        if replicas is not None:
            self.deployments[name]["replicas"] = replicas
            self.deployments[name]["generation"] += 1
        self.rv[name] = self._next()

    def _deployment(self, request):
        name = request.name
        if name not in self.deployments:
            raise kmock.KubernetesError(404, "NotFound",
                                        'deployments.apps "%s" not found' % name)
        return name, self.deployments[name]

    def get_deployment(self, request):
        name, d = self._deployment(request)
        status = {"observedGeneration": d["observed"], "replicas": d["replicas"]}
        if d["ready"]:
            status["readyReplicas"] = d["ready"]
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": NS, "generation": d["generation"],
                             "resourceVersion": self.rv[name]},
                "spec": {"replicas": d["replicas"]}, "status": status}

    def get_scale(self, request):
        name, d = self._deployment(request)
        spec = {"replicas": d["replicas"]} if d["replicas"] else {}  # omitempty
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": NS, "resourceVersion": self.rv[name]},
                "spec": spec, "status": {"replicas": d["replicas"]}}

    def patch_scale(self, request):
        name, d = self._deployment(request)
        if self.before_scale_patch is not None:
            self.before_scale_patch(name)
        patch = request.data
        want = patch.get("metadata", {}).get("resourceVersion")
        if want is not None and want != self.rv[name]:
            raise kmock.KubernetesError(
                409, "Conflict",
                'Operation cannot be fulfilled on deployments.apps "%s": the object has been '
                "modified; please apply your changes to the latest version and try again" % name)
        replicas = patch["spec"]["replicas"]
        if replicas != d["replicas"]:
            d["replicas"] = replicas
            d["generation"] += 1
        self.rv[name] = self._next()
        return self.get_scale(request)

    def list_pods(self, request):
        selector = dict(term.split("=", 1)
                        for term in request.params.get("labelSelector", "").split(",") if term)
        items = [p for p in self.pods.values()
                 if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
                "items": items}

    def patch_pod(self, request):
        pod = self.pods.get(request.name)
        if pod is None:
            raise kmock.KubernetesError(404, "NotFound", 'pods "%s" not found' % request.name)
        annotations = request.data["metadata"]["annotations"]
        pod["metadata"].setdefault("annotations", {}).update(annotations)
        return pod

    def costs(self):
        return {name: p["metadata"].get("annotations", {}).get(COST)
                for name, p in self.pods.items()}


# ------------------------------------------------------------------------------------------------


def worker(ip, load, tokens=0, ready=True, draining=False):
    return {"id": "%s:50051" % ip, "ready": ready, "draining": draining, "inflight": load,
            "running_requests": load, "queued_requests": 0, "running_tokens": tokens}


def header(request, name):
    return next((v for k, v in request.headers.items() if k.lower() == name.lower()), None)


def seen(request):
    """What a request carried, as the assertions compare it: (method, raw path, raw query,
    content type (of a body), Authorization, the body's JSON)."""
    body = request.body.decode() if request.body else None
    return (str(request.method.value), request.url.raw_path, request.url.raw_query_string,
            header(request, "Content-Type") if body else None, header(request, "Authorization"),
            json.loads(body) if body else None)


def rbac_call(request):
    """(verb, API group, resource[/subresource], name) of an API request."""
    verb = {kmock.action.FETCH: "get", kmock.action.LIST: "list",
            kmock.action.UPDATE: "patch"}[request.action]
    resource = request.resource.plural
    if request.subresource:
        resource += "/" + request.subresource
    return verb, request.resource.group, resource, request.name


class ContractTest(unittest.IsolatedAsyncioTestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.certs = Certificates(cls.dir)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    async def asyncSetUp(self):
        self.cluster = Cluster()
        self.release = asyncio.Event()  # sets free any answer held by a test
        self.token = os.path.join(self.dir, "token")
        self.write_token("token-1")
        self.drivers = []
        self.k = await self.serve(self.certs.server_ip)
        self.url = "https://127.0.0.1:%d" % self.server.port
        self.driver = await self.start_driver(self.url, self.certs.ca[0])

    async def asyncTearDown(self):
        self.release.set()
        for proc, stderr in self.drivers:
            if proc.returncode is None:
                proc.stdin.close()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except asyncio.TimeoutError:
                    proc.kill()
                    await proc.wait()
            stderr.close()
        for cm in reversed(self.entered):
            await cm.__aexit__(None, None, None)

    def write_token(self, token):
        # As the kubelet rotates a projected token: a new file renamed over the old.
        tmp = self.token + ".new"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(token + "\n")
        os.replace(tmp, self.token)

    async def serve(self, certificate=None):
        """kmock serving the cluster (TLS with `certificate`, else plain HTTP)."""
        k = kmock.KubernetesScaffold()
        c = self.cluster
        k["get", re.compile(DEPLOYMENT)] << c.get_deployment
        k["get", re.compile(DEPLOYMENT + "/scale")] << c.get_scale
        k["patch", re.compile(DEPLOYMENT + "/scale")] << c.patch_scale
        k["get", PODS] << c.list_pods
        k["patch", re.compile(PODS + "/([a-z0-9-]+)")] << c.patch_pod
        kwargs = {}
        if certificate is not None:
            kwargs["server_cls"] = tls_server_class(self.certs.context(certificate))
        server = kmock.Server(k, **kwargs)
        self.entered = getattr(self, "entered", [])
        for cm in (k, server):
            await cm.__aenter__()
            self.entered.append(cm)
        self.server = server
        return k

    async def start_driver(self, url, ca_file, *extra):
        stderr = open(os.path.join(self.dir, "driver-%d.log" % len(self.drivers)), "w+b")
        proc = await asyncio.create_subprocess_exec(
            DRIVER, "--api_server=" + url, "--token_file=" + self.token,
            "--ca_file=" + ca_file, "--namespace=" + NS, *extra,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr)
        self.drivers.append((proc, stderr))
        return proc

    async def call(self, op, pool="decode", driver=None, timeout_ms=5000, **fields):
        proc = driver or self.driver
        command = dict(op=op, pool=pool, timeout_ms=timeout_ms, **fields)
        proc.stdin.write((json.dumps(command) + "\n").encode())
        await proc.stdin.drain()
        line = await asyncio.wait_for(proc.stdout.readline(), CALL_TIMEOUT_S)
        if not line:
            raise AssertionError("the driver exited: %s" % self.driver_log(proc))
        return json.loads(line)

    def driver_log(self, proc):
        for p, stderr in self.drivers:
            if p is proc:
                stderr.seek(0)
                return stderr.read().decode(errors="replace")
        return ""

    def requests(self):
        return [seen(r) for r in self.k]

    def bearer(self, token="token-1"):
        return "Bearer " + token

    # --- Replicas --------------------------------------------------------------------------------

    async def test_replicas_reads_the_deployment(self):
        got = await self.call("replicas")
        self.assertEqual(got, {"code": "OK", "message": "", "spec": 3, "ready": 2,
                               "changing": False})
        self.cluster.deployments["ferry-decode"]["observed"] = 3  # not yet acted on
        got = await self.call("replicas")
        self.assertTrue(got["changing"])
        self.assertEqual(self.requests(), [
            ("GET", "/apis/apps/v1/namespaces/ferry/deployments/ferry-decode", "", None,
             self.bearer(), None)] * 2)

    async def test_unmanaged_pool_sends_nothing(self):
        got = await self.call("replicas", pool="aggregated")
        self.assertEqual(got["code"], "NOT_FOUND")
        self.assertEqual(self.requests(), [])

    # --- Scale -----------------------------------------------------------------------------------

    async def test_scale_out(self):
        rv = self.cluster.rv["ferry-decode"]  # the version GET returns, which the PATCH names
        got = await self.call("scale", replicas=5, workers=[worker("10.0.0.1", 4)])
        self.assertEqual(got["code"], "OK", got)
        self.assertEqual(self.requests(), [
            ("GET", "/apis/apps/v1/namespaces/ferry/deployments/ferry-decode/scale", "", None,
             self.bearer(), None),
            ("PATCH", "/apis/apps/v1/namespaces/ferry/deployments/ferry-decode/scale", "",
             MERGE_PATCH, self.bearer(),
             {"metadata": {"resourceVersion": rv}, "spec": {"replicas": 5}}),
        ])
        self.assertEqual(self.cluster.deployments["ferry-decode"]["replicas"], 5)

    async def test_scale_to_the_same_count_patches_nothing(self):
        got = await self.call("scale", replicas=3)
        self.assertEqual(got["code"], "OK", got)
        self.assertEqual([r[0] for r in self.requests()], ["GET"])

    async def test_scale_in_sets_pod_deletion_cost_first(self):
        workers = [worker("10.0.0.1", 5, 900), worker("10.0.0.2", 0), worker("10.0.0.3", 2, 50)]
        rv = self.cluster.rv["ferry-decode"]
        got = await self.call("scale", replicas=1, workers=workers)
        self.assertEqual(got["code"], "OK", got)
        scale = "/apis/apps/v1/namespaces/ferry/deployments/ferry-decode/scale"
        self.assertEqual(self.requests(), [
            ("GET", scale, "", None, self.bearer(), None),
            ("GET", PODS, DECODE_SELECTOR, None, self.bearer(), None),
            # ferry-decode-c already has its cost (2); ferry-decode-gone is terminating.
            ("PATCH", PODS + "/ferry-decode-a", "", MERGE_PATCH, self.bearer(),
             {"metadata": {"annotations": {COST: "3"}}}),
            ("PATCH", PODS + "/ferry-decode-b", "", MERGE_PATCH, self.bearer(),
             {"metadata": {"annotations": {COST: "1"}}}),
            ("PATCH", scale, "", MERGE_PATCH, self.bearer(),
             {"metadata": {"resourceVersion": rv}, "spec": {"replicas": 1}}),
        ])
        self.assertEqual(self.cluster.costs(), {
            "ferry-decode-a": "3", "ferry-decode-b": "1", "ferry-decode-c": "2",
            "ferry-decode-gone": None, "ferry-prefill-a": None})
        self.assertEqual(self.cluster.deployments["ferry-decode"]["replicas"], 1)

    async def test_scale_in_costs_unknown_and_draining_pods_zero(self):
        workers = [worker("10.0.0.1", 1), worker("10.0.0.3", 7, draining=True)]
        got = await self.call("scale", replicas=2, workers=workers)
        self.assertEqual(got["code"], "OK", got)
        self.assertEqual(self.cluster.costs()["ferry-decode-a"], "1")
        self.assertEqual(self.cluster.costs()["ferry-decode-b"], "0")  # no worker listed
        self.assertEqual(self.cluster.costs()["ferry-decode-c"], "0")  # draining

    async def test_a_pod_gone_since_the_list_is_skipped(self):
        def vanish(request):
            if request.name == "ferry-decode-a":
                raise kmock.KubernetesError(404, "NotFound", 'pods "ferry-decode-a" not found')
            return NotImplemented  # the cluster's own reaction answers
        self.k.override["patch", re.compile(PODS + "/([a-z0-9-]+)")] << vanish
        got = await self.call("scale", replicas=2, workers=[worker("10.0.0.1", 1)])
        self.assertEqual(got["code"], "OK", got)
        self.assertEqual(self.cluster.deployments["ferry-decode"]["replicas"], 2)

    # --- Errors ----------------------------------------------------------------------------------

    async def test_forbidden_carries_the_servers_message(self):
        message = ('deployments.apps "ferry-decode" is forbidden: User '
                   '"system:serviceaccount:ferry:ferry-planner" cannot get resource '
                   '"deployments/scale" in API group "apps" in the namespace "ferry"')
        self.k.override["get", re.compile(DEPLOYMENT + "/scale")] << kmock.KubernetesError(
            403, "Forbidden", message)
        got = await self.call("scale", replicas=4)
        self.assertEqual(got["code"], "PERMISSION_DENIED")
        self.assertIn(message, got["message"])
        self.assertIn("HTTP 403", got["message"])
        self.assertEqual([r[0] for r in self.requests()], ["GET"])  # no PATCH after a refusal

    async def test_forbidden_pod_patch_fails_the_scale_in_before_it_scales(self):
        self.k.override["patch", re.compile(PODS + "/([a-z0-9-]+)")] << kmock.KubernetesError(
            403, "Forbidden", 'pods "ferry-decode-a" is forbidden: cannot patch resource "pods"')
        got = await self.call("scale", replicas=1, workers=[worker("10.0.0.1", 1)])
        self.assertEqual(got["code"], "PERMISSION_DENIED", got)
        self.assertIn('cannot patch resource \\"pods\\"', json.dumps(got["message"]))
        self.assertEqual(self.cluster.deployments["ferry-decode"]["replicas"], 3)
        self.assertFalse(any(r[0] == "PATCH" and r[1].endswith("/scale")
                             for r in self.requests()))

    async def test_not_found(self):
        del self.cluster.deployments["ferry-prefill"]
        got = await self.call("replicas", pool="prefill")
        self.assertEqual(got["code"], "NOT_FOUND")
        self.assertIn('deployments.apps \\"ferry-prefill\\" not found', json.dumps(got["message"]))
        got = await self.call("scale", pool="prefill", replicas=2)
        self.assertEqual(got["code"], "NOT_FOUND")

    async def test_conflict_on_status_change_is_patched_again(self):
        touched = []

        def status_moved(name):  # once: the controller updated the status since the GET
            if not touched:
                touched.append(name)
                self.cluster.touch(name)
        self.cluster.before_scale_patch = status_moved
        rv0 = self.cluster.rv["ferry-decode"]
        got = await self.call("scale", replicas=5)
        self.assertEqual(got["code"], "OK", got)
        patches = [r[5]["metadata"]["resourceVersion"] for r in self.requests() if r[0] == "PATCH"]
        self.assertEqual([r[0] for r in self.requests()], ["GET", "PATCH", "GET", "PATCH"])
        self.assertEqual(patches[0], rv0)
        self.assertNotEqual(patches[1], rv0)
        self.assertEqual(self.cluster.deployments["ferry-decode"]["replicas"], 5)

    async def test_conflict_with_someone_elses_scale_aborts(self):
        self.cluster.before_scale_patch = lambda name: (
            self.cluster.touch(name, replicas=6) if self.cluster.deployments[name]["replicas"] == 3
            else None)
        got = await self.call("scale", replicas=5)
        self.assertEqual(got["code"], "ABORTED", got)
        self.assertIn("from 3 to 6 by someone else", got["message"])
        self.assertEqual([r[0] for r in self.requests()], ["GET", "PATCH", "GET"])
        self.assertEqual(self.cluster.deployments["ferry-decode"]["replicas"], 6)

    async def test_persistent_conflict_gives_up(self):
        self.cluster.before_scale_patch = self.cluster.touch
        got = await self.call("scale", replicas=5)
        self.assertEqual(got["code"], "ABORTED", got)
        self.assertIn("HTTP 409", got["message"])
        self.assertIn("the object has been modified", got["message"])
        self.assertEqual([r[0] for r in self.requests()], ["GET", "PATCH"] * 3)

    async def test_no_answer_by_the_deadline(self):
        hanging = [True]

        async def hang(request):
            if not hanging[0]:
                return NotImplemented  # from now on the cluster's own reaction answers
            await self.release.wait()
            return {}
        self.k.override["get", re.compile(DEPLOYMENT)] << hang
        start = time.monotonic()
        got = await self.call("replicas", timeout_ms=500)
        elapsed = time.monotonic() - start
        self.assertEqual(got["code"], "DEADLINE_EXCEEDED", got)
        self.assertLess(elapsed, 5)
        hanging[0] = False
        self.release.set()
        # The actuator is usable again at once.
        got = await self.call("replicas", pool="prefill")
        self.assertEqual(got["code"], "OK", got)

    async def test_hostile_answers_are_statuses(self):
        driver = await self.start_driver(self.url, self.certs.ca[0],
                                         "--max_response_bytes=1048576")
        answer = []  # what the server answers now
        self.k.override["get", re.compile(DEPLOYMENT)] << (lambda: answer[-1])
        cases = [
            (b'{"kind": "Deployment", "spec": {"replicas": ', "INVALID_ARGUMENT", "not JSON"),
            (b'{"kind": "Deployment", "spec": {"replicas": "many"}}', "INVALID_ARGUMENT",
             "spec.replicas"),
            (b'{"kind": "Deployment", "pad": "' + b"x" * (2 << 20) + b'"}',
             "RESOURCE_EXHAUSTED", "over 1048576 bytes"),
            (kmock.Response(status=502, payload=b"<html>\r\nbad gateway</html>"), "UNAVAILABLE",
             "HTTP 502: <html>  bad gateway</html>"),
        ]
        for body, code, text in cases:
            with self.subTest(code=code, text=text):
                answer.append(body)
                got = await self.call("replicas", driver=driver)
                self.assertEqual(got["code"], code, got)
                self.assertIn(text, got["message"])

    async def test_rotated_token_is_sent(self):
        await self.call("replicas")
        self.write_token("token-2")
        await self.call("replicas")
        self.assertEqual([r[4] for r in self.requests()],
                         [self.bearer("token-1"), self.bearer("token-2")])

    # --- TLS -------------------------------------------------------------------------------------

    async def test_server_signed_by_another_ca_is_refused(self):
        driver = await self.start_driver(self.url, self.certs.other_ca[0])
        with quiet_handshake_failures():
            got = await self.call("replicas", driver=driver)
        self.assertEqual(got["code"], "UNAVAILABLE", got)
        self.assertIn("certificate is not trusted", got["message"])
        self.assertEqual(self.requests(), [])  # nothing reached the server

    async def test_certificate_for_another_host_is_refused(self):
        await self.serve(self.certs.server_name)  # valid, but for kubernetes.default.svc only
        driver = await self.start_driver("https://127.0.0.1:%d" % self.server.port,
                                         self.certs.ca[0])
        with quiet_handshake_failures():
            got = await self.call("replicas", driver=driver)
        self.assertEqual(got["code"], "UNAVAILABLE", got)
        self.assertIn("certificate is not trusted", got["message"])
        self.assertIn("mismatch", got["message"])

    async def test_plain_http_when_the_url_says_so(self):
        k = await self.serve(None)
        driver = await self.start_driver("http://127.0.0.1:%d" % self.server.port, "")
        got = await self.call("replicas", driver=driver)
        self.assertEqual(got["code"], "OK", got)
        self.assertEqual(len(list(k)), 1)

    # --- RBAC ------------------------------------------------------------------------------------

    async def test_rbac_grants_exactly_what_the_actuator_calls(self):
        for pool in ("prefill", "decode"):
            self.assertEqual((await self.call("replicas", pool=pool))["code"], "OK")
        workers = [worker("10.0.0.1", 3), worker("10.0.0.2", 0), worker("10.0.1.1", 1)]
        for pool, replicas in (("prefill", 2), ("decode", 4), ("prefill", 1), ("decode", 1)):
            got = await self.call("scale", pool=pool, replicas=replicas, workers=workers)
            self.assertEqual(got["code"], "OK", got)
        calls = {rbac_call(r) for r in self.k}
        self.assertEqual({(v, g, r) for v, g, r, _ in calls}, {
            ("get", "apps", "deployments"), ("get", "apps", "deployments/scale"),
            ("patch", "apps", "deployments/scale"), ("list", "", "pods"), ("patch", "", "pods")})
        for overlay in k8s_render.OVERLAYS:
            with self.subTest(overlay=overlay):
                objects = await asyncio.to_thread(k8s_render.render, overlay)
                rules = planner_role_rules(objects)
                for call in sorted(calls, key=str):
                    self.assertTrue(any(grants(rule, *call) for rule in rules),
                                    "the Role does not grant %s" % (call,))
                for rule in rules:
                    for verb in rule["verbs"]:
                        for group in rule["apiGroups"]:
                            for resource in rule["resources"]:
                                self.assertTrue(
                                    any(c[:3] == (verb, group, resource) for c in calls),
                                    "the Role grants %s %s/%s, which the actuator never calls"
                                    % (verb, group, resource))
                                names = set(rule.get("resourceNames", []))
                                used = {c[3] for c in calls if c[:3] == (verb, group, resource)}
                                if names:
                                    self.assertEqual(names, used, "resourceNames of %s %s"
                                                     % (verb, resource))


def planner_role_rules(objects):
    """The rules of the Role the ferry-planner Deployment's ServiceAccount is bound to (checked:
    one RoleBinding, same namespace, the Deployment's serviceAccountName)."""
    by = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    deployment = by[("Deployment", "ferry-planner")]
    pod = deployment["spec"]["template"]["spec"]
    account = pod.get("serviceAccountName")
    if not account or ("ServiceAccount", account) not in by:
        raise AssertionError("ferry-planner runs as no ServiceAccount of the overlay")
    bindings = [o for o in objects if o["kind"] == "RoleBinding" and any(
        s.get("kind") == "ServiceAccount" and s.get("name") == account
        for s in o.get("subjects", []))]
    if len(bindings) != 1:
        raise AssertionError("%d RoleBindings for %s" % (len(bindings), account))
    binding = bindings[0]
    ref = binding["roleRef"]
    if ref["kind"] != "Role":
        raise AssertionError("ferry-planner is bound to a %s, not a namespaced Role" % ref["kind"])
    role = by[("Role", ref["name"])]
    namespaces = {o["metadata"].get("namespace") for o in (deployment, binding, role)}
    namespaces.update(s.get("namespace") for s in binding["subjects"])
    if namespaces != {NS}:
        raise AssertionError("the planner's objects are in namespaces %s" % namespaces)
    return role["rules"]


def grants(rule, verb, group, resource, name):
    if verb not in rule["verbs"] or group not in rule["apiGroups"]:
        return False
    if resource not in rule["resources"]:
        return False
    names = rule.get("resourceNames")
    return not names or (name is not None and name in names)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: kubernetes_actuator_contract_test.py DRIVER [unittest args]")
    DRIVER = os.path.abspath(sys.argv[1])
    unittest.main(argv=[sys.argv[0]] + sys.argv[2:])
