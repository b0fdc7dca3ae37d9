#!/usr/bin/env python3
"""The image smoke test (issue 45): Ferry's real images running the exact command lines of the
rendered `cpu` overlay, as far as this machine allows without a Kubernetes API server.

  image_smoke_test.py BUILD_IMAGES PRIVATE_DOCKERD ROUTER WORKER KVSTORE KV PLANNER ENCODER
                      [--rendered FILE]

1. Images: tools/image/build_images.sh on the Bazel outputs, in a dockerd of the test's own
   (tools/image/private_dockerd.py; its image store kept in $FERRY_CACHE/image/dockerd so that a
   warm run imports and checks nothing again; the test depends on nothing left there). The
   ferry-planner image is built and checked too (its libraries resolve, --version runs), not run:
   its actuator needs an API server (tests/deploy:kubernetes_actuator_contract_test). So is the
   ferry-encoder image (deploy/k8s/components/encoder), and its `ferry-encoder --help` runs in it
   as the manifests run it (uid 65532, read-only, no capabilities, no network); it is not started
   as a pod: the cpu overlay's model is text-only (tests/integration:router_epd_test runs the
   encoder pool).
2. Pods: `kubectl kustomize deploy/k8s/overlays/cpu` (or --rendered FILE, already rendered): the
   router, one prefill worker, two decode workers and one store node (the StatefulSet's pod 0),
   each a container with its manifest's command and args after Kubernetes' $(VAR) expansion over
   its env (POD_IP: its own loopback address 127.X.Y.N, POD_NAME: its pod name), with host
   networking (--network host --read-only --user 65532 --cap-drop ALL --security-opt
   no-new-privileges, tmpfs /tmp). The one rewrite: a listen address 0.0.0.0 becomes the pod's
   address, because on the host network the pods share one network namespace (each pod has its
   own in Kubernetes). The model directory ($FERRY_MODEL_GGUF's) is mounted read-only where the
   --model flag points; Secrets and ConfigMaps as read-only directories of their keys (never
   subPath); emptyDirs and claims as tmpfs. Init containers do not run (the model is mounted).
3. DNS: Debian's dnsmasq on the test's own address (port 53: resolv.conf has no port) answers
   from a hosts file the test writes from the manifests' Services: each headless Service's name
   (short and FQDN) has its pods' addresses; a StatefulSet pod's line begins with its stable name
   (<pod>.<service>.<namespace>.svc.cluster.local) so that the PTR answer is that name. Every
   container gets a resolv.conf naming it, with Kubernetes' search list.
4. Checks: every container becomes ready (its readinessProbe), the router sees its three
   workers, each reporting its pod IP as its endpoint; a chat completion streams; a long greedy
   stream, once tokens flow, survives SIGTERM to the decode container streaming it (what a pod
   deletion sends): no error event, finish_reason "length" after exactly max_tokens tokens, every
   token equal to the same request's undisturbed run on the other decode worker (started once the
   router sees the drain, so it runs beside it), the container exits 0 after its drain, the router
   counts exactly one completed hand-off and no failed request, the other decode worker received
   it. Each container's /metrics is scraped (kept in the test's outputs);
   deploy/k8s/check_queries.py checks the dashboard's and the rules' queries against the scrapes.
   What this cannot check: a bound host that differs from the advertised one (the listen rewrite
   of step 2 makes them equal); tests/integration:worker_lifecycle_test runs a worker bound to
   0.0.0.0 that advertises --advertise_address and is reached there.

Root, docker.io, mmdebstrap, dnsmasq and kubectl are needed: without them the test skips, but
fails under CI=true. Everything started (containers, the daemon and its mounts, dnsmasq) is
stopped and removed on the way out, also on failure and on SIGTERM (Bazel's timeout); dnsmasq
and the daemon die with the test's process (PR_SET_PDEATHSIG) if it is killed outright.
"""
import argparse
import ctypes
import http.client
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import rendered_pods as rp

# tests/integration/ferry_services.py (a data dependency): in the runfiles tree and the source tree.
for _d in (os.path.abspath(__file__), os.path.realpath(__file__)):
    sys.path.insert(0, os.path.join(os.path.dirname(_d), "..", "integration"))
