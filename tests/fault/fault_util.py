"""What the fault-injection tests share: stacks of real processes on loopback, a raw SSE client
that sees every chunk (and, with the `return_token_ids` extension, every token id), metrics,
and the router's view of its workers.

The workers run the null engine (engine/model/null_model.h) on a tiny test model's tokenizer:
its tokens are a hash chain over the whole prefix kept in the KV cache, so a continuation that
was re-prefilled elsewhere is the same only when the prompt and every generated token reached
the new worker exactly; and its --null_token_seconds paces decoding, so a fault lands mid-stream
(a real tiny model writes 64 tokens in a few milliseconds). Sampling is the engine's real
sampler (position-keyed draws), so seeded temperature sampling must resume exactly too.

Processes are started with tests/integration/ferry_services.py: each dies with the test
(PR_SET_PDEATHSIG) and stop_all() kills what is left.
"""
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
import threading
import time
import urllib.error
import urllib.request

# tests/integration/ferry_services.py (a data dependency): beside this file's directory in the
# runfiles tree, and in the source tree.
for _d in (os.path.abspath(__file__), os.path.realpath(__file__)):
    sys.path.insert(0, os.path.join(os.path.dirname(_d), "..", "integration"))
import ferry_services  # noqa: E402
from ferry_services import TMP, model_with_template, start, stop_all, wait_for  # noqa: E402,F401

ROUTER, WORKER, MODEL_SRC = sys.argv[1], sys.argv[2], sys.argv[3]
BLOCK_TOKENS = 16
# A stream that sends nothing this long hangs (tokens come every 10-50 ms; a stalled worker's
# request moves within a heartbeat timeout of 1 s).
STREAM_TIMEOUT = 20


def model_dir():
    """The tiny model's tokenizer and config with an 8192-position context (no weights: the null
    engine needs none), its own chat template kept."""
    with open(os.path.join(MODEL_SRC, "tokenizer_config.json")) as f:
        template = json.load(f)["chat_template"]
    return model_with_template(MODEL_SRC, "fault", template)


def keep_logs():
    """Copies the services' logs to Bazel's undeclared outputs (kept in outputs.zip, unlike
    TEST_TMPDIR), for a look after a failure."""
    out = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if not out:
        return
    for name in os.listdir(TMP):
        if name.endswith(".log"):
            try:
                shutil.copy(os.path.join(TMP, name), out)
            except OSError:
                pass


def finish():
    """The end of every test script: its processes killed, their logs kept."""
    stop_all()
    keep_logs()


def in_ci():
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


# ----------------------------------------------------------------------------------------------
# HTTP


