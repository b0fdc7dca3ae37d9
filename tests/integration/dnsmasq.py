"""DNS for the multi-process tests: Debian's dnsmasq in the foreground on 127.0.0.1, answering
for ferry.test from a hosts file the test rewrites (TTL 0, no cache), and a port free on several
loopback addresses at once (services that the DNS names share one port).

Used by dns_discovery_test.py (workers and store nodes by name) and router_epd_test.py (encoders
by name). The process is killed by stop() or, as every process the tests start, when the test
process dies (the caller's own cleanup)."""
import os
import random
import signal
import socket
import struct
import subprocess

from ferry_services import TMP, wait_for


def free_port(hosts, kinds=(socket.SOCK_STREAM,)):
    """A port free on every one of `hosts` now (for each socket kind)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, kinds[0]) as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        ok = True
        for host in hosts:
            for kind in kinds:
                with socket.socket(socket.AF_INET, kind) as s:
                    try:
                        s.bind((host, port))
                    except OSError:
                        ok = False
        if ok:
            return port
    raise RuntimeError("no free port")


class Dnsmasq:
    """dnsmasq in the foreground on 127.0.0.1:port, authoritative for ferry.test (an unlisted
    name is NXDOMAIN), answering from a hosts file with TTL 0 and no cache."""

    def __init__(self):
        self.hosts = os.path.join(TMP, "dns.hosts")
        self.proc = None  # (a SIGHUP before dnsmasq set its handler would end it)
        self.write(["127.0.0.99 ready.ferry.test"])
        self.port = free_port(["127.0.0.1"], (socket.SOCK_DGRAM, socket.SOCK_STREAM))
        with open(os.path.join(TMP, "dnsmasq.log"), "w") as log:
            self.proc = subprocess.Popen(
                ["/usr/sbin/dnsmasq", "--keep-in-foreground", "--no-daemon",
                 "--conf-file=/dev/null", "--pid-file=", "--listen-address=127.0.0.1",
                 "--bind-interfaces", f"--port={self.port}", "--no-resolv", "--no-hosts",
                 "--local=/ferry.test/", f"--addn-hosts={self.hosts}", "--local-ttl=0",
                 "--cache-size=0", "--no-negcache",
                 "--user=root" if os.getuid() == 0 else "--user="],
                stdout=log, stderr=log)
        wait_for(lambda: self.lookup("ready.ferry.test") == ["127.0.0.99"], "dnsmasq answering")

    def write(self, lines):
        tmp = self.hosts + ".next"
        with open(tmp, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        os.replace(tmp, self.hosts)
        if self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)

    def lookup(self, name):
        """The A records dnsmasq gives for `name` now (sorted), by a UDP query of our own; []
        while it does not answer."""
        q = struct.pack(">HHHHHH", random.randrange(65536), 0x0100, 1, 0, 0, 0)
        q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
        q += struct.pack(">HH", 1, 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(1)
            try:
                s.sendto(q, ("127.0.0.1", self.port))
                r = s.recv(4096)
            except OSError:
                return []
        found, i = [], len(q)
        for _ in range(struct.unpack(">H", r[6:8])[0]):
            i += 2 if r[i] & 0xC0 == 0xC0 else r.index(b"\0", i) + 1 - i
            typ, _, _, rdlen = struct.unpack(">HHIH", r[i:i + 10])
            i += 10
            if typ == 1:
                found.append(socket.inet_ntoa(r[i:i + rdlen]))
            i += rdlen
        return sorted(found)

    def serve(self, lines, name, want):
        """Serves `lines` and waits until dnsmasq answers `name` with `want`."""
        self.write(lines)
        wait_for(lambda: self.lookup(name) == sorted(want), f"dnsmasq serving {name}: {want}")

    def stop(self):
        self.proc.kill()
        self.proc.wait()
