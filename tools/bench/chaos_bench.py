"""ferry bench chaos: the P/D stack with the KV store under 16 streaming clients while processes
die and stall, every stream compared with a fault-free run of the same request.

The stack is deploy/local/stack's: its kvstore, prefill*, decode* and router lines, 1 prefill and
2 decode workers, each started from its line with its ${...} substituted by bash as `./ferry up`
does (eval "echo FLAGS"), so that a restart runs exactly the command the stack runs. What a test
run changes: the ports (the KV store's fixed 127.0.0.1:7400 becomes a free port in every line;
FERRY_WORKER_BASE_PORT, FERRY_PREFILL_BASE_PORT and FERRY_PORT free ones below the ephemeral range,
so a restarted worker finds its port free again), FERRY_STATE (a temporary directory holding the
store's directory and the router's workers file), FERRY_DRAIN_GRACE (2s: nothing is SIGTERMed
here, so it only shortens a stray drain), and each service gets --admin_port=0 (its free port,
printed) and --log_format=text where `up` gives a free port. FERRY_MODEL is FERRY_MODEL_GGUF
(SmolLM2 Q4_1, the real CPU engine, --weights=native as `up` gives), WORKER_THREADS what `up`
computes (cores / engines, at least 1).

Requests: a list drawn from a fixed seed (FERRY_CHAOS_REQUESTS, 48): chat and text completions,
prompts sharing a few long system prefixes (hits in the workers' memory and the store), greedy
(temperature 0) or seeded (temperature 0.6-1.0 with "seed"), max_tokens 8-96, some with n=2, all
streamed with `return_token_ids`, so every choice's token ids are compared.

Phases:
  1. fault-free: the list, run by the 16 clients (each takes the next request); the reference of
     each request's token ids, text, finish reasons and usage;
  2. chaos: the 16 clients loop over the same list while FERRY_CHAOS_CYCLES (30) fault cycles
     run: 1-4 s after the previous cycle ended (drawn from FERRY_CHAOS_SEED), a target among
     decode0, decode1, prefill0 and kvstore and an action: SIGKILL, then at once (not waiting for
     the router to notice) a restart from its stack line and a wait for its /readyz; or SIGSTOP,
     1-3 s, SIGCONT. After the last cycle the clients take no more requests, the streams in
     flight end and the router must see every worker up again. A client that saw its stream
     fail waits FAIL_PAUSE (1 s) before its next request, as a client backs off (a router
     refusing at once would otherwise be sent thousands of requests a second, each a failed
     stream).

Every chaos stream is compared with its request's fault-free result. A failed stream: an HTTP
status other than 200 (its status and error body kept), an error event in the stream, a client
error (connection refused or reset), no data for STREAM_TIMEOUT s, or an end without [DONE] or
without every token; a mismatched stream: complete, but other token ids, text, finish reasons or
usage than fault-free. Streams of n > 1 cannot migrate mid-stream by design (the router fails
them with cause several_choices once a choice has a token); they are counted apart: those that
failed after their first token are the by-design ones, those that failed before it are not
(a request with no token yet can be retried whole). Failures are listed by reason (the HTTP
status and error code and message, masked of addresses and ids) and in time: bursts of failures
with the fault cycles begun shortly before each.

The router's /metrics at the start and end of the chaos phase: migrations
(ferry_router_migrations_total, every cause), retries (ferry_router_retries_total), queued (the
count of ferry_router_queue_wait_seconds, a histogram) and max_queue_wait_ms (the bound of its
highest bucket that gained an observation); a metric this router does not export is reported as
null and said in the table. The router's failed requests by cause and ferry_router_queue_depth's
largest value (sampled every second) are reported too.

Environment: FERRY_CHAOS_CYCLES (30; or --cycles), FERRY_CHAOS_SEED (20260414; or --seed),
FERRY_CHAOS_REQUESTS (48), FERRY_CHAOS_CLIENTS (16).

Final line: JSON with bench ("chaos"), cycles, streams, failed_streams, mismatched_streams,
migrations, retries, queued, max_queue_wait_ms, goals_met (no failed stream but the by-design
ones of n > 1 mid-stream, and no mismatched one), and cycles_by_fault, failure_reasons,
several_choice_streams, several_choice_failed, several_choice_failed_mid_stream,
several_choice_mismatched, router_failed_requests, max_queue_depth, fault_free_failed,
workers_up_at_end (the router sees every worker up after the last cycle), chaos_seconds.
"""
import argparse
import collections
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

