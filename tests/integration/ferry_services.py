"""Starting and stopping Ferry's services from the Python integration tests.

start() runs a service binary with its stderr in a log file under TEST_TMPDIR and returns once it
printed its ports; every process started dies with the test (PR_SET_PDEATHSIG) and stop_all()
kills them, also when a check failed.
"""
import ctypes
import os
import signal
import subprocess
import tempfile
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
