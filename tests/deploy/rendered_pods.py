"""The pods a rendered kustomize overlay would run, as Kubernetes would start their containers:
each container's environment (Downward API fields, Secret and ConfigMap keys, $(VAR) references
to earlier variables), its command line with Kubernetes' $(VAR) expansion, its volumes and its
readiness probe. For the image smoke test (image_smoke_test.py), which runs those command lines
in containers, and for its own unit test (rendered_pods_test.py, on a fixture).

    objects = load(yaml_text)                # or render(kubectl, overlay_dir)
    for w in workloads(objects):             # Deployments and StatefulSets
        pod = w.pod(index, pod_ip)           # one replica: its name and IP fill the fieldRefs
        for c in pod.containers:  c.argv, c.env, c.mounts, c.readiness

Only what the smoke test needs and the overlays use is modelled; anything else (a subPath mount,
a hostPath volume, an unknown fieldRef) raises UnsupportedError, never a silent guess.
Plain data, no I/O but render(); not thread-safe (nothing shared).
"""
import base64
import math
import subprocess

import yaml


class UnsupportedError(ValueError):
    pass


def render(kubectl, overlay_dir):
    """`kubectl kustomize overlay_dir`'s objects."""
    p = subprocess.run([kubectl, "kustomize", overlay_dir], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay_dir}: exit {p.returncode}: {p.stderr}")
    return load(p.stdout)


def load(text):
    return [o for o in yaml.safe_load_all(text) if o]


def find(objects, kind, name):
    for o in objects:
        if o.get("kind") == kind and o["metadata"]["name"] == name:
            return o
    raise KeyError(f"no {kind} {name} in the rendered objects")


# ------------------------------------------------------------------------------------------------
# $(VAR) expansion: k8s.io/kubernetes/third_party/forked/golang/expansion (Expand).


def expand(text, variables):
    """`text` with each $(NAME) whose NAME is in `variables` replaced; $$ is a literal $, an
    unknown $(NAME) and an unterminated $( stay as written."""
    out = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1:]
            if rest[0] == "$":
                out.append("$")
                advance = 1
            elif rest[0] == "(":
                close = rest.find(")")
                if close < 0:
                    out.append("$(")
                    advance = 1
                else:
                    name = rest[1:close]
                    out.append(variables[name] if name in variables else f"$({name})")
                    advance = close + 1
            else:
                out.append("$" + rest[0])
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


# ------------------------------------------------------------------------------------------------
# Quantities (resourceFieldRef)

_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12, "m": 10**-3, "": 1}


def quantity(text):
    text = str(text)
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            return float(text[:-len(suffix)]) * _SUFFIXES[suffix]
    return float(text)


# ------------------------------------------------------------------------------------------------
# Pods


class Mount:
    """One volumeMount with what backs it: kind is "secret" or "configMap" (files: {name: bytes}),
    "emptyDir", "claim" (a PVC or a StatefulSet's volumeClaimTemplate), or "other" (the volume as
    written, for the caller to back, e.g. the model's)."""

    def __init__(self, path, read_only, kind, volume, files=None):
        self.path, self.read_only, self.kind, self.volume = path, read_only, kind, volume
        self.files = files or {}


class Container:
    def __init__(self, name, image, argv, has_command, env, mounts, readiness, ports):
        self.name, self.image = name, image
        self.argv = argv                # command + args after expansion (command may be empty)
        self.has_command = has_command  # argv[0] replaces the image's ENTRYPOINT
        self.env = env                  # {name: value}, in definition order
        self.mounts = mounts
        self.readiness = readiness      # {"path", "port"[, "host"]} of an httpGet probe, or None
        self.ports = ports              # {name: containerPort}

    def flag(self, name, default=None):
        """The value of --name=VALUE on the command line (the last one, as absl reads it)."""
        value = default
        for a in self.argv:
            if a.startswith(f"--{name}="):
                value = a.split("=", 1)[1]
        return value


class Pod:
    def __init__(self, name, ip, labels, hostname, subdomain, containers):
        self.name, self.ip, self.labels = name, ip, labels
        self.hostname, self.subdomain = hostname, subdomain
        self.containers = containers