OPTIONS = argparse.ArgumentParser(description=__doc__.split("\n")[0])
OPTIONS.add_argument("services", help="tests/integration/ferry_services.py")
OPTIONS.add_argument("stack", help="deploy/local/stack")
OPTIONS.add_argument("binaries", nargs=4, help="ferry-router, ferry-prefill, ferry-decode, "
                     "ferry-kvstore (matched to the stack's targets by name)")
OPTIONS.add_argument("--cycles", type=int, default=int(os.environ.get("FERRY_CHAOS_CYCLES", "30")))
OPTIONS.add_argument("--seed", type=int, default=int(os.environ.get("FERRY_CHAOS_SEED",
                                                                    "20260414")))
OPTIONS.add_argument("--requests", type=int,
                     default=int(os.environ.get("FERRY_CHAOS_REQUESTS", "48")))
OPTIONS.add_argument("--clients", type=int,
                     default=int(os.environ.get("FERRY_CHAOS_CLIENTS", "16")))
ARGS = OPTIONS.parse_args()

sys.path.insert(0, os.path.dirname(os.path.abspath(ARGS.services)))
import ferry_services as fs  # noqa: E402

MODEL = os.environ.get("FERRY_MODEL_GGUF")
PREFILL, DECODE = 1, 2
TARGETS = ["decode0", "decode1", "prefill0", "kvstore"]
STREAM_TIMEOUT = 60  # seconds without data before a stream counts as hung
# A client waits this long after a failed stream before its next request, as a real one backs off:
# a router that refuses at once would otherwise see (and the count show) thousands of requests a
# second from 16 clients.
FAIL_PAUSE = 1.0
READY_TIMEOUT = 120  # seconds a (re)started service may take to answer /readyz
BURST_GAP = 2.0  # seconds between two failures of one burst at most (a client pauses 1 s)
BURST_LOOKBACK = 7.0  # seconds before a burst in which a fault cycle may have caused it
DRAIN_GRACE = "2s"

# ----------------------------------------------------------------------------------------------
# The stack


def free_base(count):
    """A port P with P..P+count-1 free on loopback, below the ephemeral range (32768 and up here),
    so that a restarted service finds its port free again (fault_util.py's reasoning)."""
    pick = random.SystemRandom()  # not the bench's seeded draws
    for _ in range(500):
        base = pick.randrange(20000, 32000 - count)
        ok = True
        for port in range(base, base + count):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no {count} free consecutive ports in 20000-32000")