import ferry_services  # noqa: E402

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))  # the source tree (the test runs unsandboxed)
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(prefix="ferry-smoke-")
OUT = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or os.path.join(TMP, "outputs")
CACHE = os.path.join(os.environ.get("FERRY_CACHE") or (
    "/var/cache/ferry" if os.access("/var/cache", os.W_OK) else TMP), "image")
STARTED = time.monotonic()
# The topology: how many pods of each workload run (whatever replicas the overlay asks).
REPLICAS = {"router": 1, "prefill": 1, "decode": 2, "kvstore": 1}
IMAGES = {"router": "ferry-router", "worker": "ferry-worker", "kvstore": "ferry-kvstore"}
READY_TIMEOUT = 180  # model load on a busy 2-core machine included


def log(msg):
    print(f"[{time.monotonic() - STARTED:6.1f} s] {msg}", file=sys.stderr, flush=True)


def wait_for(what, ready, timeout):
    """Waits until `ready()` (a state a service reports) returns a true value, and returns it
    (tests/integration/ferry_services.py's wait)."""
    return ferry_services.wait_for(ready, what, timeout)


def skip_or_fail(reason):
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise SystemExit(f"FAIL (CI): {reason}")
    print(f"SKIP: {reason}", file=sys.stderr)
    raise SystemExit(0)


# ------------------------------------------------------------------------------------------------
# DNS: dnsmasq and a small client to check what it answers


def dns_query(server, name, qtype):
    """The answers (A: addresses, PTR: names) of one UDP query; [] when none."""
    codes = {"A": 1, "PTR": 12}
    qid = random.randrange(1 << 16)
    packet = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    packet += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    packet += struct.pack("!HH", codes[qtype], 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1.0)
        s.sendto(packet, (server, 53))
        data = s.recv(4096)
    _, flags, qd, an, _, _ = struct.unpack("!HHHHHH", data[:12])
    pos = 12

    def read_name(pos):
        labels, jumped, end = [], False, pos
        while True:
            n = data[pos]
            if n & 0xC0 == 0xC0:
                if not jumped:
                    end = pos + 2
                pos, jumped = ((n & 0x3F) << 8) | data[pos + 1], True
                continue
            pos += 1
            if n == 0:
                return ".".join(labels), (end if jumped else pos)
            labels.append(data[pos:pos + n].decode())
            pos += n

    for _ in range(qd):
        _, pos = read_name(pos)
        pos += 4
    answers = []
    for _ in range(an):
        _, pos = read_name(pos)
        rtype, _, _, length = struct.unpack("!HHIH", data[pos:pos + 10])
        pos += 10
        if rtype == 1:
            answers.append(socket.inet_ntoa(data[pos:pos + 4]))
        elif rtype == 12:
            answers.append(read_name(pos)[0])
        pos += length
    return answers