def http_get(host, port, path, timeout=10):
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def http_post(port, path, body, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def metrics(host, admin_port):
    """{sample (name with labels, as printed): value} of a service's /metrics page."""
    status, body = http_get(host, admin_port, "/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics on {host}:{admin_port}: HTTP {status}")
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            sample, _, value = line.rpartition(" ")
            out[sample] = float(value)
    return out


def metric_sum(samples, name, **labels):
    """The sum of the samples of metric `name` whose labels include `labels` (0 when none)."""
    total = 0.0
    for sample, value in samples.items():
        base, _, rest = sample.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


# ----------------------------------------------------------------------------------------------
# Processes


class Worker:
    """A ferry-worker that can be killed, stopped, continued and restarted on the same gRPC
    address (the router's static worker list reaches it again). `host` is where it listens
    (gRPC and admin); `wrap` is a command it runs under (nsenter into a namespace, env)."""

    def __init__(self, name, role, flags, host="127.0.0.1", wrap=()):
        self.name, self.role, self.host = name, role, host
        self.flags, self.wrap = list(flags), list(wrap)
        self.port = 0
        self.admin = None
        self.proc = None
        self.starts = 0

    def _pick_port(self):
        """A free port below the kernel's ephemeral range (32768 and up here) for a loopback
        worker: a restart must find its port free again, and a port the kernel handed out for
        port 0 could meanwhile go to another test's service (seen once under CI's load)."""
        for _ in range(200):
            port = random.SystemRandom().randrange(20000, 32000)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind((self.host, port))
                    return port
                except OSError:
                    continue
        return 0

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def start(self):
        if self.port == 0 and self.host == "127.0.0.1" and not self.wrap:
            self.port = self._pick_port()
        args = self.flags + [f"--role={self.role}", f"--address={self.host}:{self.port}",
                             f"--admin_host={self.host}"]
        binary = WORKER
        if self.wrap:
            binary, args = self.wrap[0], self.wrap[1:] + [WORKER] + args
        self.starts += 1
        self.proc, ports = start(binary, args, f"{self.name}_{self.starts}")
        self.port, self.admin = ports["grpc_port"], ports["admin_port"]
        return self

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def log(self):
        """What its current run wrote to its log (stderr) so far."""
        with open(os.path.join(TMP, f"{self.name}_{self.starts}.log"), errors="replace") as f:
            return f.read()

    def kill(self):
        self.signal(signal.SIGKILL)
        self.proc.wait()

    def metrics(self):
        return metrics(self.host, self.admin)

    def steps(self, samples=None):
        """Engine steps taken (the step-time histogram's count over its kinds)."""
        return metric_sum(samples or self.metrics(), "ferry_worker_step_seconds_count")

    def busy(self, samples=None):
        s = samples or self.metrics()
        return (metric_sum(s, "ferry_worker_running_requests") +
                metric_sum(s, "ferry_worker_queued_requests"))


def worker_flags(model, token_seconds, extra=()):
    return [f"--model={model}", "--engine=null", f"--null_token_seconds={token_seconds}",
            f"--block_tokens={BLOCK_TOKENS}", "--kv_pool_bytes=8MiB", "--threads=1",
            "--watch_interval=20ms"] + list(extra)


class Router:
    def __init__(self, model, workers, flags=(), name="router"):
        _, ports = start(ROUTER, [f"--model={model}", "--served_model_name=tiny",
                                  "--workers=" + ",".join(w.address for w in workers)] +
                         list(flags), name)
        self.port, self.admin = ports["http_port"], ports["admin_port"]

    def workers(self):
        status, body = http_get("127.0.0.1", self.admin, "/workers")
        if status != 200:
            raise RuntimeError(f"GET /workers: HTTP {status}: {body}")
        return {w["address"]: w for w in json.loads(body)}

    def wait_up(self, workers, timeout=30):
        """Waits until the router sees every one of `workers` up."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.workers()
            down = [w.address for w in workers if view.get(w.address, {}).get("state") != "up"]
            if not down:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not up after {timeout} s at the router: {down}: " +
                                     json.dumps([view.get(a) for a in down]))
            time.sleep(0.02)

    def streaming_worker(self, candidates, timeout=5):
        """The one worker of `candidates` the router has a request in flight on (one request
        runs at a time in these tests; while it moves, none has it for a moment)."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.workers()
            busy = [w for w in candidates if view.get(w.address, {}).get("inflight", 0) > 0]
            if len(busy) == 1:
                return busy[0]
            if len(busy) > 1 or time.monotonic() > deadline:
                raise AssertionError("cannot tell which worker streams the request: " + json.dumps(
                    {w.address: view.get(w.address, {}).get("inflight") for w in candidates}))
            time.sleep(0.005)

    def metrics(self):
        return metrics("127.0.0.1", self.admin)


class Stacks:
    """Builders of the two stacks the tests run on."""

    @staticmethod
    def pd(model, decodes=2, token_seconds=0.01, worker_extra=(), router_flags=()):
        flags = worker_flags(model, token_seconds, ["--transport=ucx", "--ucx_tls=tcp"] +
                             list(worker_extra))
        prefill = Worker("prefill", "prefill", flags).start()
        decode = [Worker(f"decode{i}", "decode", flags).start() for i in range(decodes)]
        router = Router(model, [prefill] + decode, router_flags, "router_pd")
        router.wait_up([prefill] + decode)
        return router, prefill, decode

    @staticmethod
    def aggregated(model, workers=2, token_seconds=0.01, worker_extra=(), router_flags=()):
        flags = worker_flags(model, token_seconds, worker_extra)
        ws = [Worker(f"worker{i}", "aggregated", flags).start() for i in range(workers)]
        router = Router(model, ws, router_flags, "router_aggregated")
        router.wait_up(ws)
        return router, ws


# ----------------------------------------------------------------------------------------------
# Streaming client


class Result:
    def __init__(self):
        self.text = ""
        self.ids = []          # with return_token_ids
        self.chunks = 0        # chunks that carried content
        self.finish_reason = None
        self.usage = None
        self.error = None      # an error event's "error" object
        self.done = False      # [DONE] arrived
        self.hung = None       # the seconds no data came for, when the client gave up

    def tokens(self):
        return len(self.ids) if self.ids else self.chunks

    def describe(self):
        hung = f"HUNG (no data for {self.hung} s) " if self.hung else ""
        return (f"{hung}done={self.done} error={self.error} finish={self.finish_reason} "
                f"tokens={self.tokens()} usage={self.usage}")


_TOKEN_IDS = None


def token_ids_supported(port):
    """Whether the router takes the `return_token_ids` extension (issue 27); once it does, the
    tests compare token ids, before that the streamed text and token counts."""
    global _TOKEN_IDS
    if _TOKEN_IDS is None:
        status, body = http_post(port, "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "probe"}],
            "max_tokens": 2, "temperature": 0, "ignore_eos": True, "return_token_ids": True})
        answer = json.loads(body)
        if status == 200:
            ids = answer["choices"][0].get("token_ids")
            if not isinstance(ids, list) or len(ids) != answer["usage"]["completion_tokens"]:
                raise AssertionError(f"return_token_ids accepted but no token_ids: {body}")
            _TOKEN_IDS = True
        elif status == 400 and answer.get("error", {}).get("param") == "return_token_ids":
            _TOKEN_IDS = False
            print("note: the router does not take return_token_ids yet: comparing streamed "
                  "text and token counts instead of token ids", file=sys.stderr)
        else:
            raise AssertionError(f"probe of return_token_ids: HTTP {status}: {body}")
    return _TOKEN_IDS