class Stack:
    """deploy/local/stack's services for this run: {name: [binary, flags...]}, each line's ${...}
    substituted by bash exactly as `./ferry up` does, with the ports and state of this run."""

    def __init__(self, path, binaries, state):
        self.state = state
        by_name = {os.path.basename(b): os.path.abspath(b) for b in binaries}
        store_port = free_base(1)
        self.env = dict(os.environ)
        engines = PREFILL + DECODE
        self.env.update({
            "FERRY_MODEL": MODEL,
            "FERRY_MODEL_ID": os.path.basename(MODEL).replace(".Q4_1.gguf", ""),
            "FERRY_PORT": str(free_base(1)),
            "FERRY_STATE": state,
            "FERRY_WORKER_BASE_PORT": str(free_base(DECODE)),
            "FERRY_PREFILL_BASE_PORT": str(free_base(PREFILL)),
            "FERRY_DRAIN_GRACE": DRAIN_GRACE,
            "FERRY_ENGINE_FLAGS": "--weights=native",
            "WORKER_THREADS": str(max(1, (os.cpu_count() or 1) // engines)),
        })
        self.model_id = self.env["FERRY_MODEL_ID"]
        decode_base = int(self.env["FERRY_WORKER_BASE_PORT"])
        prefill_base = int(self.env["FERRY_PREFILL_BASE_PORT"])
        # ./ferry up's worker_addresses: the workers file, decode workers before prefill ones.
        self.addresses = ([f"127.0.0.1:{decode_base + i}" for i in range(DECODE)] +
                          [f"127.0.0.1:{prefill_base + i}" for i in range(PREFILL)])
        self.env["WORKER_ADDRESSES"] = ",".join(self.addresses)
        self.commands = {}
        self.order = []
        with open(path) as f:
            for line in f:
                line = line.split("#", 1)[0]
                if not line.strip():
                    continue
                name, target, flags = (line.split(None, 2) + [""])[:3]
                count = {"prefill*": PREFILL, "decode*": DECODE}.get(name)
                if name.endswith("*") and not count:
                    continue  # worker*: the aggregated stack's
                # The KV store's fixed address, wherever a line names it.
                flags = flags.replace("127.0.0.1:7400", f"127.0.0.1:{store_port}")
                binary = by_name.get(target.rpartition(":")[2])
                if binary is None:
                    raise RuntimeError(f"{path}: no binary given for {target}")
                for index in range(count or 1):
                    service = f"{name[:-1]}{index}" if count else name
                    words = self.substitute(flags, index if count else "-")
                    self.commands[service] = [binary, "--admin_port=0", "--log_format=text"] + words
                    self.order.append(service)
        missing = set(TARGETS + ["router"]) - set(self.commands)
        if missing:
            raise RuntimeError(f"{path} has no line for {sorted(missing)}")
        os.makedirs(state, exist_ok=True)
        with open(os.path.join(state, "workers"), "w") as f:
            f.write("".join(a + "\n" for a in self.addresses))

    def substitute(self, flags, index):
        """The words of `flags` as `./ferry up` runs them: $(eval "echo ${flags}"), unquoted."""
        env = dict(self.env, INDEX=str(index))
        out = subprocess.run(["bash", "-c", 'eval "echo $1"', "bash", flags], env=env,
                             stdout=subprocess.PIPE, check=True, text=True).stdout
        return out.split()


class Service:
    """One of the stack's processes: started (and restarted) from its stack command."""

    def __init__(self, name, command):
        self.name, self.command = name, command
        self.proc, self.admin, self.starts = None, None, 0

    def start(self):
        self.starts += 1
        self.proc, ports = fs.start(self.command[0], self.command[1:],
                                    f"{self.name}_{self.starts}")
        self.admin = ports["admin_port"]
        return self

    def wait_ready(self, timeout=READY_TIMEOUT):
        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}; see its log "
                                   f"{self.log_path()}")
            try:
                return fs.get(f"http://127.0.0.1:{self.admin}/readyz", timeout=2)[0] == 200
            except OSError:
                return False
        fs.wait_for(ready, f"{self.name}'s /readyz", timeout)

    def log_path(self):
        return os.path.join(fs.TMP, f"{self.name}_{self.starts}.log")

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def kill(self):
        self.signal(signal.SIGKILL)
        self.proc.wait()


# ----------------------------------------------------------------------------------------------
# Requests

WORDS = ("the a of and to in is it that for on with as was by at from this be or are an which "
         "river mountain city garden library window engine signal market winter summer letter "
         "music paper story number question answer morning evening people country history "
         "science language machine memory system network station harbor forest island bridge "
         "travel reason picture voice kitchen village teacher student doctor farmer captain "
         "simple careful bright quiet ancient modern gentle sudden narrow distant golden silver "
         "write read carry follow explain remember discover build measure travel describe "
         "compare imagine listen return").split()
QUESTIONS = [
    "Write a short story about {}.", "Explain how {} works.", "List facts about {}.",
    "Describe {} to a child.", "Compare {} and the sea.", "What is the history of {}?",
]


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def request_list(seed, count):
    """The fixed list of requests: dicts with api, prompt (or messages), max_tokens, temperature,
    seed (when sampled), n, ignore_eos."""
    rng = random.Random(seed)
    systems = [f"You are assistant {i}. " + words(rng, rng.randrange(80, 300)) for i in range(4)]
    out = []
    for i in range(count):
        system = rng.choice(systems)
        question = rng.choice(QUESTIONS).format(words(rng, rng.randrange(2, 12)))
        greedy = rng.random() < 0.5
        r = {
            "index": i,
            "api": rng.choice(["chat", "completions"]),
            "system": system,
            "question": question,
            "max_tokens": rng.randrange(8, 97),
            "temperature": 0.0 if greedy else round(rng.uniform(0.6, 1.0), 2),
            "seed": None if greedy else rng.randrange(1, 2**31),
            "n": 2 if rng.random() < 0.15 else 1,
            "ignore_eos": rng.random() < 0.75,
        }
        out.append(r)
    return out


