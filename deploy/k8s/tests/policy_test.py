"""Policy over the rendered objects of every overlay (deploy/k8s/README.md, "What is checked").

  policy_test.py ROUTER_BIN WORKER_BIN KVSTORE_BIN PLANNER_BIN ENCODER_BIN

The binaries give the flags a container may use: each one's --help lists them, and its
defaults. A container runs the Ferry binary its command names, else the one its image is
(ferry-<binary>[:tag], whose entrypoint it is: tools/image/build_images.sh), whatever its name;
any other program (README's fetch-model init container: `cp`) is no Ferry binary and is not
held to a --help. Every rule below is one a reviewer would otherwise check by eye:
  - every container but a run-to-completion init container runs a Ferry binary; every container
    and sidecar (an init container with restartPolicy Always) has startup, readiness and liveness
    probes (a Ferry binary's: /healthz, /readyz on its admin port); a run-to-completion init
    container has none (Kubernetes rejects them); every container, init containers included,
    has requests and limits of cpu and memory and runs as a non-root user with a read-only root
    filesystem, no privilege escalation, ALL capabilities dropped (the gpu overlay's workers may
    add IPC_LOCK, nothing else), seccomp RuntimeDefault;
  - ports are what the binaries bind, per container and per pod: what a Ferry container listens
    on comes from its settings (args, --config file, --help's defaults): --port or --address's
    port, --admin_port, and the KV transport's (--transport_address's with --transport=grpc,
    UCX_TCP_PORT_RANGE with ucx). Every containerPort is one of them; every probe's port (by
    number or by name) is the admin port (an HTTP probe) or one of them; every port a
    NetworkPolicy admits (by number, by name, or a range) is one that a pod the policy selects
    listens on, and every policy selects pods;
  - every volume a pod declares (a StatefulSet's claim templates included) is mounted by one of
    its containers, and every mount names a declared volume; a hostPath volume is mounted
    read-only, and only by containers that name a file in it (the model): no pod gets a node's
    directory it does not read;
  - every Deployment and StatefulSet has a PodDisruptionBudget selecting its pods;
  - grace periods exceed each binary's whole shutdown (the worker: --drain_grace +
    --handoff_wait + --rpc_grace, from its args, its --config file, or --help's defaults);
  - no Secret value appears anywhere else: in any string of any other object (ConfigMap data
    and binaryData, arguments, env values, labels and annotations, a Secret's own labels and
    annotations included), as written or JSON-escaped; Secrets are mounted as directories (no
    subPath), by init containers too;
  - workers and store nodes advertise a pod IP (--advertise_address from status.podIP), never
    0.0.0.0; every address they bind is one they advertise a host for;
  - every flag in a Ferry container's args, and every key of its --config file, is one its
    binary's --help lists; the config file and the model it names are mounted;
  - the headless Services publish not-ready addresses; several routers have session affinity;
  - the store's --capacity fits its volume;
  - RBAC is least privilege: no ClusterRole, no wildcard; only the planner's pod gets a service
    account token, and only with --actuator=kubernetes; its Role grants exactly the calls of
    services/planner/kubernetes_actuator.h, on the Deployments the planner's flags name (the
    contract test tests/deploy:kubernetes_actuator_contract_test checks them against the calls);
  - the planner or an HPA on a pool, never both; the planner owns its pools' replica count (no
    spec.replicas in their Deployments), and runs as one replica, never two at once (Recreate);
  - the encoder pool (components/encoder): the router finds it (--encoders_dns names its headless
    Service and gRPC port), only the router and the workers may reach its gRPC port (every
    NetworkPolicy rule that admits it names only their pods), and it loads the router's and the
    workers' model at their precision.
Each overlay is checked as it is, with components/planner-advice (HPAs follow the planner) and
with components/encoder listed in it (the encoder pool), and so is testdata/model-init-container
(the cpu overlay with README's fetch-model init container). test_checks_catch_breakage breaks the
rendered objects the way each rule guards against and expects the rule to fail.
"""

import base64
import copy
import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_render  # noqa: E402

BINARIES = {}  # Ferry binary ("router", "worker", ..., "encoder") -> its path (from argv)
# The Ferry binaries that only a component runs: binary -> the component.
OPTIONAL_BINARIES = {"encoder": "components/encoder"}
# The overlays as checked: each as it is, and with the planner in advice mode (an HPA per pool);
# each with the encoder pool listed among its components (INCLUDED); then the fixtures
# (kustomizations over an overlay, paths relative to deploy/k8s), with the overlay they build on.
VARIANTS = [(o, []) for o in k8s_render.OVERLAYS] + [
    (o, ["components/planner-advice"]) for o in k8s_render.OVERLAYS]
INCLUDED = [(o, ["components/encoder"]) for o in k8s_render.OVERLAYS]
# The encoder's gRPC clients: the router (Encode, Watch) and the workers (FetchEmbeddings; in a
# prefill/decode split both fetch).
ENCODER_CLIENTS = {"router", "prefill", "decode"}
FIXTURES = [("cpu", "tests/testdata/model-init-container")]
# (apiGroup, resource, verb) -> resourceNames ("deployments": the Deployments of the planner's
# pools) of what services/planner/kubernetes_actuator.h calls.
PLANNER_RULES = {
    ("apps", "deployments", "get"): "deployments",
    ("apps", "deployments/scale", "get"): "deployments",
    ("apps", "deployments/scale", "patch"): "deployments",
    ("", "pods", "list"): None,
    ("", "pods", "patch"): None,
}
WILDCARDS = {"", "0.0.0.0", "::", "[::]", "localhost", "127.0.0.1"}
# Secret strings shorter than this are not looked for elsewhere: a short line ("{", "true", a
# port, a label value such as "router") recurs in any manifest by coincidence. No secret Ferry
# reads is near it: the shared token and the API keys are 16 bytes at least
# (services/common/shared_token.h, router/auth/api_keys.cc); 6 still finds a short password of
# another program's Secret.
MIN_SECRET_CHARS = 6
# In a JSON Secret value (the router's --api_keys_file: keys[].key), the fields that hold secrets;
# the others (tenants, limits) are names and numbers that recur elsewhere.
SECRET_FIELDS = re.compile(r"key|token|secret|password", re.I)
PROBES = (("startupProbe", "/healthz"), ("readinessProbe", "/readyz"),
          ("livenessProbe", "/healthz"))


class Flag:
    def __init__(self, name, type_, default):
        self.name, self.type, self.default = name, type_, default


_help_cache = {}


def binary_flags(binary):
    """{name: Flag} of a Ferry binary ("router", ...), from its --help."""
    path = BINARIES[binary]
    if path not in _help_cache:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
        flags = {}
        for m in re.finditer(r'^  --([a-z0-9_]+) \((\w+), default ("(?:[^"\\]|\\.)*"|[^)]*)\)',
                             text, re.M):
            flags[m.group(1)] = Flag(m.group(1), m.group(2), m.group(3).strip('"'))
        if not flags:
            raise AssertionError("%s --help listed no flags:\n%s" % (path, text[:2000]))
        for builtin in ("help", "version", "flagfile", "fromenv", "undefok"):
            flags.setdefault(builtin, Flag(builtin, "builtin", ""))
        _help_cache[path] = flags
    return _help_cache[path]