def die_with_parent():
    """In a child before exec: SIGKILL when the test's process dies (a test killed past its
    timeout must not leave dnsmasq holding port 53 on its address)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Dnsmasq:
    def __init__(self, ip, hosts_lines, workdir):
        self.ip, self.dir = ip, workdir
        os.makedirs(workdir, exist_ok=True)
        os.chmod(workdir, 0o755)
        self.hosts = os.path.join(workdir, "hosts")
        with open(self.hosts, "w") as f:
            f.write("".join(line + "\n" for line in hosts_lines))
        os.chmod(self.hosts, 0o644)
        self.log = os.path.join(workdir, "dnsmasq.log")
        self.proc = subprocess.Popen(
            ["/usr/sbin/dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv",
             "--no-hosts", f"--addn-hosts={self.hosts}", f"--listen-address={ip}",
             "--bind-interfaces", "--port=53", f"--pid-file={workdir}/dnsmasq.pid",
             f"--log-facility={self.log}", "--log-queries", "--user=root", "--group=root",
             "--local-ttl=1", "--neg-ttl=1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=die_with_parent)

    def wait(self, name):
        def answers():
            if self.proc.poll() is not None:
                raise AssertionError(f"dnsmasq exited {self.proc.returncode}: "
                                     f"{self.proc.stderr.read().decode()}")
            try:
                return dns_query(self.ip, name, "A")
            except OSError:
                return None
        return wait_for(f"dnsmasq answering for {name}", answers, 10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ------------------------------------------------------------------------------------------------
# HTTP


def http_get(host, port, path, timeout=5):
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (OSError, http.client.HTTPException):
        return None, ""


def metric_sum(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        base, _, rest = sample.partition("{")
        if base == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += float(value)
    return total


class StreamResult:
    def __init__(self):
        self.tokens = 0
        self.text = ""
        self.finish_reason = None
        self.error = None
        self.done = False
        self.first_token = None
        self.last_token = None
        self.usage = None


def stream_chat(host, port, headers, body, result, on_token=None, timeout=120):
    """Runs a streaming chat completion to its end into `result` (an SSE client that sees error
    events, which a client library would raise on)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json", **headers})
        r = conn.getresponse()
        if r.status != 200:
            result.error = f"HTTP {r.status}: {r.read()[:2000]!r}"
            return result
        for event in ferry_services.sse_events(r):
            if event == "[DONE]":
                result.done = True
                break
            if "error" in event:
                result.error = event["error"]
                continue
            if event.get("usage"):
                result.usage = event["usage"]
            for choice in event.get("choices") or []:
                content = (choice.get("delta") or {}).get("content") or ""
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
                if content:
                    now = time.monotonic()
                    result.first_token = result.first_token or now
                    result.last_token = now
                    result.tokens += 1
                    result.text += content
                    if on_token:
                        on_token(result)
    except (OSError, http.client.HTTPException) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return result


# ------------------------------------------------------------------------------------------------
# The stack


def free_on(ip, ports, udp=()):
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ip, port))
            except OSError:
                return False
    for port in udp:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind((ip, port))
            except OSError:
                return False
    return True


def pick_network(count, ports, base=None):
    """A /24 of loopback addresses of this run's own: 127.A.B.1 for DNS, .2 and up for pods, every
    port the pods listen on free on each (another run of this test may hold another). `base`
    ("127.A.B") asks for that one."""
    rng = random.SystemRandom()
    for _ in range(1 if base else 50):
        base = base or f"127.{rng.randrange(100, 200)}.{rng.randrange(0, 256)}"
        if free_on(f"{base}.1", [], udp=[53]) and all(
                free_on(f"{base}.{i}", ports) for i in range(2, count + 2)):
            return base
        base = None
    raise AssertionError("no free loopback /24 under 127.100.0.0/9 (or the one asked for)")


def listen_rewrite(arg, ip):
    """--flag=0.0.0.0[:port] -> --flag=IP[:port]: the pod's own address on the shared host
    network (see the module comment)."""
    if arg.startswith("--") and "=" in arg:
        flag, value = arg.split("=", 1)
        if value == "0.0.0.0" or value.startswith("0.0.0.0:"):
            return f"{flag}={ip}{value[len('0.0.0.0'):]}"
    return arg