def body_of(req, model_id):
    body = {"model": model_id, "max_tokens": req["max_tokens"], "temperature": req["temperature"],
            "n": req["n"], "ignore_eos": req["ignore_eos"], "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    if req["seed"] is not None:
        body["seed"] = req["seed"]
    if req["api"] == "chat":
        body["messages"] = [{"role": "system", "content": req["system"]},
                            {"role": "user", "content": req["question"]}]
    else:
        body["prompt"] = req["system"] + "\n\nQuestion: " + req["question"] + "\nAnswer:"
    return body


def describe(req):
    sampling = "greedy" if req["seed"] is None else f"t={req['temperature']} seed={req['seed']}"
    return f"#{req['index']} {req['api']} {sampling} max_tokens={req['max_tokens']} n={req['n']}"


class Outcome:
    """One stream's result: every choice's token ids, text and finish reason, and how it ended."""

    def __init__(self, req):
        self.req = req
        self.status = None
        self.ids = collections.defaultdict(list)
        self.text = collections.defaultdict(str)
        self.finish = {}
        self.usage = None
        self.done = False
        self.error = None      # the failure, in words (None: the stream ended well)
        self.reason = None     # the failure's kind, for the breakdown
        self.start = self.end = None
        self.tokens_at_error = 0
        self.failed_at = None
        self.mismatch = None   # why a complete stream differs from its fault-free run
        self.key = None        # the failure's line in the breakdown

    def tokens(self):
        return sum(len(v) for v in self.ids.values())

    def fail(self, reason, error):
        if self.error is None:
            self.reason, self.error = reason, error
            self.tokens_at_error = self.tokens()
            self.failed_at = time.monotonic()


def normalized(text):
    """A message with its addresses, ids and numbers masked, for grouping failures."""
    text = re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "ADDR", str(text))
    text = re.sub(r"[0-9a-f]{8,}", "X", text)
    return re.sub(r"\d+", "N", text)[:160]


def error_kind(error):
    """An error object's (or body's) short kind: its code or type, and its message."""
    if isinstance(error, dict):
        e = error.get("error", error)
        if isinstance(e, dict):
            kind = e.get("code") or e.get("type") or "?"
            return f"{kind}: {normalized(e.get('message', ''))}"
    return normalized(error)