def binary_of(container):
    """The Ferry binary a container runs ("router", "worker", "kvstore", "planner"), or None for
    another program: its command's program if it has a command, else its image's entrypoint
    (ferry-<binary>, registry and tag aside). Never its name: a container named "router" that
    runs busybox is no router."""
    if container.get("command"):
        program = os.path.basename(container["command"][0])
    else:
        program = container.get("image", "").split("@")[0].rsplit("/", 1)[-1].split(":")[0]
    m = re.fullmatch(r"ferry-([a-z]+)", program)
    return m.group(1) if m and m.group(1) in BINARIES else None


def runs_to_completion(spec, container):
    """Whether a container is an init container that ends before the others start; a sidecar (an
    init container with restartPolicy Always) runs beside them, as a container does."""
    return (any(container is c for c in spec.get("initContainers", [])) and
            container.get("restartPolicy") != "Always")


def seconds(duration):
    """A Go/absl duration ("30s", "1m30s", "500ms", "2h") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(ms|us|ns|h|m|s)", duration)
    if not parts or "".join(a + b for a, b in parts) != duration:
        raise AssertionError("not a duration: %r" % duration)
    return sum(float(a) * units[b] for a, b in parts)


def args_of(container):
    """{flag: value} of a Ferry container's command line: the arguments after a command's program,
    then its args (every one --name=value or a bare --bool)."""
    out = {}
    for arg in container.get("command", [])[1:] + container.get("args", []):
        m = re.fullmatch(r"--([a-z0-9_]+)(?:=(.*))?", arg, re.S)
        if not m:
            raise AssertionError("%s: argument %r is not --name=value" % (container["name"], arg))
        out[m.group(1)] = m.group(2) if m.group(2) is not None else "true"
    return out


def workloads(objects):
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]


def selects(selector, labels):
    """Whether a LabelSelector selects these labels."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        has, value = e["key"] in labels, labels.get(e["key"])
        op = e["operator"]
        if op == "In" and value not in e["values"]:
            return False
        if op == "NotIn" and has and value in e["values"]:
            return False
        if op == "Exists" and not has:
            return False
        if op == "DoesNotExist" and has:
            return False
    return True


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def strings_in(node):
    """Every string in a parsed YAML/JSON tree: the values, and the keys of its mappings."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k)
            yield from strings_in(v)
    elif isinstance(node, list):
        for v in node:
            yield from strings_in(v)
    elif isinstance(node, str):
        yield node


def secret_strings(value):
    """The strings of one Secret value to look for elsewhere: in a JSON document the strings of
    its SECRET_FIELDS, else each line."""
    try:
        doc = json.loads(value)
    except ValueError:
        doc = None
    if not isinstance(doc, (dict, list)):
        return [line.strip() for line in value.splitlines()]
    found = []

    def walk(node, field):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, field)
        elif isinstance(node, str) and field is not None and SECRET_FIELDS.search(field):
            found.append(node)

    walk(doc, None)
    return found


def port_of(address, where):
    """The port of HOST:PORT ("0.0.0.0:50051", "[::]:7400")."""
    port = address.rsplit(":", 1)[-1] if ":" in address else ""
    if not port.isdigit():
        raise AssertionError("%s: cannot tell the port %r binds" % (where, address))
    return int(port)


class Listens:
    """The TCP ports a Ferry container binds, from its settings: ports {port: the flag} (0: an
    ephemeral port, which nothing can name) and ranges [(low, high, the setting)]."""

    def __init__(self, admin, ports, ranges):
        self.admin, self.ports, self.ranges = admin, ports, ranges

    def covers(self, low, high=None):
        """Whether it listens on every port of low..high (one port without high)."""
        high = low if high is None else high
        return ((low == high and low in self.ports and low != 0) or
                any(lo <= low and high <= hi for lo, hi, _ in self.ranges))


class Rendered:
    """One overlay's objects, indexed."""

    def __init__(self, overlay, components=(), path=None, including=()):
        self.overlay = overlay  # the overlay it builds on (the gpu overlay's allowances)
        self.components = list(components) + list(including)  # the optional ones applied
        if path is not None:
            self.name = os.path.basename(path)
            self.objects = k8s_render.render_dir(path)
        elif including:
            self.name = "+".join([overlay] + [os.path.basename(c) for c in including])
            self.objects = k8s_render.render_including(overlay, list(including))
        else:
            self.name = "+".join([overlay] + [os.path.basename(c) for c in components])
            self.objects = (k8s_render.render_with(overlay, list(components)) if components
                            else k8s_render.render(overlay))
        self.by_name = {k8s_render.name(o): o for o in self.objects}
        self.configmaps = {o["metadata"]["name"]: o for o in self.objects
                           if o["kind"] == "ConfigMap"}

    def pods(self):
        """(workload, pod spec, pod labels) of every Deployment and StatefulSet."""
        for w in workloads(self.objects):
            t = w["spec"]["template"]
            yield w, t["spec"], t["metadata"].get("labels", {})

    def containers(self):
        """(workload, pod spec, container) of every container, init containers first."""
        for w, spec, labels in self.pods():
            for c in spec.get("initContainers", []) + spec["containers"]:
                yield w, spec, c

    def ferry_containers(self):
        """(workload, pod spec, container, binary) of every container that runs a Ferry binary."""
        for w, spec, c in self.containers():
            if binary_of(c) is not None:
                yield w, spec, c, binary_of(c)

    def mounted_file(self, spec, container, path):
        """The content of the ConfigMap file a container sees at PATH, or None."""
        for m in container.get("volumeMounts", []):
            prefix = m["mountPath"].rstrip("/") + "/"
            if path.startswith(prefix):
                volume = next(v for v in spec["volumes"] if v["name"] == m["name"])
                if "configMap" in volume:
                    data = self.configmaps[volume["configMap"]["name"]].get("data", {})
                    return data.get(path[len(prefix):])
        return None

    def config_of(self, spec, container):
        """The container's --config JSON (a dict), {} without --config."""
        path = args_of(container).get("config")
        if path is None:
            return {}
        text = self.mounted_file(spec, container, path)
        if text is None:
            raise AssertionError("%s: --config=%s is not a mounted ConfigMap file"
                                 % (container["name"], path))
        return json.loads(text)

    def setting(self, spec, container, flag):
        """A flag's value: the args', else the config file's, else --help's default."""
        value = args_of(container).get(flag)
        if value is None:
            value = self.config_of(spec, container).get(flag)
        if value is None:
            value = binary_flags(binary_of(container))[flag].default
        return str(value)

    def env_value(self, container, name):
        """An environment variable as the container gets it: a literal value or a ConfigMap's key
        (env, else envFrom); None when unset or known only at run time (a fieldRef)."""
        value = None
        for source in container.get("envFrom", []):
            ref, prefix = source.get("configMapRef"), source.get("prefix", "")
            if ref and name.startswith(prefix):
                data = self.configmaps.get(ref["name"], {}).get("data", {})
                value = data.get(name[len(prefix):], value)
        e = env_of(container).get(name)
        if e is not None:
            ref = e.get("valueFrom", {}).get("configMapKeyRef")
            value = e.get("value") if ref is None else (
                self.configmaps.get(ref["name"], {}).get("data", {}).get(ref["key"]))
        return value

    def expand(self, container, text):
        """Kubernetes' $(VAR) expansion of an argument, for the variables known before the pod
        runs ($$ is a literal $; an unknown variable stays as written)."""
        def one(m):
            if m.group(0) == "$$":
                return "$"
            value = self.env_value(container, m.group(1))
            return m.group(0) if value is None else value
        return re.sub(r"\$\$|\$\((\w+)\)", one, text)

    def listens(self, spec, container):
        """What a Ferry container binds (Listens), from its settings."""
        flags = binary_flags(binary_of(container))
        where = container["name"]

        def value(flag):
            return self.expand(container, self.setting(spec, container, flag))

        ports, ranges = {}, []
        for flag in ("port", "admin_port"):  # the router's HTTP API; every binary's admin HTTP
            if flag in flags:
                if not value(flag).isdigit():
                    raise AssertionError("%s: --%s=%s is no port" % (where, flag, value(flag)))
                ports[int(value(flag))] = "--" + flag
        if "address" in flags:  # the gRPC services
            ports[port_of(value("address"), where)] = "--address"
        transport = value("transport") if "transport" in flags else "none"
        if transport == "grpc":
            ports[port_of(value("transport_address"), where)] = "--transport_address"
        elif transport == "ucx":
            # UCX's TCP transport listens in UCX_TCP_PORT_RANGE; without it on any port (none
            # that a NetworkPolicy or a containerPort could name).
            ucx = self.env_value(container, "UCX_TCP_PORT_RANGE")
            if ucx:
                m = re.fullmatch(r"(\d+)-(\d+)", ucx)
                if not m:
                    raise AssertionError("%s: UCX_TCP_PORT_RANGE=%s is not LOW-HIGH" % (where, ucx))
                ranges.append((int(m.group(1)), int(m.group(2)), "UCX_TCP_PORT_RANGE"))
        admin = int(value("admin_port")) if "admin_port" in flags else None
        return Listens(admin, ports, ranges)

    def pod_listens(self, spec):
        """(protocol, low, high) of what a pod's containers listen on (they share its network):
        a Ferry binary's ports from its settings (TCP), another program's containerPorts (its
        word is all there is). Run-to-completion init containers have ended."""
        out = []
        for c in spec.get("initContainers", []) + spec["containers"]:
            if runs_to_completion(spec, c):
                continue
            if binary_of(c) is None:
                out += [(p.get("protocol", "TCP"), p["containerPort"], p["containerPort"])
                        for p in c.get("ports", [])]
                continue
            listens = self.listens(spec, c)
            out += [("TCP", p, p) for p in listens.ports if p != 0]
            out += [("TCP", lo, hi) for lo, hi, _ in listens.ranges]
        return out


class PolicyTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.rendered = ([Rendered(o, c) for o, c in VARIANTS] +
                        [Rendered(o, including=c) for o, c in INCLUDED] +
                        [Rendered(o, path=p) for o, p in FIXTURES])
        cls.variant = {r.name: r for r in cls.rendered}

    def check_containers_are_known(self, r):
        """Every container but a run-to-completion init container runs a Ferry binary."""
        for w, spec, c in r.containers():
            if not runs_to_completion(spec, c):
                self.assertIsNotNone(binary_of(c), "%s container %s runs no Ferry binary (%s): "
                                     "the checks know only %s" % (
                                         k8s_render.name(w), c["name"],
                                         c.get("command") or c.get("image"), sorted(BINARIES)))
        expected = {b for b in BINARIES
                    if OPTIONAL_BINARIES.get(b) in [None] + r.components}
        self.assertEqual({b for _, _, _, b in r.ferry_containers()}, expected,
                         "a Ferry binary runs nowhere, or one whose component is not applied")

    def check_probes_resources_and_security(self, r):
        for w, spec, c in r.containers():
            where = "%s container %s" % (k8s_render.name(w), c["name"])
            if runs_to_completion(spec, c):
                for field in [p for p, _ in PROBES] + ["lifecycle"]:
                    self.assertNotIn(field, c, "%s: an init container with %s (Kubernetes "
                                     "rejects it; a sidecar has restartPolicy Always)"
                                     % (where, field))
            else:
                for probe, path in PROBES:
                    self.assertIn(probe, c, where)
                    if binary_of(c) is not None:
                        get = c[probe].get("httpGet")
                        self.assertIsNotNone(get, "%s: %s is not an HTTP GET" % (where, probe))
                        self.assertEqual(get["path"], path, "%s: %s" % (where, probe))
            for kind in ("requests", "limits"):
                for res in ("cpu", "memory"):
                    self.assertIn(res, c.get("resources", {}).get(kind, {}),
                                  "%s: no %s.%s" % (where, kind, res))
            pod_sc, sc = spec.get("securityContext", {}), c.get("securityContext", {})
            run_as_user = sc.get("runAsUser", pod_sc.get("runAsUser"))
            self.assertTrue(sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")), where)
            self.assertIsNotNone(run_as_user, "%s: no runAsUser" % where)
            self.assertNotEqual(run_as_user, 0, where)
            self.assertIs(sc.get("readOnlyRootFilesystem"), True, where)
            self.assertIs(sc.get("allowPrivilegeEscalation"), False, where)
            caps = sc.get("capabilities", {})
            self.assertIn("ALL", caps.get("drop", []), where)
            worker = binary_of(c) == "worker" and not runs_to_completion(spec, c)
            allowed = ["IPC_LOCK"] if (r.overlay == "gpu" and worker) else []
            for cap in caps.get("add", []):
                self.assertIn(cap, allowed, "%s adds %s" % (where, cap))
            seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
            self.assertEqual(seccomp.get("type"), "RuntimeDefault", where)
            self.assertFalse(spec.get("hostNetwork") or spec.get("hostPID") or
                             spec.get("hostIPC"), where)
            if worker:
                self.assertIn("UCX_TLS", env_of(c), "%s: UCX_TLS not pinned" % where)
                if r.overlay == "gpu":
                    self.assertIn("nvidia.com/gpu", c["resources"]["limits"], where)

    def check_container_ports_are_listened_on(self, r):
        """Each containerPort of a Ferry container is one it binds (its flags), and each probe
        is on one: an HTTP probe (/healthz, /readyz) on its admin port."""
        for w, spec, c, binary in r.ferry_containers():
            where = "%s container %s (ferry-%s)" % (k8s_render.name(w), c["name"], binary)
            listens = r.listens(spec, c)
            for p in c.get("ports", []):
                self.assertTrue(p.get("protocol", "TCP") == "TCP" and
                                listens.covers(p["containerPort"]),
                                "%s: containerPort %s (%s) is no port it listens on: %s%s" % (
                                    where, p["containerPort"], p.get("name"),
                                    sorted(listens.ports.items()), listens.ranges))
            named = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
            for probe, _ in PROBES:
                handler = {k: v for k, v in c.get(probe, {}).items()
                           if k in ("httpGet", "tcpSocket", "grpc")}
                for kind, action in handler.items():
                    port = action["port"]
                    if isinstance(port, str) and not port.isdigit():
                        self.assertIn(port, named, "%s: %s port %r names no port of the "
                                      "container" % (where, probe, port))
                        port = named[port]
                    port = int(port)
                    if kind == "httpGet":
                        self.assertTrue(port == listens.admin and port != 0,
                                        "%s: %s on port %s, not its admin port (--admin_port=%s)"
                                        % (where, probe, port, listens.admin))
                    else:
                        self.assertTrue(listens.covers(port), "%s: %s on port %s, which it "
                                        "does not listen on" % (where, probe, port))

    def check_volumes_are_used(self, r):
        """Every volume a pod declares is mounted, every mount is of a declared volume, and a
        node's directory (hostPath) is mounted read-only by containers that read a file in it."""
        for w, spec, _ in r.pods():
            where = k8s_render.name(w)
            declared = {v["name"]: v for v in spec.get("volumes", [])}
            claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
            mounts = {}  # volume -> [(container, mount)]
            for c in spec.get("initContainers", []) + spec["containers"]:
                for m in c.get("volumeMounts", []) + c.get("volumeDevices", []):
                    self.assertIn(m["name"], set(declared) | claims, "%s container %s mounts "
                                  "%s, which the pod does not declare" % (where, c["name"],
                                                                          m["name"]))
                    mounts.setdefault(m["name"], []).append((c, m))
            for name in sorted(set(declared) | claims):
                self.assertIn(name, mounts, "%s declares the volume %s, which no container "
                              "mounts" % (where, name))
            for name, volume in declared.items():
                if "hostPath" not in volume:
                    continue
                for c, m in mounts[name]:
                    self.assertIs(m.get("readOnly"), True, "%s container %s mounts the node's "
                                  "%s writable" % (where, c["name"], volume["hostPath"]["path"]))
                    named = list(strings_in([c.get("command"), c.get("args"), c.get("env")]))
                    if binary_of(c) is not None:  # its flags' values, as args or --config
                        named += list(args_of(c).values())
                        named += list(strings_in(r.config_of(spec, c)))
                    prefix = m["mountPath"].rstrip("/") + "/"
                    self.assertTrue(any(s.startswith(prefix) for s in named),
                                    "%s container %s mounts the node's %s at %s and names no file "
                                    "in it" % (where, c["name"], volume["hostPath"]["path"],
                                               m["mountPath"]))

    def check_every_workload_has_a_pdb(self, r):
        pdbs = [o for o in r.objects if o["kind"] == "PodDisruptionBudget"]
        for w, _, labels in r.pods():
            covering = [p for p in pdbs if selects(p["spec"]["selector"], labels)]
            self.assertEqual(len(covering), 1, "%s: PDBs %s" % (
                k8s_render.name(w), [p["metadata"]["name"] for p in covering]))

    def check_grace_exceeds_shutdown(self, r):
        for w, spec, c in r.containers():
            if runs_to_completion(spec, c):
                continue
            grace = spec.get("terminationGracePeriodSeconds", 30)
            binary = binary_of(c)
            if binary == "worker":
                # services/worker/worker.cc Drain: the calls get drain_grace + handoff_wait + 5 s
                # to end, then gRPC's rpc_grace; plus 10 s for the engine, the store writes and
                # the DNS discovery to stop.
                need = sum(seconds(r.setting(spec, c, f))
                           for f in ("drain_grace", "handoff_wait", "rpc_grace")) + 5 + 10
                self.assertEqual(r.setting(spec, c, "exit_when_drained"), "true",
                                 "%s: a drained worker must exit" % k8s_render.name(w))
            elif binary == "router":
                need = seconds(r.setting(spec, c, "shutdown_grace"))
            elif binary == "planner":
                # Its loop ends after the round it is in: a router read and an actuator call.
                need = sum(seconds(r.setting(spec, c, f))
                           for f in ("router_timeout", "actuator_timeout"))
            elif binary == "kvstore":
                need = int(r.setting(spec, c, "rpc_grace_ms")) / 1000.0
            elif binary == "encoder":
                # services/encoder/encoder_main.cc: the queued and running encodes get
                # drain_grace, the calls in flight rpc_grace_ms; plus 5 s for the threads to stop.
                need = (seconds(r.setting(spec, c, "drain_grace")) +
                        int(r.setting(spec, c, "rpc_grace_ms")) / 1000.0 + 5)
            else:
                need = 0  # another program: its preStop hook is all that is known
            pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
            need += pre_stop.get("seconds", 0)
            self.assertGreater(grace, need, "%s: terminationGracePeriodSeconds %s <= %s s of "
                               "shutdown" % (k8s_render.name(w), grace, need))

    def check_secrets_stay_secret(self, r):
        pieces = set()
        for s in (o for o in r.objects if o["kind"] == "Secret"):
            values = [base64.b64decode(v).decode("utf-8", "replace")
                      for v in (s.get("data") or {}).values()]
            values += list((s.get("stringData") or {}).values())
            for v in values:
                pieces.update(p for p in secret_strings(v) if len(p) >= MIN_SECRET_CHARS)
        self.assertTrue(pieces, "no Secret values found: the check would pass vacuously")
        # As written, and as a JSON string holds it (a config file, an annotation's JSON).
        forms = {form: p for p in pieces for form in
                 (p, json.dumps(p)[1:-1], json.dumps(p, ensure_ascii=False)[1:-1])}
        places = []  # (where, text)
        for o in r.objects:
            where = k8s_render.name(o)
            if o["kind"] == "Secret":  # its labels and annotations only
                for field in ("labels", "annotations"):
                    places += [("%s %s" % (where, field), text)
                               for text in strings_in(o["metadata"].get(field))]
                continue
            places += [(where, text) for text in strings_in(o)]
            for key, value in (o.get("binaryData") or {}).items():
                places.append(("%s binaryData %s" % (where, key),
                               base64.b64decode(value).decode("utf-8", "replace")))
        for where, text in places:
            for form, p in forms.items():
                # The message names the place and the value's first characters, never the value.
                self.assertFalse(form in text, "a Secret value (%s...) appears in %s"
                                 % (p[:4], where))
        for w, spec, _ in r.pods():
            secret_volumes = {v["name"] for v in spec.get("volumes", [])
                              if "secret" in v or any("secret" in s for s in
                                                      v.get("projected", {}).get("sources", []))}
            for c in spec.get("initContainers", []) + spec["containers"]:
                for m in c.get("volumeMounts", []):
                    if m["name"] in secret_volumes:
                        self.assertNotIn("subPath", m, "%s container %s: Secret %s mounted with "
                                         "subPath (never updated)" % (k8s_render.name(w),
                                                                      c["name"], m["name"]))

    def check_advertised_addresses(self, r):
        for w, _, c, binary in r.ferry_containers():
            if binary in ("router", "planner"):  # they advertise no address
                continue
            where = "%s %s" % (k8s_render.name(w), c["name"])
            a = args_of(c)
            self.assertIn("advertise_address", a, where)
            value = a["advertise_address"]
            self.assertNotIn(value, WILDCARDS, where)
            m = re.fullmatch(r"\$\((\w+)\)", value)
            if m:
                env = env_of(c).get(m.group(1), {})
                path = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                self.assertEqual(path, "status.podIP", "%s: $(%s) is not the pod IP"
                                 % (where, m.group(1)))

    def check_network_policy_ports_are_listened_on(self, r):
        """Each port a NetworkPolicy admits is one that a pod it selects listens on (not one
        that only another pod does)."""
        policies = [o for o in r.objects if o["kind"] == "NetworkPolicy"]
        self.assertTrue(policies)
        self.assertTrue(any(p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]
                            for p in policies), "no default-deny policy")
        for p in policies:
            pods = [spec for _, spec, labels in r.pods()
                    if selects(p["spec"]["podSelector"], labels)]
            self.assertTrue(pods, "NetworkPolicy %s selects no pod" % p["metadata"]["name"])
            for rule in p["spec"].get("ingress", []):
                for port in rule.get("ports", []):
                    where = "NetworkPolicy %s port %s" % (p["metadata"]["name"], port)
                    protocol = port.get("protocol", "TCP")
                    self.assertIn("port", port, "%s: every port" % where)

                    def listened(spec):
                        low, high = port["port"], port.get("endPort", port["port"])
                        if isinstance(low, str):  # a name: this pod's containerPort of the name
                            named = [q["containerPort"]
                                     for c in spec.get("initContainers", []) + spec["containers"]
                                     if not runs_to_completion(spec, c)
                                     for q in c.get("ports", []) if q.get("name") == low]
                            if not named:
                                return False
                            low = high = named[0]
                        return any(proto == protocol and lo <= low and high <= hi
                                   for proto, lo, hi in r.pod_listens(spec))

                    self.assertTrue(any(listened(spec) for spec in pods),
                                    "%s: no pod the policy selects listens on it" % where)

    def check_flags_are_the_binaries(self, r):
        unknown = []
        for w, spec, c, binary in r.ferry_containers():
            flags = binary_flags(binary)
            where = "%s %s" % (k8s_render.name(w), c["name"])
            name = "ferry-" + binary
            for f in args_of(c):
                base = f[2:] if f.startswith("no") and f[2:] in flags else f
                if base not in flags or (base != f and flags[base].type != "bool"):
                    unknown.append("%s: --%s is not a flag of %s (its --help)" % (where, f, name))
            for key in r.config_of(spec, c):
                if key not in flags:
                    unknown.append("%s: --config key %r is not a flag of %s" % (where, key, name))
            model = r.setting(spec, c, "model") if "model" in flags else ""
            if model:
                self.assertTrue(any(model.startswith(m["mountPath"].rstrip("/") + "/")
                                    for m in c.get("volumeMounts", [])),
                                "%s: the model %s is not on a mounted volume" % (where, model))
            for bound in ("address", "admin_host", "host"):
                if bound in args_of(c):
                    self.assertNotIn(args_of(c)[bound].split(":")[0], ("127.0.0.1", "localhost"),
                                     "%s: --%s on loopback is unreachable" % (where, bound))
        self.assertEqual(sorted(set(unknown)), [], "\n" + "\n".join(sorted(set(unknown))))

    def check_store_fits_its_volume(self, r):
        units = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                 "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "KiB": 2**10, "MiB": 2**20,
                 "GiB": 2**30, "TiB": 2**40}

        def size(text):
            m = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]*)", text)
            self.assertTrue(m and m.group(2) in units, "not a size: %r" % text)
            return float(m.group(1)) * units[m.group(2)]

        store = r.by_name["StatefulSet/ferry-kvstore"]
        c = next(c for c in store["spec"]["template"]["spec"]["containers"]
                 if binary_of(c) == "kvstore")
        claims = {t["metadata"]["name"]: t for t in store["spec"]["volumeClaimTemplates"]}
        directory = args_of(c)["dir"]
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == directory)
        volume = size(claims[mount["name"]]["spec"]["resources"]["requests"]["storage"])
        capacity = size(r.setting(store["spec"]["template"]["spec"], c, "capacity"))
        self.assertLess(capacity, volume, "the store's --capacity does not fit its volume")

    def check_services(self, r):
        services = {o["metadata"]["name"]: o for o in r.objects if o["kind"] == "Service"}
        for name in ("ferry-prefill", "ferry-decode", "ferry-kvstore"):
            self.assertEqual(services[name]["spec"].get("clusterIP"), "None", name)
            self.assertIs(services[name]["spec"].get("publishNotReadyAddresses"), True, name)
        routers = r.by_name["Deployment/ferry-router"]["spec"].get("replicas", 1)
        if routers > 1:
            self.assertEqual(services["ferry-router"]["spec"].get("sessionAffinity"),
                             "ClientIP", "several routers without session affinity")
        for s in services.values():
            pods = [(spec, labels) for _, spec, labels in r.pods()
                    if selects({"matchLabels": s["spec"]["selector"]}, labels)]
            self.assertTrue(pods, "Service %s selects no pod" % s["metadata"]["name"])
            for port in s["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                self.assertTrue(all(any(target in (p.get("name"), p["containerPort"])
                                        for c in spec["containers"] for p in c.get("ports", []))
                                    for spec, _ in pods),
                                "Service %s targets %s, no container port" %
                                (s["metadata"]["name"], target))

    def planner(self, r):
        """(Deployment, pod spec, container) of ferry-planner."""
        w = r.by_name["Deployment/ferry-planner"]
        spec = w["spec"]["template"]["spec"]
        return w, spec, next(c for c in spec["containers"] if binary_of(c) == "planner")

    def planner_deployments(self, r):
        """The Deployments the planner sizes: --<pool>_deployment of each of its --pools."""
        _, spec, c = self.planner(r)
        names = set()
        for pool in r.setting(spec, c, "pools").split(","):
            name = r.setting(spec, c, pool + "_deployment")
            if name:
                names.add(name)
        return names

    def check_rbac_least_privilege(self, r):
        kinds = {o["kind"] for o in r.objects}
        self.assertFalse(kinds & {"ClusterRole", "ClusterRoleBinding"},
                         "a cluster-wide RBAC object")
        accounts = {o["metadata"]["name"] for o in r.objects if o["kind"] == "ServiceAccount"}
        roles = {o["metadata"]["name"]: o for o in r.objects if o["kind"] == "Role"}
        bound = {}  # ServiceAccount -> rules
        for b in (o for o in r.objects if o["kind"] == "RoleBinding"):
            where = "RoleBinding " + b["metadata"]["name"]
            self.assertEqual(b["roleRef"]["kind"], "Role", where)
            self.assertIn(b["roleRef"]["name"], roles, where)
            for subject in b["subjects"]:
                self.assertEqual(subject["kind"], "ServiceAccount", where)
                self.assertIn(subject["name"], accounts, where)
                self.assertEqual(subject.get("namespace"), b["metadata"].get("namespace"), where)
                bound.setdefault(subject["name"], []).extend(roles[b["roleRef"]["name"]]["rules"])
        for role in roles.values():
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                    self.assertNotIn("*", rule.get(field, []), "Role %s: a wildcard in %s"
                                     % (role["metadata"]["name"], field))
        _, planner_spec, planner = self.planner(r)
        actuator = r.setting(planner_spec, planner, "actuator")
        for w, spec, _ in r.pods():
            token = spec.get("automountServiceAccountToken", True)
            account = spec.get("serviceAccountName", "default")
            if k8s_render.name(w) == "Deployment/ferry-planner" and actuator == "kubernetes":
                self.assertIs(token, True, "the planner needs its token")
                self.assertIn(account, accounts)
                granted = {}
                for rule in bound.get(account, []):
                    for group in rule["apiGroups"]:
                        for resource in rule["resources"]:
                            for verb in rule["verbs"]:
                                granted.setdefault((group, resource, verb), set()).update(
                                    rule.get("resourceNames", []) or {None})
                want = {key: ({None} if names is None else self.planner_deployments(r))
                        for key, names in PLANNER_RULES.items()}
                self.assertEqual(granted, want, "the planner's Role is not exactly what its "
                                 "actuator calls")
            else:
                self.assertIs(token, False, "%s mounts a service account token"
                              % k8s_render.name(w))
                self.assertFalse(bound.get(account), "%s runs as %s, which is bound to a Role"
                                 % (k8s_render.name(w), account))

    def check_planner_or_hpa_never_both(self, r):
        w, spec, c = self.planner(r)
        self.assertEqual(w["spec"].get("replicas", 1), 1, "two planners would both scale")
        self.assertEqual(w["spec"].get("strategy", {}).get("type"), "Recreate",
                         "a rolling update runs two planners at once")
        actuator = r.setting(spec, c, "actuator")
        self.assertIn(actuator, ("kubernetes", "advice"))
        managed = self.planner_deployments(r)
        self.assertTrue(managed)
        for name in managed:
            self.assertIn("Deployment/" + name, r.by_name, "the planner sizes %s, absent" % name)
            self.assertNotIn("replicas", r.by_name["Deployment/" + name]["spec"],
                             "%s sets spec.replicas: `kubectl apply` would reset the size the "
                             "planner or the HPA set" % name)
        hpas = [o for o in r.objects if o["kind"] == "HorizontalPodAutoscaler"]
        targets = {h["spec"]["scaleTargetRef"]["name"] for h in hpas}
        if actuator == "kubernetes":
            self.assertFalse(targets & managed, "an HPA and the planner both scale %s"
                             % sorted(targets & managed))
        else:
            self.assertEqual(targets, managed, "advice mode: one HPA per pool the planner sizes")
            for h in hpas:
                (metric,) = h["spec"]["metrics"]
                self.assertEqual(metric["external"]["metric"]["name"],
                                 "ferry_planner_desired_replicas")
                self.assertEqual(metric["external"]["target"],
                                 {"type": "AverageValue", "averageValue": "1"})

    def check_encoder_pool(self, r):
        """With the encoder pool: the router finds it by DNS, only the router and the workers reach
        its gRPC port, and it loads the router's and the workers' model at their precision."""
        encoders = [(w, spec, c) for w, spec, c, b in r.ferry_containers() if b == "encoder"]
        if not encoders:
            return
        services = {o["metadata"]["name"]: o for o in r.objects if o["kind"] == "Service"}
        routers = [(spec, c) for _, spec, c, b in r.ferry_containers() if b == "router"]
        workers = [(spec, c) for _, spec, c, b in r.ferry_containers() if b == "worker"]
        self.assertTrue(routers and workers)
        for w, spec, c in encoders:
            where = k8s_render.name(w)
            labels = w["spec"]["template"]["metadata"]["labels"]
            grpc = port_of(r.expand(c, r.setting(spec, c, "address")), where)
            # The router's --encoders_dns names a headless Service of these pods on that port.
            for router_spec, router in routers:
                names = [e for e in r.setting(router_spec, router, "encoders_dns").split(",") if e]
                found = False
                for entry in names:
                    host, _, port = entry.rpartition(":")
                    s = services.get(host.split(".")[0])
                    if (s is not None and port.isdigit() and int(port) == grpc and
                            selects({"matchLabels": s["spec"]["selector"]}, labels)):
                        self.assertEqual(s["spec"].get("clusterIP"), "None", "%s: Service %s "
                                         "is not headless" % (where, s["metadata"]["name"]))
                        self.assertIs(s["spec"].get("publishNotReadyAddresses"), True, where)
                        self.assertIn(grpc, [p["port"] for p in s["spec"]["ports"]], where)
                        found = True
                self.assertTrue(found, "%s: the router's --encoders_dns (%s) names no Service of "
                                "its pods on its gRPC port %d" % (where, names, grpc))
            # Every NetworkPolicy rule that admits its gRPC port names only the clients' pods.
            admitting = []
            for p in (o for o in r.objects if o["kind"] == "NetworkPolicy"):
                if not selects(p["spec"]["podSelector"], labels):
                    continue
                for rule in p["spec"].get("ingress", []):
                    ports = rule.get("ports")
                    if ports and not any(q.get("port") in (grpc, "grpc") or
                                         (isinstance(q.get("port"), int) and
                                          q["port"] <= grpc <= q.get("endPort", q["port"]))
                                         for q in ports):
                        continue
                    admitting.append(rule)
                    peers = rule.get("from")
                    self.assertTrue(peers, "NetworkPolicy %s admits %s's gRPC from anywhere"
                                    % (p["metadata"]["name"], where))
                    for peer in peers:
                        self.assertEqual(set(peer), {"podSelector"}, "NetworkPolicy %s admits "
                                         "%s's gRPC from beyond the namespace's pods"
                                         % (p["metadata"]["name"], where))
                        allowed = [component for component in ("router", "prefill", "decode",
                                                                "encoder", "kvstore", "planner")
                                   if selects(peer["podSelector"], {
                                       "app.kubernetes.io/name": "ferry",
                                       "app.kubernetes.io/component": component})]
                        self.assertTrue(set(allowed) <= ENCODER_CLIENTS and
                                        peer["podSelector"].get("matchLabels", {}).get(
                                            "app.kubernetes.io/name") == "ferry",
                                        "NetworkPolicy %s admits %s's gRPC from %s" %
                                        (p["metadata"]["name"], where, allowed or "other pods"))
            self.assertTrue(admitting, "%s: no NetworkPolicy admits its gRPC port" % where)
            # The model: the router's and every worker's; the precision: the workers'.
            model = r.setting(spec, c, "model")
            for other_spec, other in routers + workers:
                self.assertEqual(r.setting(other_spec, other, "model"), model, "%s loads %s, "
                                 "%s another model" % (where, model, other["name"]))
            precision = {"f32": "f32", "bf16": "bf16", "native": "bf16"}
            for other_spec, other in workers:
                self.assertEqual(precision[r.setting(spec, c, "weights")],
                                 precision[r.setting(other_spec, other, "weights")],
                                 "%s: --weights differs from the workers' (rows they refuse)"
                                 % where)

    def test_checks_catch_breakage(self):
        """Each check fails on a rendered overlay broken the way it guards against (the cpu
        overlay; the init container's cases on testdata/model-init-container)."""
        def spec_of(r, workload):
            return r.by_name[workload]["spec"]["template"]["spec"]

        def container(r, workload, name):
            spec = spec_of(r, workload)
            return next(c for c in spec.get("initContainers", []) + spec["containers"]
                        if c["name"] == name)

        def set_arg(c, flag, value):
            c["args"] = [a for a in c["args"] if not a.startswith("--%s=" % flag)] + [
                "--%s=%s" % (flag, value)]

        def secret_value(r, name, key):
            return base64.b64decode(r.by_name["Secret/" + name]["data"][key]).decode()

        def set_secret(r, name, key, value):
            r.by_name["Secret/" + name]["data"][key] = base64.b64encode(value.encode()).decode()

        def drop_probe(r):
            del container(r, "Deployment/ferry-decode", "worker")["livenessProbe"]

        def root(r):
            container(r, "Deployment/ferry-router", "router")["securityContext"]["runAsUser"] = 0

        def short_grace(r):
            spec_of(r, "Deployment/ferry-prefill")["terminationGracePeriodSeconds"] = 60

        def no_pdb(r):
            r.objects.remove(r.by_name["PodDisruptionBudget/ferry-kvstore"])

        def leak(r):
            token = secret_value(r, "ferry-token", "token")
            r.configmaps[next(iter(r.configmaps))]["data"]["leak"] = token

        def leak_in_annotation(r):
            key = json.loads(secret_value(r, "ferry-api-keys", "keys.json"))["keys"][0]["key"]
            r.by_name["Deployment/ferry-router"]["spec"]["template"]["metadata"][
                "annotations"] = {"example.com/smoke-key": key}

        def leak_in_label(r):
            r.by_name["Service/ferry-router"]["metadata"]["labels"]["token"] = secret_value(
                r, "ferry-token", "token")

        def leak_in_binary_data(r):
            token = secret_value(r, "ferry-token", "token")
            r.configmaps[next(iter(r.configmaps))]["binaryData"] = {
                "blob": base64.b64encode(b"\x00\x01" + token.encode()).decode()}

        def leak_json_escaped(r):
            # A token with a character JSON escapes, inside a ConfigMap's JSON file: the file
            # holds tok\"en..., never the token as written.
            token = 'EXAMPLE-"quoted"-token-0123456789'
            set_secret(r, "ferry-token", "token", token + "\n")
            cm = r.configmaps[next(iter(r.configmaps))]
            cm["data"]["extra.json"] = json.dumps({"auth_token": token})

        def leak_short(r):
            # Another program's short password (6 characters), in an env value.
            r.objects.append({"apiVersion": "v1", "kind": "Secret",
                              "metadata": {"name": "pin"},
                              "data": {"pin": base64.b64encode(b"493817").decode()}})
            container(r, "Deployment/ferry-router", "router")["env"].append(
                {"name": "PIN", "value": "493817"})

        def subpath_secret_in_init(r):
            c = container(r, "Deployment/ferry-router", "fetch-model")
            c["volumeMounts"].append({"name": "token", "mountPath": "/etc/ferry/token/token",
                                      "subPath": "token", "readOnly": True})

        def wildcard(r):
            c = container(r, "StatefulSet/ferry-kvstore", "kvstore")
            c["args"] = [a if not a.startswith("--advertise_address") else
                         "--advertise_address=0.0.0.0" for a in c["args"]]

        def closed_port(r):
            r.by_name["NetworkPolicy/ferry-kvstore"]["spec"]["ingress"][0]["ports"][0]["port"] = 7401

        def port_another_pod_listens_on(r):
            # 9091 is the workers' admin port: the routers, which this policy selects, do not
            # listen on it.
            r.by_name["NetworkPolicy/ferry-router-api"]["spec"]["ingress"][0]["ports"].append(
                {"protocol": "TCP", "port": 9091})

        def named_port_another_pod_has(r):
            r.by_name["NetworkPolicy/ferry-kvstore"]["spec"]["ingress"][0]["ports"][0][
                "port"] = "http"  # the router's, not the store's

        def range_beyond_ucx(r):
            r.by_name["NetworkPolicy/ferry-workers"]["spec"]["ingress"][1]["ports"][0][
                "endPort"] = 50299

        def container_port_off_flag(r):
            set_arg(container(r, "Deployment/ferry-decode", "worker"), "address",
                    "0.0.0.0:50052")  # containerPort grpc stays 50051

        def admin_port_off_flag(r):
            set_arg(container(r, "Deployment/ferry-router", "router"), "admin_port", "9095")

        def probe_on_wrong_port(r):
            c = container(r, "Deployment/ferry-router", "router")
            c["readinessProbe"]["httpGet"]["port"] = "http"  # the API port, not the admin port

        def probe_on_unnamed_port(r):
            c = container(r, "StatefulSet/ferry-kvstore", "kvstore")
            c["livenessProbe"]["httpGet"]["port"] = "metrics"

        def unused_hostpath(r):
            # The planner with the node's model directory, which it never reads (the cpu
            # overlay's patch before it named the pods that load the model).
            spec_of(r, "Deployment/ferry-planner")["volumes"] = [
                {"name": "models", "hostPath": {"path": "/var/lib/ferry/models",
                                                "type": "Directory"}}]

        def hostpath_nobody_reads(r):
            spec = spec_of(r, "Deployment/ferry-planner")
            spec["volumes"] = [{"name": "models", "hostPath": {"path": "/var/lib/ferry/models"}}]
            spec["containers"][0]["volumeMounts"] = [
                {"name": "models", "mountPath": "/models", "readOnly": True}]

        def hostpath_writable(r):
            c = container(r, "Deployment/ferry-decode", "worker")
            next(m for m in c["volumeMounts"] if m["name"] == "models")["readOnly"] = False

        def undeclared_volume(r):
            container(r, "Deployment/ferry-decode", "worker")["volumeMounts"].append(
                {"name": "scratch", "mountPath": "/scratch"})

        def typo(r):
            container(r, "Deployment/ferry-decode", "worker")["args"].append("--drain_grase=1s")

        def wrong_image(r):
            # The router's container running the planner's image: the router's flags are not
            # the planner's (the binary is the image's, whatever the container's name).
            container(r, "Deployment/ferry-router", "router")["image"] = "ferry-planner:latest"

        def foreign_container(r):
            container(r, "Deployment/ferry-router", "router")["image"] = "busybox:1.36"

        def wildcard_verb(r):
            r.by_name["Role/ferry-planner"]["rules"][2]["verbs"].append("*")

        def extra_verb(r):
            r.by_name["Role/ferry-planner"]["rules"][0]["verbs"].append("update")

        def router_token(r):
            spec_of(r, "Deployment/ferry-router")["automountServiceAccountToken"] = True

        def hpa_too(r):
            r.objects.append({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                              "metadata": {"name": "ferry-decode"},
                              "spec": {"scaleTargetRef": {"apiVersion": "apps/v1",
                                                          "kind": "Deployment",
                                                          "name": "ferry-decode"},
                                       "maxReplicas": 4, "metrics": []}})

        def fixed_replicas(r):
            r.by_name["Deployment/ferry-decode"]["spec"]["replicas"] = 2

        # The init container (testdata/model-init-container).
        def init_probe(r):
            container(r, "Deployment/ferry-decode", "fetch-model")["readinessProbe"] = {
                "exec": {"command": ["true"]}}

        def init_root(r):
            container(r, "Deployment/ferry-decode", "fetch-model")["securityContext"][
                "runAsUser"] = 0

        def init_writable_root(r):
            container(r, "Deployment/ferry-decode", "fetch-model")["securityContext"][
                "readOnlyRootFilesystem"] = False

        def init_no_limits(r):
            del container(r, "Deployment/ferry-decode", "fetch-model")["resources"]["limits"]

        def sidecar_without_probes(r):
            # restartPolicy Always: a sidecar, which runs beside the worker and needs probes.
            container(r, "Deployment/ferry-decode", "fetch-model")["restartPolicy"] = "Always"

        def init_ferry_typo(r):
            # An init container running a Ferry binary is held to its --help.
            c = container(r, "Deployment/ferry-decode", "fetch-model")
            c["command"] = ["/usr/local/bin/ferry-worker", "--no_such_flag=1"]

        # The encoder pool (cpu+encoder).
        def encoder_short_grace(r):
            spec_of(r, "Deployment/ferry-encoder")["terminationGracePeriodSeconds"] = 30

        def encoder_no_pdb(r):
            r.objects.remove(r.by_name["PodDisruptionBudget/ferry-encoder"])

        def encoder_open_to_all(r):
            del r.by_name["NetworkPolicy/ferry-encoder"]["spec"]["ingress"][0]["from"]

        def encoder_open_to_the_store(r):
            r.by_name["NetworkPolicy/ferry-encoder"]["spec"]["ingress"][0]["from"][0][
                "podSelector"]["matchExpressions"][0]["values"].append("kvstore")

        def encoder_open_to_another_namespace(r):
            r.by_name["NetworkPolicy/ferry-encoder"]["spec"]["ingress"][0]["from"][0][
                "namespaceSelector"] = {}

        def router_without_encoders(r):
            c = container(r, "Deployment/ferry-router", "router")
            c["args"] = [a for a in c["args"] if not a.startswith("--encoders_dns=")]

        def router_encoders_wrong_port(r):
            set_arg(container(r, "Deployment/ferry-router", "router"), "encoders_dns",
                    "ferry-encoder:50051")

        def encoder_other_model(r):
            set_arg(container(r, "Deployment/ferry-encoder", "encoder"), "model",
                    "/models/other")

        def encoder_other_precision(r):
            set_arg(container(r, "Deployment/ferry-encoder", "encoder"), "weights", "f32")

        def encoder_without_probe(r):
            del container(r, "Deployment/ferry-encoder", "encoder")["readinessProbe"]

        cpu, init, enc = "cpu", "model-init-container", "cpu+encoder"
        for variant, mutate, check in (
                (cpu, drop_probe, PolicyTest.check_probes_resources_and_security),
                (cpu, root, PolicyTest.check_probes_resources_and_security),
                (cpu, short_grace, PolicyTest.check_grace_exceeds_shutdown),
                (cpu, no_pdb, PolicyTest.check_every_workload_has_a_pdb),
                (cpu, leak, PolicyTest.check_secrets_stay_secret),
                (cpu, leak_in_annotation, PolicyTest.check_secrets_stay_secret),
                (cpu, leak_in_label, PolicyTest.check_secrets_stay_secret),
                (cpu, leak_in_binary_data, PolicyTest.check_secrets_stay_secret),
                (cpu, leak_json_escaped, PolicyTest.check_secrets_stay_secret),
                (cpu, leak_short, PolicyTest.check_secrets_stay_secret),
                (init, subpath_secret_in_init, PolicyTest.check_secrets_stay_secret),
                (cpu, wildcard, PolicyTest.check_advertised_addresses),
                (cpu, closed_port, PolicyTest.check_network_policy_ports_are_listened_on),
                (cpu, port_another_pod_listens_on,
                 PolicyTest.check_network_policy_ports_are_listened_on),
                (cpu, named_port_another_pod_has,
                 PolicyTest.check_network_policy_ports_are_listened_on),
                (cpu, range_beyond_ucx, PolicyTest.check_network_policy_ports_are_listened_on),
                (cpu, container_port_off_flag, PolicyTest.check_container_ports_are_listened_on),
                (cpu, admin_port_off_flag, PolicyTest.check_container_ports_are_listened_on),
                (cpu, probe_on_wrong_port, PolicyTest.check_container_ports_are_listened_on),
                (cpu, probe_on_unnamed_port, PolicyTest.check_container_ports_are_listened_on),
                (cpu, unused_hostpath, PolicyTest.check_volumes_are_used),
                (cpu, hostpath_nobody_reads, PolicyTest.check_volumes_are_used),
                (cpu, hostpath_writable, PolicyTest.check_volumes_are_used),
                (cpu, undeclared_volume, PolicyTest.check_volumes_are_used),
                (cpu, typo, PolicyTest.check_flags_are_the_binaries),
                (cpu, wrong_image, PolicyTest.check_flags_are_the_binaries),
                (cpu, foreign_container, PolicyTest.check_containers_are_known),
                (cpu, wildcard_verb, PolicyTest.check_rbac_least_privilege),
                (cpu, extra_verb, PolicyTest.check_rbac_least_privilege),
                (cpu, router_token, PolicyTest.check_rbac_least_privilege),
                (cpu, hpa_too, PolicyTest.check_planner_or_hpa_never_both),
                (cpu, fixed_replicas, PolicyTest.check_planner_or_hpa_never_both),
                (init, init_probe, PolicyTest.check_probes_resources_and_security),
                (init, init_root, PolicyTest.check_probes_resources_and_security),
                (init, init_writable_root, PolicyTest.check_probes_resources_and_security),
                (init, init_no_limits, PolicyTest.check_probes_resources_and_security),
                (init, sidecar_without_probes, PolicyTest.check_probes_resources_and_security),
                (init, init_ferry_typo, PolicyTest.check_flags_are_the_binaries),
                (enc, encoder_short_grace, PolicyTest.check_grace_exceeds_shutdown),
                (enc, encoder_no_pdb, PolicyTest.check_every_workload_has_a_pdb),
                (enc, encoder_without_probe, PolicyTest.check_probes_resources_and_security),
                (enc, encoder_open_to_all, PolicyTest.check_encoder_pool),
                (enc, encoder_open_to_the_store, PolicyTest.check_encoder_pool),
                (enc, encoder_open_to_another_namespace, PolicyTest.check_encoder_pool),
                (enc, router_without_encoders, PolicyTest.check_encoder_pool),
                (enc, router_encoders_wrong_port, PolicyTest.check_encoder_pool),
                (enc, encoder_other_model, PolicyTest.check_encoder_pool),
                (enc, encoder_other_precision, PolicyTest.check_encoder_pool)):
            with self.subTest(breakage=mutate.__name__):
                r = copy.deepcopy(self.variant[variant])
                mutate(r)
                with self.assertRaises(AssertionError):
                    check(self, r)

    def test_checks_follow_the_binary_not_the_name(self):
        """A container is the binary its image is: renamed, it passes every check; and the
        fixture's init container, which runs cp, is no Ferry binary."""
        r = copy.deepcopy(self.variant["cpu"])
        for _, _, c in r.containers():
            c["name"] = "main"
        for name in [n for n in dir(PolicyTest) if n.startswith("check_")]:
            with self.subTest(check=name):
                getattr(PolicyTest, name)(self, r)
        init = self.variant["model-init-container"]
        fetch = [c for _, _, c in init.containers() if c["name"] == "fetch-model"]
        self.assertEqual(len(fetch), 3, "fetch-model in the router, prefill and decode pods")
        self.assertEqual({binary_of(c) for c in fetch}, {None})


def _each_overlay(check):
    def test(self):
        for r in self.rendered:
            with self.subTest(overlay=r.name):
                check(self, r)
    test.__doc__ = check.__doc__
    return test


for _name in [n for n in vars(PolicyTest) if n.startswith("check_")]:
    setattr(PolicyTest, "test_" + _name[len("check_"):], _each_overlay(getattr(PolicyTest, _name)))


if __name__ == "__main__":
    if len(sys.argv) < 6:
        sys.exit("usage: policy_test.py ROUTER_BIN WORKER_BIN KVSTORE_BIN PLANNER_BIN ENCODER_BIN "
                 "[unittest args]")
    BINARIES.update(router=sys.argv[1], worker=sys.argv[2], kvstore=sys.argv[3],
                    planner=sys.argv[4], encoder=sys.argv[5])
    unittest.main(argv=[sys.argv[0]] + sys.argv[6:])