class Stack:
    def __init__(self, dockerd, tags, objects, model_dir, workdir, network_base=None):
        self.d, self.tags, self.objects = dockerd, tags, objects
        self.model_dir, self.dir = model_dir, workdir
        self.pods = []        # (workload, pod)
        self.containers = {}  # pod name -> docker container name
        self.run_id = f"smoke{os.getpid()}"
        self.network_base = network_base

    def plan(self):
        by_component = {}
        for w in rp.workloads(self.objects):
            by_component.setdefault(w.component(), []).append(w)
        for component, count in REPLICAS.items():
            found = by_component.get(component, [])
            if len(found) != 1:
                raise AssertionError(f"expected one workload labelled app.kubernetes.io/component="
                                     f"{component}, found {[w.name for w in found]}")
        ports = set()
        for w in rp.workloads(self.objects):
            for c in w.spec["containers"]:
                ports.update(p["containerPort"] for p in c.get("ports", []))
        total = sum(REPLICAS.values())
        self.base = pick_network(total, sorted(ports), self.network_base)
        n = 2
        for component, count in REPLICAS.items():
            w = by_component[component][0]
            for i in range(count):
                self.pods.append((w, w.pod(i, f"{self.base}.{n}")))
                n += 1
        self.dns_ip = f"{self.base}.1"

    def hosts_lines(self):
        """The hosts file dnsmasq serves: each Service name with its pods' addresses; a
        StatefulSet pod's stable name first on its line (its PTR answer)."""
        lines = []
        for name, (selector, _) in rp.services(self.objects).items():
            for w, pod in self.pods:
                if not selector or any(pod.labels.get(k) != v for k, v in selector.items()):
                    continue
                names = []
                if pod.subdomain == name:
                    names.append(f"{pod.hostname}.{name}.{w.namespace}.svc.cluster.local")
                names += [f"{name}.{w.namespace}.svc.cluster.local", name]
                lines.append(f"{pod.ip} {' '.join(names)}")
        return lines

    def resolv_conf(self, namespace):
        path = os.path.join(self.dir, f"resolv.conf.{namespace}")
        with open(path, "w") as f:
            f.write(f"nameserver {self.dns_ip}\n"
                    f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local\n"
                    "options ndots:5\n")
        os.chmod(path, 0o644)
        return path

    def docker_args(self, w, pod, c):
        """`docker run`'s arguments for container `c` of `pod`."""
        image = IMAGES.get(c.name)
        if image is None:
            raise AssertionError(f"container {c.name} of {w.name}: no image family for it")
        args = ["run", "-d", "--name", f"{self.run_id}-{pod.name}", "--network", "host",
                "--read-only", "--user", "65532:65532", "--cap-drop", "ALL",
                "--security-opt", "no-new-privileges", "--tmpfs", "/tmp:rw,nosuid,nodev,mode=1777",
                "--mount", f"type=bind,src={self.resolv_conf(w.namespace)},dst=/etc/resolv.conf,"
                "readonly"]
        for k, v in c.env.items():
            args += ["-e", f"{k}={v}"]
        model = model_path(c)
        model_mounted = model is None
        for i, m in enumerate(c.mounts):
            if m.kind in ("secret", "configMap"):
                src = os.path.join(self.dir, "volumes", pod.name, f"{i}")
                os.makedirs(src)
                for rel, data in m.files.items():
                    os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
                    with open(os.path.join(src, rel), "wb") as f:
                        f.write(data)
                    os.chmod(os.path.join(src, rel), 0o644)
                os.chmod(src, 0o755)
                args += ["--mount", f"type=bind,src={src},dst={m.path},readonly"]
            elif model is not None and (model + "/").startswith(m.path.rstrip("/") + "/"):
                args += ["--mount", f"type=bind,src={self.model_dir},dst={m.path},readonly"]
                model_mounted = True
            elif m.kind in ("emptyDir", "claim"):
                args += ["--tmpfs", f"{m.path}:rw,nosuid,nodev,mode=1777"]
            else:
                raise AssertionError(f"{pod.name}/{c.name}: volume {m.volume} at {m.path}: "
                                     "not a kind this test can back")
        if not model_mounted:
            raise AssertionError(f"{pod.name}/{c.name}: --model={model} is under no volume mount")
        argv = [listen_rewrite(a, pod.ip) for a in c.argv]
        tag = self.tags[image]
        if c.has_command:
            return args + ["--entrypoint", argv[0], tag] + argv[1:]
        return args + [tag] + argv

    def start(self):
        for w, pod in self.pods:
            if len(pod.containers) != 1:
                raise AssertionError(f"{pod.name}: one container expected")
            c = pod.containers[0]
            args = self.docker_args(w, pod, c)
            with open(os.path.join(OUT, f"{pod.name}.docker-run.txt"), "w") as f:
                f.write(" ".join(args) + "\n")
            self.d.docker(*args)
            self.containers[pod.name] = f"{self.run_id}-{pod.name}"
            log(f"started {pod.name} on {pod.ip}: {' '.join(c.argv)}")

    def state(self, pod_name):
        out = self.d.docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}",
                            self.containers[pod_name])
        status, code = out.split()
        return status, int(code)

    def logs(self, pod_name):
        """What the container wrote (stdout and stderr)."""
        p = subprocess.run([docker_client(), "logs", self.containers[pod_name]], env=self.d.env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=60)
        return p.stdout

    def save_logs(self):
        for pod_name in self.containers:
            with open(os.path.join(OUT, f"{pod_name}.log"), "w") as f:
                f.write(self.logs(pod_name))

    def find(self, component):
        return [(w, pod) for w, pod in self.pods if w.component() == component]

    def wait_ready(self):
        for w, pod in self.pods:
            c = pod.containers[0]
            if c.readiness is None:
                raise AssertionError(f"{pod.name}: no httpGet readinessProbe")

            def ready(pod=pod, c=c):
                status, code = self.state(pod.name)
                if status != "running":
                    raise AssertionError(f"{pod.name} {status} (exit {code}):\n"
                                         f"{self.logs(pod.name)[-4000:]}")
                host = c.readiness.get("host", pod.ip)
                return http_get(host, c.readiness["port"], c.readiness["path"])[0] == 200
            wait_for(f"{pod.name} ready ({c.readiness})", ready, READY_TIMEOUT)
            log(f"{pod.name} ready")