def stream(port, req, model_id):
    """Runs one streaming request to its end; its Outcome."""
    out = Outcome(req)
    out.start = time.monotonic()
    path = "/v1/chat/completions" if req["api"] == "chat" else "/v1/completions"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=STREAM_TIMEOUT)
    try:
        conn.request("POST", path, json.dumps(body_of(req, model_id)),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        out.status = response.status
        if response.status != 200:
            body = response.read()[:2000].decode(errors="replace")
            try:
                kind = error_kind(json.loads(body))
            except ValueError:
                kind = normalized(body)
            out.fail(f"HTTP {response.status} {kind}", f"HTTP {response.status}: {body}")
            return out
        for event in fs.sse_events(response):
            if event == "[DONE]":
                out.done = True
                break
            if "error" in event:
                out.fail(f"error event {error_kind(event)}", json.dumps(event)[:2000])
                continue
            if event.get("usage"):
                out.usage = event["usage"]
            for choice in event.get("choices") or []:
                i = choice.get("index", 0)
                out.ids[i].extend(choice.get("token_ids") or [])
                out.text[i] += (choice.get("delta") or {}).get("content") or choice.get(
                    "text") or ""
                if choice.get("finish_reason"):
                    out.finish[i] = choice["finish_reason"]
    except (TimeoutError, socket.timeout):
        out.fail("hung", f"no data for {STREAM_TIMEOUT} s")
    except (OSError, http.client.HTTPException) as e:
        out.fail(f"client {type(e).__name__}", f"client: {e!r}")
    except ValueError as e:
        out.fail("bad event", f"client: {e!r}")
    finally:
        conn.close()
        out.end = time.monotonic()
    if out.error is None:
        missing = [i for i in range(req["n"]) if i not in out.finish]
        if not out.done:
            out.fail("no [DONE]", "the stream ended without [DONE]")
        elif missing:
            out.fail("no finish_reason", f"choices {missing} have no finish_reason")
        elif out.usage is None:
            out.fail("no usage", "no usage chunk")
        elif out.usage.get("completion_tokens") != out.tokens():
            out.fail("usage differs", f"usage counts {out.usage.get('completion_tokens')} "
                     f"tokens, the client got {out.tokens()}")
    return out


def differs(got, want):
    """Why a complete stream differs from its fault-free run, or None."""
    for i in range(got.req["n"]):
        if got.ids.get(i, []) != want.ids.get(i, []):
            a, b = got.ids.get(i, []), want.ids.get(i, [])
            at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            return f"choice {i}: token ids differ at {at} ({len(a)} vs {len(b)} tokens)"
        if got.text.get(i, "") != want.text.get(i, ""):
            return f"choice {i}: text differs"
        if got.finish.get(i) != want.finish.get(i):
            return f"choice {i}: finish {got.finish.get(i)} vs {want.finish.get(i)}"
    for key in ("prompt_tokens", "completion_tokens"):
        if got.usage.get(key) != want.usage.get(key):
            return f"usage {key} {got.usage.get(key)} vs {want.usage.get(key)}"
    return None


def run_clients(port, model_id, requests, clients, keep_going):
    """`clients` threads each taking the next request (the list looped while keep_going(), else
    once); returns (threads, outcomes): outcomes fill in as streams end."""
    lock = threading.Lock()
    state = {"next": 0}
    outcomes = []

    def work():
        while True:
            with lock:
                k = state["next"]
                if (k >= len(requests)) if keep_going is None else not keep_going():
                    return
                state["next"] += 1
            req = requests[k % len(requests)]
            try:
                out = stream(port, req, model_id)
            except Exception as e:  # noqa: BLE001 - any client error is a failed stream
                out = Outcome(req)
                out.fail(f"client {type(e).__name__}", f"client: {e!r}")
                out.start = out.end = time.monotonic()
            with lock:
                outcomes.append(out)
            if out.error:
                time.sleep(FAIL_PAUSE)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    return threads, outcomes


# ----------------------------------------------------------------------------------------------
# Metrics


def scrape(admin):
    try:
        status, body = fs.get(f"http://127.0.0.1:{admin}/metrics", timeout=5)
    except OSError:
        return {}
    samples = {}
    if status != 200:
        return samples
    for text in body.splitlines():
        if text and not text.startswith("#"):
            name, _, value = text.rpartition(" ")
            try:
                samples[name] = float(value)
            except ValueError:
                pass
    return samples


def total(samples, name, **labels):
    """The sum of `name`'s samples with `labels`; None when the page has no such metric."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    found = [v for k, v in samples.items()
             if (k == name or k.startswith(name + "{")) and all(w in k for w in want)]
    return sum(found) if found else None


def delta(after, before, name, **labels):
    a, b = total(after, name, **labels), total(before, name, **labels)
    if a is None:
        return None
    return int(round(a - (b or 0)))


def queue_wait(after, before):
    """(queued, max wait in ms) from ferry_router_queue_wait_seconds's deltas; (None, None) when
    the router has no such histogram. The max is the bound of the highest bucket that gained an
    observation (inf: above the last finite bound)."""
    name = "ferry_router_queue_wait_seconds"
    count = delta(after, before, name + "_count")
    if count is None:
        return None, None
    if count == 0:
        return 0, 0.0
    buckets = []
    for k, v in after.items():
        m = re.match(re.escape(name) + r'_bucket\{(?:.*,)?le="([^"]+)"', k)
        if m:
            buckets.append((float(m.group(1)), v - before.get(k, 0.0)))
    buckets.sort()
    for bound, cumulative in buckets:  # the first bound holding every new observation
        if cumulative >= count:
            return count, bound * 1e3
    return count, None


def queue_counters(after, before):
    """Every ferry_router_queue..._total counter's delta (expiries and the like), by sample."""
    return {k: int(v - before.get(k, 0.0)) for k, v in sorted(after.items())
            if k.startswith("ferry_router_queue") and "_total" in k and v != before.get(k, 0.0)}


class DepthSampler:
    """The router's ferry_router_queue_depth, sampled every second: its largest value."""

    def __init__(self, admin):
        self.admin, self.largest, self.seen = admin, 0.0, False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.wait(1.0):
            depth = total(scrape(self.admin), "ferry_router_queue_depth")
            if depth is not None:
                self.seen = True
                self.largest = max(self.largest, depth)

    def finish(self):
        self.stop.set()
        self.thread.join()
        return self.largest if self.seen else None


# ----------------------------------------------------------------------------------------------
# Faults


def schedule(seed, cycles):
    """The fault cycles, drawn up front: (delay s, target, action, stop s) each."""
    rng = random.Random(seed + 1)
    out = []
    for _ in range(cycles):
        delay = rng.uniform(1.0, 4.0)
        target = rng.choice(TARGETS)
        action = rng.choice(["kill", "stop"])
        stop_s = rng.uniform(1.0, 3.0)
        out.append((delay, target, action, stop_s))
    return out


def run_cycles(services, plan, origin):
    """Runs the fault cycles; returns their records."""
    records = []
    for c, (delay, target, action, stop_s) in enumerate(plan):
        time.sleep(delay)
        victim = services[target]
        start = time.monotonic()
        record = {"cycle": c, "target": target, "action": action, "start": start}
        if action == "kill":
            victim.kill()
            victim.start()  # at once, from its stack line: the router has not noticed yet
            victim.wait_ready()
            record["ready_s"] = time.monotonic() - start
            record["what"] = f"SIGKILL, restarted, ready after {record['ready_s']:.1f} s"
        else:
            victim.signal(signal.SIGSTOP)
            time.sleep(stop_s)
            victim.signal(signal.SIGCONT)
            record["what"] = f"SIGSTOP for {stop_s:.1f} s"
        record["end"] = time.monotonic()
        records.append(record)
        print(f"cycle {c}: +{start - origin:6.1f} s  {target:9s} {record['what']}",
              file=sys.stderr)
    return records


def overlapping(out, records):
    """The fault cycles that overlapped a stream (or ended less than a second before it began),
    as 'kill decode0' words."""
    return [f"{r['action']} {r['target']}" for r in records
            if out.start is not None and r["start"] <= out.end and out.start <= r["end"] + 1.0]


def bursts(failed, records, origin):
    """The failures grouped in time (a gap over BURST_GAP s apart), each with the cycles that
    began in the BURST_LOOKBACK s before it or during it: [(first, last, [Outcome], [record])],
    times in seconds from `origin`."""
    out = []
    for o in sorted(failed, key=lambda o: o.failed_at):
        t = o.failed_at - origin
        if out and t - out[-1][1] <= BURST_GAP:
            out[-1][1] = t
            out[-1][2].append(o)
        else:
            out.append([t, t, [o]])
    return [(first, last, members,
             [r for r in records if first - BURST_LOOKBACK <= r["start"] - origin <= last])
            for first, last, members in out]


# ----------------------------------------------------------------------------------------------


def main():
    if not MODEL:
        sys.exit("run through ./ferry bench chaos (FERRY_MODEL_GGUF is not set)")
    state = os.path.join(fs.TMP, "state")
    stack = Stack(ARGS.stack, ARGS.binaries, state)
    requests = request_list(ARGS.seed, ARGS.requests)
    plan = schedule(ARGS.seed, ARGS.cycles)
    services = {}
    try:
        for name in stack.order:
            services[name] = Service(name, stack.commands[name]).start()
            services[name].wait_ready()
            print(f"{name}: {' '.join(stack.commands[name][1:])}", file=sys.stderr)
        router = services["router"]
        port = int(stack.env["FERRY_PORT"])
        fs.wait_workers_up(router.admin, PREFILL + DECODE, "router")

        # 1. Fault-free: the reference of every request.
        began = time.monotonic()
        threads, outcomes = run_clients(port, stack.model_id, requests, ARGS.clients, None)
        for t in threads:
            t.join()
        reference = {o.req["index"]: o for o in outcomes}
        fault_free_failed = [o for o in outcomes if o.error]
        for o in fault_free_failed:
            print(f"fault-free {describe(o.req)} failed: {o.error}", file=sys.stderr)
        fault_free_s = time.monotonic() - began
        print(f"fault-free: {len(requests)} requests in {fault_free_s:.1f} s, "
              f"{len(fault_free_failed)} failed", file=sys.stderr)

        # 2. Chaos: the list looped while the fault cycles run.
        before = scrape(router.admin)
        sampler = DepthSampler(router.admin)
        going = threading.Event()
        going.set()
        origin = time.monotonic()
        threads, outcomes = run_clients(port, stack.model_id, requests, ARGS.clients,
                                        going.is_set)
        records = run_cycles(services, plan, origin)
        going.clear()
        for t in threads:
            t.join()
        chaos_s = time.monotonic() - origin
        try:
            fs.wait_workers_up(router.admin, PREFILL + DECODE, "router")
            healthy = True
        except RuntimeError as e:
            print(f"after the last cycle: {e}", file=sys.stderr)
            healthy = False
        max_depth = sampler.finish()
        after = scrape(router.admin)
    finally:
        fs.stop_all()
        shutil.rmtree(os.path.join(state, "kvstore"), ignore_errors=True)

    # Each chaos stream against its fault-free result.
    failed, mismatched, several = [], [], []
    for o in outcomes:
        want = reference.get(o.req["index"])
        if o.req["n"] > 1:
            several.append(o)
        if o.error:
            failed.append(o)
        elif want is None or want.error:
            o.mismatch = "no fault-free result to compare with"
            mismatched.append(o)
        else:
            o.mismatch = differs(o, want)
            if o.mismatch:
                mismatched.append(o)
    several_failed = [o for o in failed if o.req["n"] > 1]
    several_mid = [o for o in several_failed if o.tokens_at_error > 0]
    several_mismatched = [o for o in mismatched if o.req["n"] > 1]
    reasons = collections.Counter()
    unfaulted_mismatches = 0
    examples = {}
    for o in failed:
        when = "mid-stream" if o.tokens_at_error else "before a token"
        key = f"{o.reason} ({when})"
        reasons[key] += 1
        examples.setdefault(key, o)
        o.key = key
        print(f"failed: {describe(o.req)} after {o.tokens_at_error} tokens, "
              f"{o.end - o.start:.1f} s, during [{', '.join(overlapping(o, records))}]: "
              f"{o.error[:400]}", file=sys.stderr)
    for o in mismatched:
        if not overlapping(o, records):
            unfaulted_mismatches += 1
        print(f"mismatched: {describe(o.req)}, during [{', '.join(overlapping(o, records))}]: "
              f"{o.mismatch}", file=sys.stderr)

    migrations = delta(after, before, "ferry_router_migrations_total")
    retries = delta(after, before, "ferry_router_retries_total")
    queued, max_wait = queue_wait(after, before)
    router_failed = {}
    for k, v in after.items():
        if k.startswith("ferry_router_failed_requests_total") and v - before.get(k, 0.0):
            cause = re.search(r'cause="([^"]*)"', k)
            router_failed[cause.group(1) if cause else k] = int(v - before.get(k, 0.0))
    cycles_by_fault = dict(collections.Counter(f"{r['action']} {r['target']}" for r in records))
    by_design = len(several_mid)
    goals = (len(failed) - by_design == 0 and not mismatched and not fault_free_failed and
             len(records) == ARGS.cycles and healthy)

    def shown(v, unit=""):
        return "not exported by this router" if v is None else f"{v:g}{unit}"

    print(f"chaos: SmolLM2 P/D from deploy/local/stack (1 prefill, 2 decode, KV store, router), "
          f"{ARGS.clients} streaming clients over {len(requests)} requests (seed {ARGS.seed}), "
          f"{len(records)} fault cycles in {chaos_s:.0f} s (fault-free pass {fault_free_s:.0f} s)")
    print("  faults: " + ", ".join(f"{k} {v}" for k, v in sorted(cycles_by_fault.items())))
    ready = sorted(r["ready_s"] for r in records if "ready_s" in r)
    if ready:
        print(f"  SIGKILL to the restarted process's /readyz: p50 {ready[len(ready) // 2]:.1f} s, "
              f"max {ready[-1]:.1f} s")
    print(f"  streams                 {len(outcomes):6d}   (fault-free reference: "
          f"{len(requests) - len(fault_free_failed)} of {len(requests)} complete)")
    print(f"  failed streams          {len(failed):6d}   (n > 1: {len(several_failed)}, of which "
          f"{by_design} mid-stream: cannot migrate by design)")
    print(f"  mismatched streams      {len(mismatched):6d}   (n > 1: {len(several_mismatched)}; "
          f"overlapping no fault: {unfaulted_mismatches}, the engine's own nondeterminism)")
    print(f"  streams of n > 1        {len(several):6d}")
    print(f"  migrations              {shown(migrations):>6}")
    print(f"  retries                 {shown(retries):>6}")
    print(f"  queued                  {shown(queued):>6}   (ferry_router_queue_wait_seconds)")
    print(f"  max queue wait          {shown(max_wait, ' ms'):>6}")
    print(f"  max queue depth seen    {shown(max_depth):>6}   (ferry_router_queue_depth, sampled "
          f"each second)")
    counters = queue_counters(after, before)
    if counters:
        print("  queue counters: " + ", ".join(f"{k} {v}" for k, v in counters.items()))
    print("  router failed requests: " + (", ".join(f"{k} {v}" for k, v in
                                                   sorted(router_failed.items())) or "none"))
    if reasons:
        print("  failures by reason (count; an example):")
        number = {}
        for key, count in reasons.most_common():
            number[key] = len(number) + 1
            print(f"    [{number[key]}] {count:4d}  {key}\n          e.g. "
                  f"{describe(examples[key].req)}: {examples[key].error[:300]}")
        print("  failures in time (seconds into the chaos phase: [reason] count; the fault cycles "
              f"begun in the {BURST_LOOKBACK:g} s before and during):")
        for first, last, members, faults in bursts(failed, records, origin):
            counts = collections.Counter(number[o.key] for o in members)
            print(f"    +{first:5.1f} .. +{last:5.1f} s: " +
                  ", ".join(f"[{n}] {c}" for n, c in sorted(counts.items())) + "; after " +
                  (", ".join(f"cycle {r['cycle']} {r['action']} {r['target']} at "
                             f"+{r['start'] - origin:.1f} s" for r in faults) or "no fault"))
    if by_design:
        print(f"  note: {by_design} stream(s) of n > 1 failed after their first token: the "
              f"router does not migrate a request of several choices mid-stream (cause "
              f"several_choices), by design; they do not count against the goal")
    if not healthy:
        print("  the router did not see every worker up again within 30 s of the last cycle")
    print(f"  goals met: {goals} (no failed stream but those, no mismatched stream, every worker "
          f"up at the end)")
    print(json.dumps({
        "bench": "chaos", "cycles": len(records), "streams": len(outcomes),
        "failed_streams": len(failed), "mismatched_streams": len(mismatched),
        "migrations": migrations, "retries": retries, "queued": queued,
        "max_queue_wait_ms": None if max_wait is None else round(max_wait, 1),
        "goals_met": goals, "cycles_by_fault": cycles_by_fault,
        "failure_reasons": dict(reasons.most_common()),
        "several_choice_streams": len(several), "several_choice_failed": len(several_failed),
        "several_choice_failed_mid_stream": by_design,
        "several_choice_mismatched": len(several_mismatched),
        "router_failed_requests": router_failed, "max_queue_depth": max_depth,
        "fault_free_failed": len(fault_free_failed), "workers_up_at_end": healthy,
        "chaos_seconds": round(chaos_s, 1)}))


if __name__ == "__main__":
    main()