def chat_body(port, content, max_tokens, temperature=0.0, seed=None):
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": temperature, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    if seed is not None:
        body["seed"] = seed
    if token_ids_supported(port):
        body["return_token_ids"] = True
    return body


class Stream:
    """One streaming request over a connection of its own: iterate over its SSE data events."""

    def __init__(self, port, body, path="/v1/chat/completions", timeout=STREAM_TIMEOUT):
        self.timeout = timeout
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        if self.response.status != 200:
            raise AssertionError(f"HTTP {self.response.status}: {self.response.read()[:2000]}")

    def events(self):
        """Each data event's JSON; the string "[DONE]" for the end."""
        return ferry_services.sse_events(self.response)

    def close(self, reset=False):
        """Closes the connection (with reset: an RST instead of a FIN)."""
        sock = self.conn.sock
        if sock is not None and reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conn.close()


def collect(port, body, on_token=None, stream=None):
    """Runs a streaming chat request to its end; `on_token(result)` after each content chunk. A
    stream that sends nothing for STREAM_TIMEOUT seconds ends the collection (Result.hung)."""
    r = Result()
    s = stream or Stream(port, body)
    try:
        for event in s.events():
            if event == "[DONE]":
                r.done = True
                break
            if "error" in event:
                r.error = event["error"]
                continue
            if event.get("usage"):
                r.usage = event["usage"]
            for choice in event.get("choices") or []:
                content = choice.get("delta", {}).get("content") or choice.get("text") or ""
                ids = choice.get("token_ids") or []
                r.ids.extend(ids)
                if choice.get("finish_reason"):
                    r.finish_reason = choice["finish_reason"]
                if content or ids:
                    r.text += content
                    r.chunks += 1
                    if on_token is not None:
                        on_token(r)
    except (TimeoutError, socket.timeout):
        r.hung = s.timeout
    finally:
        s.close()
    return r