def docker_client():
    return os.environ.get("FERRY_DOCKER", "/usr/bin/docker")


# ------------------------------------------------------------------------------------------------
# The test


def build_images(d, build_script, binaries):
    p = subprocess.run([build_script, "--router", binaries[0], "--worker", binaries[1],
                        "--kvstore", binaries[2], "--kv", binaries[3], "--planner", binaries[4],
                        "--encoder", binaries[5], "--cache", CACHE, "--prune"], env=d.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=600)
    sys.stderr.write(p.stderr)
    if p.returncode != 0:
        raise AssertionError(f"build_images.sh failed ({p.returncode})")
    tags = {}
    for line in p.stdout.splitlines():
        ref, size, _ = line.split()
        tags[ref.split(":")[0]] = ref
        log(f"image {ref}: {size} MB")
    with open(os.path.join(OUT, "images.txt"), "w") as f:
        f.write(p.stdout)
    return tags


def check_encoder_image(d, tags):
    """`ferry-encoder --help` runs in its image as the manifests run it and lists its flags."""
    ref = tags.get("ferry-encoder")
    if ref is None:
        raise AssertionError(f"build_images.sh built no ferry-encoder image: {sorted(tags)}")
    p = subprocess.run([docker_client(), "run", "--rm", "--network", "none", "--read-only",
                        "--user", "65532:65532", "--cap-drop", "ALL", "--security-opt",
                        "no-new-privileges", ref, "--help"], env=d.env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    if p.returncode != 0 or "ferry-encoder" not in p.stdout or "--cache_bytes" not in p.stdout:
        raise AssertionError(f"{ref} --help: exit {p.returncode}: {p.stdout[-2000:]}")
    log(f"{ref} --help runs")


def scrape_all(stack, label, skip=()):
    """Each container's /metrics (on its admin port, where its readiness probe looks), saved in
    the outputs; the pods in `skip` (a drained worker: gone) are not asked."""
    paths = []
    os.makedirs(os.path.join(OUT, "scrapes"), exist_ok=True)
    for w, pod in stack.pods:
        if pod in skip:
            continue
        c = pod.containers[0]
        host = c.readiness.get("host", pod.ip)
        status, body = http_get(host, c.readiness["port"], "/metrics")
        if status != 200:
            raise AssertionError(f"{pod.name}: GET /metrics on {host}:{c.readiness['port']}: "
                                 f"{status}")
        path = os.path.join(OUT, "scrapes", f"{label}-{pod.name}.prom")
        with open(path, "w") as f:
            f.write(body)
        paths.append(path)
    return paths


def read(path):
    with open(path) as f:
        return f.read()


def model_path(c):
    """Where container `c` reads its model: its --model flag, else the "model" key of its --config
    file (as the binaries read them: the flag wins), from the ConfigMap mounted there."""
    model = c.flag("model")
    config = c.flag("config")
    if model is not None or config is None:
        return model
    for m in c.mounts:
        rel = os.path.relpath(config, m.path)
        if m.kind == "configMap" and not rel.startswith("..") and rel in m.files:
            return json.loads(m.files[rel]).get("model")
    return None


def check_queries(scrapes):
    """The dashboard's and the alerts' queries name only metrics the running stack declares."""
    monitoring = os.path.join(REPO, "deploy", "k8s", "components", "monitoring")
    p = subprocess.run([sys.executable, os.path.join(REPO, "deploy", "k8s", "check_queries.py"),
                        "--dashboard", os.path.join(monitoring, "dashboard.json"),
                        "--rules", os.path.join(monitoring, "prometheusrule.yaml")] + scrapes,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise AssertionError(f"check_queries.py: exit {p.returncode}:\n{p.stdout}")
    log("check_queries.py: the dashboard's and the rules' metrics are in the scrapes")


def api_headers(stack):
    """The Authorization header with the first key of the router's --api_keys_file (from the
    Secret mounted where the flag points), or none."""
    _, pod = stack.find("router")[0]
    c = pod.containers[0]
    path = c.flag("api_keys_file")
    if not path:
        return {}
    for m in c.mounts:
        prefix = m.path.rstrip("/") + "/"
        if path.startswith(prefix) and path[len(prefix):] in m.files:
            keys = json.loads(m.files[path[len(prefix):]])["keys"]
            return {"Authorization": f"Bearer {keys[0]['key']}"}
    raise AssertionError(f"--api_keys_file={path} is in no mounted Secret")


def go_duration_seconds(text):
    total, number = 0.0, ""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = text[i:i + 2] if text[i:i + 2] in units else ch
        total += float(number) * units[unit]
        number = ""
        i += len(unit)
    return total


def run(args):
    binaries = [args.router, args.worker, args.kvstore, args.kv, args.planner, args.encoder]
    sys.path.insert(0, os.path.dirname(os.path.realpath(args.private_dockerd)))
    import private_dockerd

    if args.rendered:
        with open(args.rendered) as f:
            objects = rp.load(f.read())
    else:
        overlay = os.path.join(REPO, "deploy", "k8s", "overlays", "cpu")
        if not os.path.isdir(overlay):
            raise AssertionError(f"{overlay} missing: the test runs its rendered command lines")
        kubectl = os.environ.get("FERRY_KUBECTL") or shutil.which("kubectl")
        if not kubectl:
            skip_or_fail("no kubectl (./ferry setup installs one)")
        objects = rp.render(kubectl, overlay)
    with open(os.path.join(OUT, "rendered.json"), "w") as f:
        json.dump(objects, f, indent=1)
    model_gguf = os.environ["FERRY_MODEL_GGUF"]

    workdir = tempfile.mkdtemp(prefix="smoke-", dir=TMP)
    os.chmod(workdir, 0o755)
    dns = stack = None
    with private_dockerd.PrivateDockerd(os.path.join(CACHE, "dockerd")) as d:
        try:
            log(f"dockerd: {d.describe()}")
            tags = build_images(d, args.build_images, binaries)
            log("images built and checked")
            check_encoder_image(d, tags)
            stack = Stack(d, tags, objects, os.path.dirname(os.path.realpath(model_gguf)),
                          workdir, args.network_base)
            stack.plan()
            dns = Dnsmasq(stack.dns_ip, stack.hosts_lines(), os.path.join(workdir, "dns"))
            for line in stack.hosts_lines():
                log(f"dns: {line}")
            dns.wait(stack.hosts_lines()[0].split()[1])
            for w, pod in stack.pods:
                if pod.subdomain:
                    stable = f"{pod.hostname}.{pod.subdomain}.{w.namespace}.svc.cluster.local"
                    got = dns_query(stack.dns_ip, ".".join(reversed(pod.ip.split("."))) +
                                    ".in-addr.arpa", "PTR")
                    if got != [stable]:
                        raise AssertionError(f"PTR of {pod.ip}: {got}, expected [{stable}]")
            stack.start()
            stack.wait_ready()
            check_serving(stack)
        finally:
            if stack is not None:
                stack.save_logs()
            if dns is not None:
                dns.stop()
                shutil.copy(dns.log, os.path.join(OUT, "dnsmasq.log"))


def check_serving(stack):
    _, router_pod = stack.find("router")[0]
    router = router_pod.containers[0]
    host, port = router_pod.ip, int(router.flag("port", "8000"))
    admin = int(router.flag("admin_port"))
    workers = stack.find("prefill") + stack.find("decode")
    addresses = {}
    for w, pod in workers:
        c = pod.containers[0]
        grpc_port = c.flag("address").rsplit(":", 1)[1]
        addresses[f"{pod.ip}:{grpc_port}"] = pod

    def router_workers():
        status, body = http_get(host, admin, "/workers")
        return json.loads(body) if status == 200 else []

    wait_for("the router seeing its three workers up (by their advertised addresses)",
             lambda: {w["address"] for w in router_workers() if w["state"] == "up"} >=
             set(addresses), 60)
    # Each worker reports itself (its id, the endpoint it advertises on Watch) as its pod IP with
    # its port, as --advertise_address=$(POD_IP) makes it.
    ids = {w["address"]: w["id"] for w in router_workers()}
    for address in addresses:
        if ids.get(address) != address:
            raise AssertionError(f"worker {address} advertises itself as {ids.get(address)}")
    log("the router sees every worker up, each advertising its pod IP")
    headers = api_headers(stack)
    req = urllib.request.Request(f"http://{host}:{port}/v1/models", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]

    def body(content, max_tokens):
        return {"model": model, "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}

    first = stream_chat(host, port, headers, body("Say hello to the ferry.", 48), StreamResult())
    if first.error or not first.done or first.tokens == 0 or not first.finish_reason:
        raise AssertionError(f"the first chat completion: error={first.error} done={first.done} "
                             f"tokens={first.tokens} finish={first.finish_reason}")
    rate = (first.tokens - 1) / max(first.last_token - first.first_token, 1e-3)
    log(f"a chat completion streamed {first.tokens} chunks ({rate:.0f}/s): {first.text[:60]!r}")
    scrapes = scrape_all(stack, "serving")

    # The long stream must outlive the drain grace after the SIGTERM (then comes the hand-off):
    # decoding slows down as the context grows, so the short stream's rate errs on the long side.
    decodes = stack.find("decode")
    grace = go_duration_seconds(decodes[0][1].containers[0].flag("drain_grace", "30s"))
    max_tokens = min(int(rate * (1.2 * grace + 5)) + 64, 8000)
    before = http_get(host, admin, "/metrics")[1]
    flowing = threading.Event()
    long = StreamResult()

    def on_token(r):
        if r.tokens >= 8:
            flowing.set()
    long_body = body("Tell a long story about a ferry crossing a strait.", max_tokens)
    t = threading.Thread(target=stream_chat, args=(host, port, headers, long_body, long, on_token,
                                                   60 + 3 * grace))
    t.start()
    # The reference: the same request, undisturbed, on the decode worker that stays. It starts
    # once the router has seen the SIGTERMed worker draining (no new work goes there), so it runs
    # beside the long stream's drain instead of after it; its tokens must equal the handed-off
    # stream's, every one (greedy decoding is deterministic across workers, batches and hand-offs).
    reference = StreamResult()
    r = threading.Thread(target=stream_chat, args=(host, port, headers, long_body, reference,
                                                   None, 60 + 3 * grace))
    try:
        if not flowing.wait(60):
            raise AssertionError(f"the long stream's tokens did not flow: error={long.error}")

        def streaming():
            busy = [addresses[w["address"]] for w in router_workers()
                    if w.get("inflight", 0) > 0 and w["address"] in addresses and
                    addresses[w["address"]] in [p for _, p in decodes]]
            return busy[0] if len(busy) == 1 else None
        source = wait_for("the decode worker streaming the request", streaming, 10)
        tokens_at_term = long.tokens
        stack.d.docker("kill", "--signal", "TERM", stack.containers[source.name])
        log(f"SIGTERM to {source.name} after {tokens_at_term} chunks (max_tokens {max_tokens}, "
            f"drain grace {grace:.0f} s)")
        source_address = [a for a, p in addresses.items() if p is source][0]

        def draining():
            return any(w["address"] == source_address and
                       w.get("drain_state", "DRAIN_STATE_NONE") != "DRAIN_STATE_NONE"
                       for w in router_workers())
        wait_for(f"the router seeing {source.name} draining", draining, 10)
        r.start()
    finally:
        t.join()
        if r.ident is not None:
            r.join()
    if long.error or not long.done or not long.finish_reason:
        raise AssertionError(f"the stream across the drain: error={long.error} done={long.done} "
                             f"finish={long.finish_reason} chunks={long.tokens}")
    if reference.error or not reference.done:
        raise AssertionError(f"the reference stream: error={reference.error} "
                             f"done={reference.done} chunks={reference.tokens}")
    for name, got in (("the stream across the drain", long), ("the reference", reference)):
        completion = (got.usage or {}).get("completion_tokens")
        if got.finish_reason != "length" or completion != max_tokens:
            raise AssertionError(f"{name}: finish_reason {got.finish_reason}, "
                                 f"{completion} completion tokens (usage {got.usage}); expected "
                                 f"length after {max_tokens}")
    if long.text != reference.text:
        at = next((i for i, (a, b) in enumerate(zip(long.text, reference.text)) if a != b),
                  min(len(long.text), len(reference.text)))
        raise AssertionError(f"the handed-off stream differs from the reference at character "
                             f"{at} of {len(long.text)}: {long.text[max(0, at - 40):at + 40]!r} "
                             f"vs {reference.text[max(0, at - 40):at + 40]!r}")
    log(f"the handed-off stream equals the undisturbed reference ({max_tokens} tokens, "
        f"{len(long.text)} characters)")

    def exited():
        status, code = stack.state(source.name)
        return (code,) if status == "exited" else None
    (exit_code,) = wait_for(f"{source.name} exiting after its drain", exited, 90)
    if exit_code != 0:
        raise AssertionError(f"{source.name} exited {exit_code}:\n"
                             f"{stack.logs(source.name)[-4000:]}")
    log(f"the stream finished ({long.tokens} chunks, finish_reason {long.finish_reason}); "
        f"{source.name} exited 0")
    after = http_get(host, admin, "/metrics")[1]
    delta = {name: metric_sum(after, name, **labels) - metric_sum(before, name, **labels)
             for name, labels in [("ferry_router_handoffs_total", {"outcome": "completed"}),
                                  ("ferry_router_failed_requests_total", {}),
                                  ("ferry_router_migrations_total", {})]}
    other = [p for _, p in decodes if p is not source][0]
    received = metric_sum(http_get(other.ip, int(other.containers[0].flag("admin_port")),
                                   "/metrics")[1], "ferry_worker_handoffs_received_total")
    log(f"router deltas {delta}; {other.name} received {received:.0f} hand-off(s)")
    if delta["ferry_router_failed_requests_total"] != 0:
        raise AssertionError(f"failed requests: {delta}")
    # Exactly one: the long stream's (the reference never ran on the draining worker).
    if delta["ferry_router_handoffs_total"] != 1 or received != 1:
        raise AssertionError(f"expected one completed hand-off, to {other.name}: {delta}, "
                             f"received {received}")
    scrapes = scrape_all(stack, "final", skip=[source]) + scrapes
    check_queries([p for p in scrapes if "/serving-" in p] +
                  [p for p in scrapes if "final-" in p and "router" in p])


def main():
    parser = argparse.ArgumentParser()
    for name in ("build_images", "private_dockerd", "router", "worker", "kvstore", "kv",
                 "planner", "encoder"):
        parser.add_argument(name)
    parser.add_argument("--rendered", help="already rendered manifests instead of the overlay")
    parser.add_argument("--network_base", help="127.A.B: the loopback /24 to use (default: a "
                        "free one at random)")
    args = parser.parse_args()
    # Bazel ends a test past its timeout with SIGTERM: exit through the `finally` blocks and the
    # atexit hooks, which stop the containers, the daemon, its mounts and dnsmasq.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    os.makedirs(OUT, exist_ok=True)
    if os.geteuid() != 0:
        skip_or_fail("needs root (its own dockerd, dnsmasq on port 53)")
    for tool in ("/usr/sbin/dockerd", docker_client(), "/usr/sbin/dnsmasq", "/usr/bin/mmdebstrap"):
        if not os.access(tool, os.X_OK):
            skip_or_fail(f"{tool} missing (./ferry setup installs docker.io, dnsmasq, mmdebstrap)")
    model = os.environ.get("FERRY_MODEL_GGUF", "")
    if not os.path.isfile(model):
        raise SystemExit(f"FERRY_MODEL_GGUF={model!r} is no file: run through './ferry test'")
    run(args)
    log("PASS")


if __name__ == "__main__":
    main()
