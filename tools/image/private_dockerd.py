#!/usr/bin/env python3
"""A Docker daemon of one's own: for the image smoke test (tests/deploy) and `./ferry image build`
on a machine without a running daemon.

    with PrivateDockerd(data_root) as d:           # started; stopped and cleaned on exit
        d.docker("run", "--rm", "ferry-router:latest", "--version")

    private_dockerd.py [--data-root DIR] -- COMMAND [ARGS...]
        runs COMMAND with DOCKER_HOST pointing at a private daemon, then stops it; exits with
        COMMAND's status

Debian's dockerd with its own socket, --exec-root, --pidfile, an empty --config-file (never the
machine's /etc/docker/daemon.json) and --data-root; no networking of its own
(--iptables=false --ip6tables=false --bridge=none: containers run with --network host or none).
Storage driver overlay2, or vfs where overlay2 cannot run (an overlay filesystem underneath);
which one is `driver`. Readiness is `docker info` answering, polled against a deadline. The client
is Debian's /usr/bin/docker (another `docker` may come first on the PATH) with a DOCKER_CONFIG of
its own (no context, no credential helper of the machine's).

data_root, when given, is kept between runs (the images, so that a warm run imports nothing) and
locked (flock on DATA_ROOT.lock) while a daemon uses it; when another daemon holds it, or with
none given, a temporary one is used and removed. Whatever a run left there is no input to the
next: start() removes every container it finds.

stop() (also on an exception, and at interpreter exit) removes the containers, stops the daemon
(SIGTERM, SIGKILL after a deadline), kills what it started that outlived it (containerd and its
shims, found by the run directory on their command lines), detaches every mount under its
directories and removes the run directory. The daemon dies with the process that started it
(PR_SET_PDEATHSIG).

Not thread-safe: one owner. Errors raise DockerdError with the daemon's log tail.
"""
import argparse
import atexit
import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DOCKERD = "/usr/sbin/dockerd"
DOCKER = os.environ.get("FERRY_DOCKER", "/usr/bin/docker")


class DockerdError(RuntimeError):
    pass