class Workload:
    """A Deployment or StatefulSet of the rendered objects."""

    def __init__(self, obj, objects):
        self.obj, self.objects = obj, objects
        self.kind = obj["kind"]
        self.name = obj["metadata"]["name"]
        self.namespace = obj["metadata"].get("namespace", "default")
        self.spec = obj["spec"]["template"]["spec"]
        self.labels = obj["spec"]["template"]["metadata"].get("labels", {})
        self.replicas = obj["spec"].get("replicas", 1)

    def component(self):
        return self.labels.get("app.kubernetes.io/component")

    def pod_name(self, index):
        if self.kind == "StatefulSet":
            return f"{self.name}-{index}"
        return f"{self.name}-smoke-{index}"

    def pod(self, index, ip):
        name = self.pod_name(index)
        hostname = name if self.kind == "StatefulSet" else self.spec.get("hostname", name)
        subdomain = (self.obj["spec"].get("serviceName") if self.kind == "StatefulSet"
                     else self.spec.get("subdomain"))
        fields = {"metadata.name": name, "metadata.namespace": self.namespace,
                  "status.podIP": ip, "status.podIPs": ip, "status.hostIP": ip,
                  "spec.nodeName": "smoke-node",
                  "spec.serviceAccountName": self.spec.get("serviceAccountName", "default")}
        for k, v in self.labels.items():
            fields[f"metadata.labels['{k}']"] = v
        claims = {t["metadata"]["name"] for t in self.obj["spec"].get("volumeClaimTemplates", [])}
        containers = [self._container(c, fields, claims) for c in self.spec["containers"]]
        return Pod(name, ip, self.labels, hostname, subdomain, containers)

    def _container(self, c, fields, claims):
        env = {}
        for source in c.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = _config_map_data(self.objects, source["configMapRef"]["name"])
            elif "secretRef" in source:
                data = _secret_data(self.objects, source["secretRef"]["name"])
            else:
                raise UnsupportedError(f"envFrom {source}")
            for k, v in data.items():
                env[prefix + k] = v.decode()
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(str(e["value"]), env)
            elif "valueFrom" in e:
                env[e["name"]] = self._value_from(e["valueFrom"], fields, c)
            else:
                env[e["name"]] = ""
        command = [expand(str(a), env) for a in c.get("command", [])]
        args = [expand(str(a), env) for a in c.get("args", [])]
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        mounts = []
        for m in c.get("volumeMounts", []):
            if m.get("subPath") or m.get("subPathExpr"):
                raise UnsupportedError(f"{c['name']}: subPath mount of {m['name']} (a Secret or "
                                       "ConfigMap under subPath is never updated)")
            read_only = bool(m.get("readOnly", False))
            if m["name"] in claims:
                mounts.append(Mount(m["mountPath"], read_only, "claim", {"name": m["name"]}))
                continue
            v = volumes.get(m["name"])
            if v is None:
                raise UnsupportedError(f"{c['name']}: mount of undeclared volume {m['name']}")
            if "secret" in v:
                data = _secret_data(self.objects, v["secret"]["secretName"])
                mounts.append(Mount(m["mountPath"], True, "secret", v,
                                    _items(data, v["secret"].get("items"))))
            elif "configMap" in v:
                data = _config_map_data(self.objects, v["configMap"]["name"])
                mounts.append(Mount(m["mountPath"], True, "configMap", v,
                                    _items(data, v["configMap"].get("items"))))
            elif "emptyDir" in v:
                mounts.append(Mount(m["mountPath"], read_only, "emptyDir", v))
            elif "persistentVolumeClaim" in v:
                mounts.append(Mount(m["mountPath"], read_only, "claim", v))
            else:
                mounts.append(Mount(m["mountPath"], read_only, "other", v))
        ports = {p.get("name", str(p["containerPort"])): p["containerPort"]
                 for p in c.get("ports", [])}
        readiness = None
        probe = c.get("readinessProbe")
        if probe and "httpGet" in probe:
            port = probe["httpGet"]["port"]
            if isinstance(port, str) and not port.isdigit():
                if port not in ports:
                    raise UnsupportedError(f"{c['name']}: probe port {port} is no container port")
                port = ports[port]
            readiness = {"path": probe["httpGet"].get("path", "/"), "port": int(port)}
            if probe["httpGet"].get("host"):
                readiness["host"] = probe["httpGet"]["host"]
        return Container(c["name"], c.get("image", ""), command + args, bool(command), env,
                         mounts, readiness, ports)

    def _value_from(self, source, fields, c):
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path not in fields:
                raise UnsupportedError(f"{c['name']}: fieldRef {path}")
            return fields[path]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return _secret_data(self.objects, ref["name"])[ref["key"]].decode()
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return _config_map_data(self.objects, ref["name"])[ref["key"]].decode()
        if "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            kind, _, resource = ref["resource"].partition(".")
            value = c.get("resources", {}).get(kind, {}).get(resource)
            if value is None:
                raise UnsupportedError(f"{c['name']}: resourceFieldRef {ref['resource']} unset")
            divisor = quantity(ref.get("divisor", "1"))
            return str(max(1, math.ceil(quantity(value) / divisor)))
        raise UnsupportedError(f"{c['name']}: valueFrom {source}")


def _secret_data(objects, name):
    s = find(objects, "Secret", name)
    data = {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}
    data.update({k: str(v).encode() for k, v in (s.get("stringData") or {}).items()})
    return data


def _config_map_data(objects, name):
    cm = find(objects, "ConfigMap", name)
    data = {k: str(v).encode() for k, v in (cm.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
    return data


def _items(data, items):
    if not items:
        return dict(data)
    return {i["path"]: data[i["key"]] for i in items}


def workloads(objects):
    return [Workload(o, objects) for o in objects if o.get("kind") in ("Deployment", "StatefulSet")]


def services(objects):
    """{name: (selector, headless)} of the Services."""
    out = {}
    for o in objects:
        if o.get("kind") == "Service":
            spec = o.get("spec", {})
            out[o["metadata"]["name"]] = (spec.get("selector", {}),
                                          spec.get("clusterIP") == "None")
    return out
