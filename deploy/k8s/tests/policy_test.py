"""Policy over the rendered objects of every overlay (deploy/k8s/README.md, "What is checked").

  policy_test.py ROUTER_BIN WORKER_BIN KVSTORE_BIN PLANNER_BIN

The binaries give the flags a container may use: each one's --help lists them, and its
defaults for the drain budget. Every rule below is one a reviewer would otherwise check by eye:
  - every container has startup, readiness and liveness probes (on its admin port: /healthz,
    /readyz), requests and limits of cpu and memory; runs as a non-root user with a read-only
    root filesystem, no privilege escalation, ALL capabilities dropped (the gpu overlay's
    workers may add IPC_LOCK, nothing else), seccomp RuntimeDefault;
  - every Deployment and StatefulSet has a PodDisruptionBudget selecting its pods;
  - grace periods exceed each binary's whole shutdown (the worker: --drain_grace +
    --handoff_wait + --rpc_grace, from its args, its --config file, or --help's defaults);
  - no Secret value appears in a ConfigMap, an argument or an env value; Secrets are mounted as
    directories (no subPath);
  - workers and store nodes advertise a pod IP (--advertise_address from status.podIP), never
    0.0.0.0; every address they bind is one they advertise a host for;
  - every port a NetworkPolicy admits is one a selected container listens on (a containerPort,
    or inside its UCX_TCP_PORT_RANGE), and every policy selects pods;
  - every flag in a container's args, and every key of its --config file, is one its binary's
    --help lists; the config file and the model it names are mounted;
  - the headless Services publish not-ready addresses; several routers have session affinity;
  - the store's --capacity fits its volume;
  - RBAC is least privilege: no ClusterRole, no wildcard; only the planner's pod gets a service
    account token, and only with --actuator=kubernetes; its Role grants exactly the calls of
    services/planner/kubernetes_actuator.h, on the Deployments the planner's flags name (the
    contract test tests/deploy:kubernetes_actuator_contract_test checks them against the calls);
  - the planner or an HPA on a pool, never both; the planner owns its pools' replica count (no
    spec.replicas in their Deployments), and runs as one replica, never two at once (Recreate).
Each overlay is checked as it is and with components/planner-advice (HPAs follow the planner).
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

BINARIES = {}  # container name -> binary path (from argv)
ADMIN_PORTS = {"router": 9090, "worker": 9091, "kvstore": 9092, "planner": 9093}
# The overlays as checked: each as it is, and with the planner in advice mode (an HPA per pool).
VARIANTS = [(o, []) for o in k8s_render.OVERLAYS] + [
    (o, ["components/planner-advice"]) for o in k8s_render.OVERLAYS]
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


class Flag:
    def __init__(self, name, type_, default):
        self.name, self.type, self.default = name, type_, default


_help_cache = {}


def binary_flags(container):
    """{name: Flag} of the binary a container runs, from its --help."""
    binary = BINARIES[container]
    if binary not in _help_cache:
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
        flags = {}
        for m in re.finditer(r'^  --([a-z0-9_]+) \((\w+), default ("(?:[^"\\]|\\.)*"|[^)]*)\)',
                             text, re.M):
            flags[m.group(1)] = Flag(m.group(1), m.group(2), m.group(3).strip('"'))
        if not flags:
            raise AssertionError("%s --help listed no flags:\n%s" % (binary, text[:2000]))
        for builtin in ("help", "version", "flagfile", "fromenv", "undefok"):
            flags.setdefault(builtin, Flag(builtin, "builtin", ""))
        _help_cache[binary] = flags
    return _help_cache[binary]


def seconds(duration):
    """A Go/absl duration ("30s", "1m30s", "500ms", "2h") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(ms|us|ns|h|m|s)", duration)
    if not parts or "".join(a + b for a, b in parts) != duration:
        raise AssertionError("not a duration: %r" % duration)
    return sum(float(a) * units[b] for a, b in parts)