def _die_with_parent():
    os.setsid()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class PrivateDockerd:
    def __init__(self, data_root=None, drivers=("overlay2", "vfs"), start_timeout=60):
        self.requested_root = data_root
        self.drivers = drivers
        self.start_timeout = start_timeout
        self.driver = None
        self.proc = None
        self.run_dir = None
        self.data_root = None
        self.lock = None
        self.env = None
        self.log_path = None

    # --- lifecycle ----------------------------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        for tool in (DOCKERD, DOCKER):
            if not os.access(tool, os.X_OK):
                raise DockerdError(f"{tool} missing: install Debian's docker.io (./ferry setup)")
        # Unix socket paths are short (108 bytes): the run directory lives in /tmp.
        self.run_dir = tempfile.mkdtemp(prefix="ferry-dockerd-", dir="/tmp")
        atexit.register(self.stop)
        os.makedirs(os.path.join(self.run_dir, "config"))
        with open(os.path.join(self.run_dir, "daemon.json"), "w") as f:
            f.write("{}\n")
        self.log_path = os.path.join(self.run_dir, "dockerd.log")
        self.data_root = self._claim_data_root()
        self.env = dict(os.environ)
        for var in ("DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
            self.env.pop(var, None)
        self.env.update(DOCKER_HOST=f"unix://{self.run_dir}/docker.sock",
                        DOCKER_CONFIG=os.path.join(self.run_dir, "config"), DOCKER_BUILDKIT="0")
        errors = []
        for driver in self.drivers:
            try:
                self._start_daemon(driver)
                break
            except DockerdError as e:
                errors.append(f"{driver}: {e}")
                self._stop_daemon()
        else:
            raise DockerdError("dockerd did not start with any storage driver:\n" +
                               "\n".join(errors))
        leftovers = self.docker("ps", "-aq").split()
        if leftovers:
            self.docker("rm", "-f", *leftovers, timeout=120)

    def _claim_data_root(self):
        if self.requested_root:
            os.makedirs(self.requested_root, exist_ok=True)
            lock = open(self.requested_root.rstrip("/") + ".lock", "w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.lock = lock
                return self.requested_root
            except BlockingIOError:
                lock.close()
                print(f"private_dockerd: {self.requested_root} is in use by another daemon: "
                      "using a temporary data root", file=sys.stderr)
        return os.path.join(self.run_dir, "data")

    def _start_daemon(self, driver):
        sock = os.path.join(self.run_dir, "docker.sock")
        cmd = [DOCKERD, f"--host=unix://{sock}",
               f"--data-root={os.path.join(self.data_root, driver)}",
               f"--exec-root={os.path.join(self.run_dir, 'exec')}",
               f"--pidfile={os.path.join(self.run_dir, 'dockerd.pid')}",
               f"--config-file={os.path.join(self.run_dir, 'daemon.json')}",
               "--iptables=false", "--ip6tables=false", "--bridge=none",
               f"--storage-driver={driver}", "--log-level=warn"]
        with open(self.log_path, "a") as log:
            log.write(f"--- {' '.join(cmd)}\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         preexec_fn=_die_with_parent)
        deadline = time.monotonic() + self.start_timeout
        while True:
            p = subprocess.run([DOCKER, "info", "--format", "{{.Driver}}"], env=self.env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            if p.returncode == 0:
                if p.stdout.strip() != driver:
                    raise DockerdError(f"asked for {driver}, runs {p.stdout.strip()}")
                self.driver = driver
                return
            if self.proc.poll() is not None:
                raise DockerdError(f"dockerd exited {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise DockerdError(f"not answering after {self.start_timeout} s: "
                                   f"{self.log_tail()}")
            time.sleep(0.1)

    def stop(self):
        if self.run_dir is None:
            return
        try:
            if self.proc is not None and self.proc.poll() is None:
                try:
                    ids = self.docker("ps", "-aq", timeout=30).split()
                    if ids:
                        self.docker("rm", "-f", *ids, timeout=60)
                except (DockerdError, subprocess.TimeoutExpired) as e:
                    print(f"private_dockerd: removing containers: {e}", file=sys.stderr)
            self._stop_daemon()
        finally:
            self._unmount_all()
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None
            if self.lock is not None:
                self.lock.close()
                self.lock = None

    def _stop_daemon(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        # What the daemon started and left (containerd, shims): their command lines name the run
        # directory, which is this run's alone.
        for pid in self._own_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _own_processes(self):
        pids = []
        marker = self.run_dir.encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
        return pids

    def _unmount_all(self):
        roots = [self.run_dir] + ([self.data_root] if self.data_root else [])
        points = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4].replace("\\040", " ")
                if any(point == r or point.startswith(r.rstrip("/") + "/") for r in roots):
                    points.append(point)
        for point in sorted(set(points), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], stderr=subprocess.DEVNULL)

    # --- use ------------------------------------------------------------------------------------

    def docker(self, *args, timeout=300, check=True, input=None):
        """The output of `docker ARGS` against this daemon; DockerdError when it fails (check)."""
        p = subprocess.run([DOCKER, *args], env=self.env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=timeout, input=input)
        if check and p.returncode != 0:
            raise DockerdError(f"docker {' '.join(args)}: exit {p.returncode}: "
                               f"{p.stderr.strip()[-3000:]}")
        return p.stdout

    def log_tail(self, chars=4000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return "(no log)"

    def describe(self):
        return json.dumps({"socket": self.env["DOCKER_HOST"], "driver": self.driver,
                           "data_root": self.data_root})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", help="kept between runs (default: a temporary one)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a COMMAND to run is required (after --)")
    with PrivateDockerd(args.data_root) as d:
        print(f"private_dockerd: {d.describe()}", file=sys.stderr)
        return subprocess.run(command, env=d.env).returncode


if __name__ == "__main__":
    sys.exit(main())