def run_all(port, bodies, parallel=4):
    """Fault-free runs of `bodies`, `parallel` at a time; their Results in order."""
    results = [None] * len(bodies)
    lock = threading.Lock()
    todo = list(range(len(bodies)))

    def work():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            results[i] = collect(port, bodies[i])

    threads = [threading.Thread(target=work) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def assert_same_stream(test, got, want, what):
    """A faulted stream equals its fault-free reference: complete, no error, the same tokens
    (ids when the API returns them, else text and count), usage counted once."""
    test.assertFalse(got.hung, f"{what}: the stream hangs: {got.describe()}")
    test.assertIsNone(got.error, f"{what}: the stream ended with an error: {got.describe()}")
    test.assertTrue(got.done, f"{what}: the stream did not end with [DONE]: {got.describe()}")
    test.assertTrue(want.done and want.error is None, f"{what}: reference {want.describe()}")
    if want.ids:
        test.assertEqual(got.ids, want.ids, f"{what}: token ids differ")
    test.assertEqual(got.text, want.text, f"{what}: text differs")
    test.assertEqual(got.finish_reason, want.finish_reason, what)
    test.assertIsNotNone(got.usage, f"{what}: no usage chunk")
    test.assertEqual(got.usage["completion_tokens"], want.usage["completion_tokens"], what)
    test.assertEqual(got.usage["prompt_tokens"], want.usage["prompt_tokens"], what)
    if got.ids:
        test.assertEqual(got.usage["completion_tokens"], len(got.ids),
                         f"{what}: usage is not the tokens the client got")


def rng(seed=27):
    return random.Random(seed)


def samples_of(samples, *prefixes):
    """The samples whose names start with one of `prefixes` (for failure messages)."""
    return {k: v for k, v in samples.items() if k.startswith(prefixes)}


def router_fault_counters(router):
    s = router.metrics()
    return {
        "migrations": metric_sum(s, "ferry_router_migrations_total"),
        "worker_down": metric_sum(s, "ferry_router_migrations_total", cause="worker_down"),
        "worker_error": metric_sum(s, "ferry_router_migrations_total", cause="worker_error"),
        "migrated_tokens": metric_sum(s, "ferry_router_migrated_tokens_total"),
        "failed": metric_sum(s, "ferry_router_failed_requests_total"),
        "migration_limit": metric_sum(s, "ferry_router_failed_requests_total",
                                      cause="migration_limit"),
        "orphan_found": metric_sum(s, "ferry_router_orphan_aborts_total", outcome="found"),
        # Chunks that reached their requests through the workers' token streams.
        "stream_chunks": metric_sum(s, "ferry_router_token_stream_chunks_total", delivered="true"),
        "non_200": sum(v for k, v in s.items() if k.startswith("ferry_router_requests_total{")
                       and 'code="200"' not in k),
        "has_migration_metrics": any(k.startswith("ferry_router_migrations_total")
                                     for k in s),
    }


def run(cmd, check=True):
    """Runs a system command (ip, nft, nsenter); its output, or an AssertionError with it."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stdout}")
    return p.stdout


# ----------------------------------------------------------------------------------------------
# Network namespaces (root only)


def _die_with_parent():
    ferry_services._die_with_parent()


class Netns:
    """A network namespace joined to the test's by a veth pair (`host_ip` on `host_if` here,
    `ip` on `ns_if` inside, a default route back), held by a `sleep` that dies with the test
    (PR_SET_PDEATHSIG): when it and the processes inside are gone, so are the namespace and both
    veth ends. close() removes them at once. partition() drops everything but loopback inside
    (nftables, input and output), heal() removes that again."""

    TABLE = "ferry_fault"

    def __init__(self, tag, subnet):
        self.host_if, self.ns_if = f"fh{tag}", f"fn{tag}"
        self.host_ip, self.ip = f"{subnet}.1", f"{subnet}.2"
        self.holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"],
                                       preexec_fn=_die_with_parent)
        own = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while True:  # unshare has moved to its namespace once this differs
            try:
                if os.readlink(f"/proc/{self.holder.pid}/ns/net") != own:
                    break
            except OSError:
                pass
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"unshare --net failed (exit {self.holder.poll()})")
            time.sleep(0.01)
        try:
            run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if])
            run(["ip", "link", "set", self.ns_if, "netns", str(self.holder.pid)])
            run(["ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if])
            run(["ip", "link", "set", self.host_if, "up"])
            self.run(["ip", "link", "set", "lo", "up"])
            self.run(["ip", "addr", "add", f"{self.ip}/24", "dev", self.ns_if])
            self.run(["ip", "link", "set", self.ns_if, "up"])
            self.run(["ip", "route", "add", "default", "via", self.host_ip])
        except Exception:
            self.close()
            raise

    def enter(self):
        """A command prefix that runs its command inside (nsenter execs it: the same pid)."""
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net", "--"]

    def enter_with_sysfs(self):
        """enter(), and a private mount namespace with this namespace's /sys (as `ip netns exec`
        does): UCX lists network devices from /sys/class/net. Still one pid (every step execs)."""
        return self.enter() + ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                               'umount -l /sys 2>/dev/null; mount -t sysfs sysfs /sys && '
                               'exec "$@"', "sh"]

    def run(self, cmd, check=True):
        return run(self.enter() + cmd, check)

    def partition(self):
        t = self.TABLE
        self.run(["nft", "add", "table", "inet", t])
        for chain, hook, match in (("in", "input", "iifname"), ("out", "output", "oifname")):
            self.run(["nft", "add", "chain", "inet", t, chain,
                      f"{{ type filter hook {hook} priority 0 ; policy accept ; }}"])
            self.run(["nft", "add", "rule", "inet", t, chain, match, "!=", "lo", "drop"])

    def heal(self):
        self.run(["nft", "delete", "table", "inet", self.TABLE], check=False)

    def close(self):
        if self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait()
        run(["ip", "link", "del", self.host_if], check=False)  # gone already once all have left
