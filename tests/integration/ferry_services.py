"""Starting and stopping Ferry's services from the Python integration tests.

start() runs a service binary with its stderr in a log file under TEST_TMPDIR and returns once it
printed its ports; every process started dies with the test (PR_SET_PDEATHSIG) and stop_all()
kills them, also when a check failed. And what several tests share: a metric's value, waiting for
a router to see its workers, a test model with another chat template, a scripted null worker
behind a router.
"""
import ctypes
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

TMP = os.environ.get("TEST_TMPDIR", tempfile.gettempdir())
PROCESSES = []


def _die_with_parent():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start(binary, args, name):
    """Starts a Ferry service; returns (process, {port name: port}) once it printed its ports."""
    log_path = os.path.join(TMP, name + ".log")
    with open(log_path, "w") as log:
        p = subprocess.Popen([binary] + args, stdout=subprocess.PIPE, stderr=log,
                             preexec_fn=_die_with_parent, text=True)
    PROCESSES.append(p)
    ports = dict(kv.split("=") for kv in p.stdout.readline().split())
    if not ports:
        with open(log_path) as log:
            raise RuntimeError(f"{name} did not start: {log.read()[-3000:]}")
    return p, {k: int(v) for k, v in ports.items()}


def stop_all():
    for p in PROCESSES:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()


def get(url, timeout=10):
    """(status, body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(admin_port, line):
    """The value of the sample `line` (a name with its labels) on a service's /metrics page; 0
    when the page has no such sample."""
    _, body = get(f"http://127.0.0.1:{admin_port}/metrics")
    for text in body.splitlines():
        if text.startswith(line + " "):
            return float(text.split()[-1])
    return 0.0


def wait_index_synced(router_admin, worker_admin, worker_address):
    """Waits until the router's KV index holds what the worker caches now (a request that just
    ended there: the router may predict its prefix cached). The worker's gauges are read after
    two refreshes (so they include the ended request), then the index must reach that count."""
    refreshes = metric(worker_admin, "ferry_worker_load_refreshes_total")
    wait_for(lambda: metric(worker_admin, "ferry_worker_load_refreshes_total") >= refreshes + 2,
             f"worker {worker_address}'s gauges refreshed")
    cached = metric(worker_admin, 'ferry_worker_kv_blocks{state="cached"}')

    def index_blocks():
        _, body = get(f"http://127.0.0.1:{router_admin}/workers")
        for w in json.loads(body):
            if w["address"] == worker_address:
                return w["kv_index"]["blocks"]
        return -1
    wait_for(lambda: index_blocks() == cached,
             f"the router's KV index at worker {worker_address}'s {cached} cached blocks")
    return cached


def sse_events(response):
    """The data events of an OpenAI-style server-sent event stream (an http.client response), each
    as its JSON; the string "[DONE]" for the end marker, after which it stops. A data line that is
    not JSON raises ValueError."""
    while True:
        line = response.readline()
        if not line:
            return
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            yield "[DONE]"
            return
        yield json.loads(data)


def wait_for(ready, what, timeout=30):
    """Waits until `ready()` (a state or counter a service reports) holds, looking every 50 ms,
    and returns what it returned; raises after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)


def wait_workers_up(admin_port, count, name):
    """Waits (30 s at most) until the router with `admin_port` sees `count` workers up."""
    def up():
        status, body = get(f"http://127.0.0.1:{admin_port}/workers")
        return status == 200 and sum(w["state"] == "up" for w in json.loads(body)) >= count
    wait_for(up, f"the workers coming up in {name}")


def wait_metric(admin_port, line, at_least, timeout=30):
    """Waits until the sample `line` of a service's /metrics is at least `at_least`."""
    wait_for(lambda: metric(admin_port, line) >= at_least, f"{line} >= {at_least}", timeout)


def model_with_template(src, name, template_source, special_markers=()):
    """A copy of the HF model directory `src` (tokenizer and config, no weights) under TMP with
    `template_source` as its chat template, an 8192-position context (tool prompts are long), and
    `special_markers` added as special tokens (as Mistral's tokenizer has [TOOL_CALLS])."""
    d = os.path.join(TMP, "model_" + name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tokenizer = json.load(f)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    for marker in special_markers:
        config["vocab_size"] += 1
        tokenizer["added_tokens"].append({
            "id": config["vocab_size"] - 1, "content": marker, "single_word": False,
            "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    config["max_position_embeddings"] = 8192
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(src, "tokenizer_config.json")) as f:
        tc = json.load(f)
    tc["chat_template"] = template_source
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    return d


def scripted_stack(worker, router, model_dir, name, script, router_flags=()):
    """A null-engine worker answering from `script` (--null_script: a list of {"reply"} and
    {"when", "reply"} entries) and a router in front of it, on `model_dir`; the router's ports
    once it sees the worker up."""
    path = os.path.join(TMP, f"script_{name}.json")
    with open(path, "w") as f:
        json.dump(script, f)
    _, w = start(worker, [f"--model={model_dir}", "--engine=null", f"--null_script={path}",
                          "--null_token_seconds=0", "--block_tokens=16", "--kv_pool_bytes=8MiB"],
                 f"worker_{name}")
    _, r = start(router, [f"--model={model_dir}", "--served_model_name=tiny",
                          f"--workers=127.0.0.1:{w['grpc_port']}"] + list(router_flags),
                 f"router_{name}")
    wait_workers_up(r["admin_port"], 1, f"router_{name}")
    return r