def args_of(container):
    """{flag: value} of a container's args (every arg is --name=value or a bare --bool)."""
    out = {}
    for arg in container.get("args", []):
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


class Rendered:
    """One overlay's objects, indexed."""

    def __init__(self, overlay, components=()):
        self.overlay = overlay
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
        for w, spec, labels in self.pods():
            for c in spec.get("initContainers", []) + spec["containers"]:
                yield w, spec, c

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
            value = binary_flags(container["name"])[flag].default
        return str(value)


class PolicyTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.rendered = [Rendered(o, c) for o, c in VARIANTS]

    def check_containers_are_known(self, r):
        names = {c["name"] for _, _, c in r.containers()}
        self.assertEqual(names, set(BINARIES), "containers other than %s" % sorted(BINARIES))

    def check_probes_resources_and_security(self, r):
        for w, spec, c in r.containers():
            where = "%s container %s" % (k8s_render.name(w), c["name"])
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for probe, path in (("startupProbe", "/healthz"), ("readinessProbe", "/readyz"),
                                ("livenessProbe", "/healthz")):
                self.assertIn(probe, c, where)
                get = c[probe].get("httpGet")
                self.assertIsNotNone(get, "%s: %s is not an HTTP GET" % (where, probe))
                self.assertEqual(get["path"], path, "%s: %s" % (where, probe))
                port = ports.get(get["port"], get["port"])
                self.assertEqual(port, ADMIN_PORTS[c["name"]], "%s: %s port" % (where, probe))
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
            allowed = ["IPC_LOCK"] if (r.overlay == "gpu" and c["name"] == "worker") else []
            for cap in caps.get("add", []):
                self.assertIn(cap, allowed, "%s adds %s" % (where, cap))
            seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
            self.assertEqual(seccomp.get("type"), "RuntimeDefault", where)
            self.assertFalse(spec.get("hostNetwork") or spec.get("hostPID") or
                             spec.get("hostIPC"), where)
            if c["name"] == "worker":
                self.assertIn("UCX_TLS", env_of(c), "%s: UCX_TLS not pinned" % where)
                if r.overlay == "gpu":
                    self.assertIn("nvidia.com/gpu", c["resources"]["limits"], where)

    def check_every_workload_has_a_pdb(self, r):
        pdbs = [o for o in r.objects if o["kind"] == "PodDisruptionBudget"]
        for w, _, labels in r.pods():
            covering = [p for p in pdbs if selects(p["spec"]["selector"], labels)]
            self.assertEqual(len(covering), 1, "%s: PDBs %s" % (
                k8s_render.name(w), [p["metadata"]["name"] for p in covering]))

    def check_grace_exceeds_shutdown(self, r):
        for w, spec, c in r.containers():
            grace = spec.get("terminationGracePeriodSeconds", 30)
            if c["name"] == "worker":
                # services/worker/worker.cc Drain: the calls get drain_grace + handoff_wait + 5 s
                # to end, then gRPC's rpc_grace; plus 10 s for the engine, the store writes and
                # the DNS discovery to stop.
                need = sum(seconds(r.setting(spec, c, f))
                           for f in ("drain_grace", "handoff_wait", "rpc_grace")) + 5 + 10
                self.assertEqual(r.setting(spec, c, "exit_when_drained"), "true",
                                 "%s: a drained worker must exit" % k8s_render.name(w))
            elif c["name"] == "router":
                need = seconds(r.setting(spec, c, "shutdown_grace"))
            elif c["name"] == "planner":
                # Its loop ends after the round it is in: a router read and an actuator call.
                need = sum(seconds(r.setting(spec, c, f))
                           for f in ("router_timeout", "actuator_timeout"))
            else:
                need = int(r.setting(spec, c, "rpc_grace_ms")) / 1000.0
            pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
            need += pre_stop.get("seconds", 0)
            self.assertGreater(grace, need, "%s: terminationGracePeriodSeconds %s <= %s s of "
                               "shutdown" % (k8s_render.name(w), grace, need))

    def check_secrets_stay_secret(self, r):
        values = []
        for s in (o for o in r.objects if o["kind"] == "Secret"):
            for v in (s.get("data") or {}).values():
                values.append(base64.b64decode(v).decode())
            values += list((s.get("stringData") or {}).values())
        pieces = set()
        for v in values:
            pieces.update(line.strip() for line in v.splitlines() if len(line.strip()) >= 8)
            try:
                doc = json.loads(v)
                pieces.update(k["key"] for k in doc.get("keys", []))
            except ValueError:
                pass
        self.assertTrue(pieces, "no Secret values found: the check would pass vacuously")
        places = [("ConfigMap/" + name, json.dumps(cm.get("data", {})))
                  for name, cm in r.configmaps.items()]
        for w, _, c in r.containers():
            places.append(("%s %s" % (k8s_render.name(w), c["name"]),
                           json.dumps([c.get("args", []), c.get("env", [])])))
        for where, text in places:
            for p in pieces:
                self.assertNotIn(p, text, "a Secret value appears in %s" % where)
        secret_volumes = set()
        for w, spec, _ in r.pods():
            secret_volumes = {v["name"] for v in spec.get("volumes", []) if "secret" in v}
            for c in spec["containers"]:
                for m in c.get("volumeMounts", []):
                    if m["name"] in secret_volumes:
                        self.assertNotIn("subPath", m, "%s: Secret %s mounted with subPath "
                                         "(never updated)" % (k8s_render.name(w), m["name"]))

    def check_advertised_addresses(self, r):
        for w, _, c in r.containers():
            if c["name"] in ("router", "planner"):  # they advertise no address
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
        policies = [o for o in r.objects if o["kind"] == "NetworkPolicy"]
        self.assertTrue(policies)
        self.assertTrue(any(p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]
                            for p in policies), "no default-deny policy")
        for p in policies:
            pods = [(spec, labels) for _, spec, labels in r.pods()
                    if selects(p["spec"]["podSelector"], labels)]
            self.assertTrue(pods, "NetworkPolicy %s selects no pod" % p["metadata"]["name"])
            listened, ranges = set(), []
            for spec, _ in pods:
                for c in spec["containers"]:
                    for port in c.get("ports", []):
                        listened.add(port["containerPort"])
                        listened.add(port.get("name"))
                    ucx = env_of(c).get("UCX_TCP_PORT_RANGE", {}).get("value")
                    if ucx:
                        lo, hi = map(int, ucx.split("-"))
                        ranges.append((lo, hi))
            for rule in p["spec"].get("ingress", []):
                for port in rule.get("ports", []):
                    where = "NetworkPolicy %s port %s" % (p["metadata"]["name"], port)
                    if "endPort" in port:
                        self.assertTrue(any(lo <= port["port"] and port["endPort"] <= hi
                                            for lo, hi in ranges), where)
                    else:
                        self.assertTrue(port["port"] in listened or any(
                            lo <= port["port"] <= hi for lo, hi in ranges), where)

    def check_flags_are_the_binaries(self, r):
        unknown = []
        for w, spec, c in r.containers():
            flags = binary_flags(c["name"])
            where = "%s %s" % (k8s_render.name(w), c["name"])
            binary = os.path.basename(BINARIES[c["name"]])
            for f in args_of(c):
                base = f[2:] if f.startswith("no") and f[2:] in flags else f
                if base not in flags or (base != f and flags[base].type != "bool"):
                    unknown.append("%s: --%s is not a flag of %s (its --help)" % (where, f, binary))
            for key in r.config_of(spec, c):
                if key not in flags:
                    unknown.append("%s: --config key %r is not a flag of %s" % (where, key, binary))
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
        c = store["spec"]["template"]["spec"]["containers"][0]
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
        return w, spec, next(c for c in spec["containers"] if c["name"] == "planner")

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

    def test_checks_catch_breakage(self):
        """Each check fails on a rendered overlay broken the way it guards against."""
        def container(r, workload, name):
            spec = r.by_name[workload]["spec"]["template"]["spec"]
            return next(c for c in spec["containers"] if c["name"] == name)

        def drop_probe(r):
            del container(r, "Deployment/ferry-decode", "worker")["livenessProbe"]

        def root(r):
            container(r, "Deployment/ferry-router", "router")["securityContext"]["runAsUser"] = 0

        def short_grace(r):
            r.by_name["Deployment/ferry-prefill"]["spec"]["template"]["spec"][
                "terminationGracePeriodSeconds"] = 60

        def no_pdb(r):
            r.objects.remove(r.by_name["PodDisruptionBudget/ferry-kvstore"])

        def leak(r):
            token = base64.b64decode(r.by_name["Secret/ferry-token"]["data"]["token"]).decode()
            r.configmaps[next(iter(r.configmaps))]["data"]["leak"] = token

        def wildcard(r):
            c = container(r, "StatefulSet/ferry-kvstore", "kvstore")
            c["args"] = [a if not a.startswith("--advertise_address") else
                         "--advertise_address=0.0.0.0" for a in c["args"]]

        def closed_port(r):
            r.by_name["NetworkPolicy/ferry-kvstore"]["spec"]["ingress"][0]["ports"][0]["port"] = 7401

        def typo(r):
            container(r, "Deployment/ferry-decode", "worker")["args"].append("--drain_grase=1s")

        def wildcard_verb(r):
            r.by_name["Role/ferry-planner"]["rules"][2]["verbs"].append("*")

        def extra_verb(r):
            r.by_name["Role/ferry-planner"]["rules"][0]["verbs"].append("update")

        def router_token(r):
            r.by_name["Deployment/ferry-router"]["spec"]["template"]["spec"][
                "automountServiceAccountToken"] = True

        def hpa_too(r):
            r.objects.append({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                              "metadata": {"name": "ferry-decode"},
                              "spec": {"scaleTargetRef": {"apiVersion": "apps/v1",
                                                          "kind": "Deployment",
                                                          "name": "ferry-decode"},
                                       "maxReplicas": 4, "metrics": []}})

        def fixed_replicas(r):
            r.by_name["Deployment/ferry-decode"]["spec"]["replicas"] = 2

        for mutate, check in ((drop_probe, PolicyTest.check_probes_resources_and_security),
                              (root, PolicyTest.check_probes_resources_and_security),
                              (short_grace, PolicyTest.check_grace_exceeds_shutdown),
                              (no_pdb, PolicyTest.check_every_workload_has_a_pdb),
                              (leak, PolicyTest.check_secrets_stay_secret),
                              (wildcard, PolicyTest.check_advertised_addresses),
                              (closed_port, PolicyTest.check_network_policy_ports_are_listened_on),
                              (typo, PolicyTest.check_flags_are_the_binaries),
                              (wildcard_verb, PolicyTest.check_rbac_least_privilege),
                              (extra_verb, PolicyTest.check_rbac_least_privilege),
                              (router_token, PolicyTest.check_rbac_least_privilege),
                              (hpa_too, PolicyTest.check_planner_or_hpa_never_both),
                              (fixed_replicas, PolicyTest.check_planner_or_hpa_never_both)):
            with self.subTest(breakage=mutate.__name__):
                r = copy.deepcopy(self.rendered[0])
                mutate(r)
                with self.assertRaises(AssertionError):
                    check(self, r)


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
    if len(sys.argv) < 5:
        sys.exit("usage: policy_test.py ROUTER_BIN WORKER_BIN KVSTORE_BIN PLANNER_BIN "
                 "[unittest args]")
    BINARIES.update(router=sys.argv[1], worker=sys.argv[2], kvstore=sys.argv[3],
                    planner=sys.argv[4])
    unittest.main(argv=[sys.argv[0]] + sys.argv[5:])
